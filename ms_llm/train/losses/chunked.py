"""The chunked token objective (`train.loss_chunk_tokens` > 0), a part of the composed loss (composed.py): the LM
head and the cross-entropy over that many tokens at a time, with the loss mask of chat data (masked.py) or without.

Chunked (`ChunkedCrossEntropy`, the fused linear cross-entropy of Liger-Kernel and torchtune): for each chunk of
tokens the head's matmul, the softmax, the loss and the gradient of the loss with respect to the chunk's logits
are computed in the forward pass, and that gradient is immediately turned into the chunk's share of the
gradients of the hidden states (dlogits @ W) and of the head weight (dlogitsᵀ @ x). Only one chunk's logits and
their gradient exist at any time, forward and backward, and the head's FLOPs are those of the whole path (no
recompute). The backward of the Cell (`bprop`) just scales the stored gradients by the incoming gradient.

The gradients are computed for `grad_scale` × loss, where grad_scale is what the caller multiplies the loss by
before differentiating (loss scale ÷ accumulation): with float16 compute the per-token gradients are cast to
float16 for the matmuls already scaled, exactly as backpropagating the scaled loss would cast them, so small
probabilities do not underflow.

Token weights and the denominator: the loss is Σ w·ce / d. Without a mask w = 1 and d = Σ w (the plain mean); with
the loss mask w is the mask and d the step's share of the masked-in tokens (masked.py), so the chunked masked loss
is the whole masked loss. An all-zero w gives loss 0 and zero gradients. In evaluation with a mask, the per-token
cross-entropy (one float per token) comes out of the chunks and the mask sums it as it does the whole path's.

Equality with the whole path: the same formulas in float32; the sums are ordered differently (a sum per chunk,
then over chunks; the head-weight gradient accumulated chunk by chunk), so results agree to float32 rounding
(relative 1e-6), not bit for bit. tests/test_loss.py checks loss and every gradient, with and without a mask and
with a mixture of experts' router term (tests/test_losses.py).
"""
import mindspore as ms
from mindspore import nn, ops

from ms_llm.nn.backend import PORTABLE
from ms_llm.train.losses.part import TokenObjective


class ChunkedTokens(TokenObjective):
    """The token cross-entropy over chunks of `chunk` tokens, from the final hidden states and the head weight, the
    mean or with `mask` Σ w·ce ÷ the step's share; in training it returns grad_scale × loss with its own gradients
    (ChunkedCrossEntropy), in evaluation the forward alone (ChunkedCrossEntropyLoss)."""

    reads_hidden = True
    scales_itself = True

    def __init__(self, chunk, compute_dtype=ms.float32, backend=PORTABLE, mask=None):
        super().__init__(mask)
        self.train_loss = ChunkedCrossEntropy(chunk, compute_dtype, backend)
        self.eval_loss = ChunkedCrossEntropyLoss(chunk, compute_dtype, backend)

    def train(self, hidden, targets, grad_scale, share, columns):
        x, head, targets = self.flat(hidden, targets)
        if self.masked:
            weights, denom = self.mask.weights(columns), share
        else:
            weights = ops.ones(targets.shape, ms.float32)
            denom = mean_denominator(weights)
        scaled, loss, _, _ = self.train_loss(x, head, targets, weights, denom, grad_scale)
        return scaled, loss, ()

    def evaluate(self, hidden, targets, columns):
        x, head, targets = self.flat(hidden, targets)
        if self.masked:
            return self.mask.evaluate(self.eval_loss.token_ce(x, head, targets), columns)
        loss = self.eval_loss(x, head, targets, ops.ones(targets.shape, ms.float32))
        return loss, loss

    def flat(self, hidden, targets):
        x, head = hidden
        return x.reshape(-1, x.shape[-1]), head, targets.reshape(-1)


def mean_denominator(token_weights):
    """Σ w, or 1 where every weight is 0 (then the loss is 0 and so are the gradients)."""
    denom = token_weights.sum()
    return denom + (denom == 0).astype(ms.float32)


def chunk_bounds(tokens, chunk):
    """[(start, end)] covering `tokens` in pieces of at most `chunk`."""
    return [(s, min(s + chunk, tokens)) for s in range(0, tokens, chunk)]


class _ChunkMath(nn.Cell):
    """Per chunk of float32 logits: (ce per token, coef · (softmax − onehot)). One fused CPU kernel, else MindSpore
    ops (the max-shifted softmax; the onehot term scattered into the gradient rather than built)."""

    def __init__(self, backend, with_grad):
        super().__init__()
        name = "softmax_cross_entropy" if with_grad else "softmax_cross_entropy_loss"
        self.kernel = backend.kernel(name)
        self.fused = self.kernel is not None

    def loss_and_grad(self, logits, targets, coef):
        if self.fused:
            return self.kernel(logits, targets, coef)
        m = ops.amax(logits, -1, True)
        e = ops.exp(logits - m)
        s = e.sum(-1, keepdims=True)
        t = targets.reshape(-1, 1)
        ce = (ops.log(s) + m - ops.gather_elements(logits, 1, t)).reshape(-1)
        c = coef.reshape(-1, 1)
        # (ops.zeros_like inside a Cell with a custom bprop fails to compile in MindSpore 2.10: broadcast instead)
        grad = ops.tensor_scatter_elements(e * (c / s), t, ops.broadcast_to(-c, t.shape), 1, "add")
        return ce, grad

    def loss(self, logits, targets):
        if self.fused:
            return self.kernel(logits, targets)
        m = ops.amax(logits, -1, True)
        lse = ops.log(ops.exp(logits - m).sum(-1, keepdims=True)) + m
        return (lse - ops.gather_elements(logits, 1, targets.reshape(-1, 1))).reshape(-1)


class ChunkedCrossEntropy(nn.Cell):
    """(x (N, h) compute dtype, head weight (V, h) float32, targets (N,) int32, token weights (N,) float32,
    denominator () (> 0), grad_scale ()) → (grad_scale · loss, loss, dx, dweight), loss = Σ w·ce / denominator in
    float32, over `chunk` tokens at a time. Differentiate the first output; dx and dweight are the gradients of
    grad_scale · loss, returned for the Cell's own backward."""

    def __init__(self, chunk, compute_dtype=ms.float32, backend=PORTABLE):
        super().__init__()
        self.chunk, self.dtype = chunk, compute_dtype
        self.math = _ChunkMath(backend, with_grad=True)
        self.logits_mm = ops.MatMul(transpose_b=True)  # x_c @ Wᵀ
        self.dx_mm = ops.MatMul()  # dlogits @ W
        self.dw_mm = ops.MatMul(transpose_a=True)  # dlogitsᵀ @ x_c

    def construct(self, x, weight, targets, token_weights, denom, grad_scale):
        w = weight.astype(self.dtype)
        coef = token_weights * (grad_scale / denom)
        total = ops.zeros((), ms.float32)
        dweight = ops.zeros(weight.shape, ms.float32)
        dx = ()
        for start, end in chunk_bounds(x.shape[0], self.chunk):
            xc = x[start:end]
            if start:  # the previous chunk is done before this one's logits exist: one chunk's memory at a time
                xc = ops.depend(ops.depend(xc, dweight), dx[-1])
            logits = self.logits_mm(xc, w).astype(ms.float32)
            ce, dlogits = self.math.loss_and_grad(logits, targets[start:end], coef[start:end])
            total = total + (ce * token_weights[start:end]).sum()
            dlogits = dlogits.astype(self.dtype)
            dx = dx + (self.dx_mm(dlogits, w),)
            dweight = dweight + self.dw_mm(dlogits, xc).astype(ms.float32)
        loss = total / denom
        return loss * grad_scale, loss, ops.concat(dx, 0), dweight

    def bprop(self, x, weight, targets, token_weights, denom, grad_scale, out, dout):
        d = dout[0]  # 1 when the first output is the one differentiated
        return out[2] * d.astype(out[2].dtype), out[3] * d, targets * 0, token_weights * 0, denom * 0, grad_scale * 0


class ChunkedCrossEntropyLoss(nn.Cell):
    """Forward only (evaluation): Σ w·ce / Σ w over `chunk` tokens at a time, without the gradients."""

    def __init__(self, chunk, compute_dtype=ms.float32, backend=PORTABLE):
        super().__init__()
        self.chunk, self.dtype = chunk, compute_dtype
        self.math = _ChunkMath(backend, with_grad=False)
        self.logits_mm = ops.MatMul(transpose_b=True)

    def construct(self, x, weight, targets, token_weights):
        w = weight.astype(self.dtype)
        denom = token_weights.sum()
        denom = denom + (denom == 0).astype(ms.float32)
        total = ops.zeros((), ms.float32)
        for start, end in chunk_bounds(x.shape[0], self.chunk):
            xc = x[start:end]
            if start:
                xc = ops.depend(xc, total)
            ce = self.math.loss(self.logits_mm(xc, w).astype(ms.float32), targets[start:end])
            total = total + (ce * token_weights[start:end]).sum()
        return total / denom

    def token_ce(self, x, weight, targets):
        """The cross-entropy of every token (N,), float32, a chunk of logits at a time."""
        w = weight.astype(self.dtype)
        ce = ()
        for start, end in chunk_bounds(x.shape[0], self.chunk):
            xc = x[start:end]
            if start:
                xc = ops.depend(xc, ce[-1])
            ce = ce + (self.math.loss(self.logits_mm(xc, w).astype(ms.float32), targets[start:end]),)
        return ops.concat(ce, 0)
