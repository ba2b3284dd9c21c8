"""Tensor statistics in one compiled graph, so that recording them every 100 steps costs about one
extra step per 100 (a PyNative probe with hooks costs ~20 steps on a small model).

For the micro-batches of a step (stacked as (accum, micro, T+1)) the probe returns, in float32:
  * per residual-stream state (embedding output, each layer's output, final norm): 6 statistics
  * per parameter, for the gradient of the mean loss over the micro-batches: 6 statistics
  * per parameter, the norms of AdamW's two moments
The 6 statistics are mean, std, max |x|, L2 norm, share of exact zeros and count of non-finite values,
computed over the finite values.
"""
import mindspore as ms
from mindspore import nn, ops

from ms_llm.train.step import sum_of_squares

STAT_NAMES = ("mean", "std", "max_abs", "norm", "zero_frac", "nonfinite")


def tensor_stats(x):
    x = x.astype(ms.float32)
    x = x.reshape(-1, x.shape[-1]) if x.ndim > 1 else x.reshape(1, -1)
    n = x.size
    finite = ops.isfinite(x)
    xf = ops.select(finite, x, ops.zeros_like(x))
    total = xf.sum(-1).sum()
    sq = (xf * xf).sum(-1).sum()
    mean = total / n
    std = ops.sqrt(ops.maximum(sq / n - mean * mean, 0.0))
    max_abs = ops.abs(xf).max(-1).max()
    zero = (x == 0).astype(ms.float32).sum(-1).sum() / n
    nonfinite = n - finite.astype(ms.float32).sum(-1).sum()
    return ops.stack([mean, std, max_abs, ops.sqrt(sq), zero, nonfinite])


def token_nll(logits, targets):
    """Mean next-token negative log-likelihood from an explicit log-softmax in float32: a second derivation
    of the loss, not the training step's ops.cross_entropy."""
    logits = logits.reshape(-1, logits.shape[-1]).astype(ms.float32)
    logp = logits - ops.logsumexp(logits, -1, True)
    return -ops.gather_elements(logp, 1, targets.reshape(-1, 1)).mean()


class MeanLoss(nn.Cell):
    """The next-token loss of one micro-batch divided by the micro-batches of a step, written here and not
    taken from the training step, so that a wrong loss in the step shows up as a mismatch. The statistics
    of the residual stream come out of the same forward pass (as auxiliary outputs, not differentiated)."""

    def __init__(self, model, accum):
        super().__init__(auto_prefix=False)
        self.model, self.accum = model, accum

    def construct(self, ids):
        states = self.model.hidden_states(ids[:, :-1])
        loss = token_nll(self.model.logits(states[-1]), ids[:, 1:])
        return loss / self.accum, (loss, ops.stack([tensor_stats(h) for h in states]))


class StatsProbe(nn.Cell):
    def __init__(self, model, optimizer, accum):
        super().__init__(auto_prefix=False)
        self.model = model
        self.weights = optimizer.params
        self.exp_avg, self.exp_avg_sq = optimizer.exp_avg, optimizer.exp_avg_sq
        self.accum = accum
        self.grad_fn = ms.value_and_grad(MeanLoss(model, accum), None, self.weights, has_aux=True)
        self.hyper_map = ops.HyperMap()

    def construct(self, batches):
        (_, (loss, acts)), grads = self.grad_fn(batches[0])
        for i in range(1, self.accum):
            (_, (more, _)), g = self.grad_fn(batches[i])
            grads = self.hyper_map(ops.add, grads, g)
            loss = loss + more
        grad_stats = ops.stack([tensor_stats(g) for g in grads])
        # float32 whatever the states' dtype: a half-precision state is what the dtype_mismatch flag reports, so
        # it must not stop the probe
        moments = ops.stack([ops.stack([ops.sqrt(sum_of_squares(m.astype(ms.float32))),
                                        ops.sqrt(sum_of_squares(v.astype(ms.float32)))])
                             for m, v in zip(self.exp_avg, self.exp_avg_sq)])
        return acts, grad_stats, moments, loss / self.accum
