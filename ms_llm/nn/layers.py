"""The layers a decoder block is built of, besides attention (attention.py): the linear layer, the activations, the
norms and the feed-forward blocks, in the order a reader meets them.

    Linear        y = x @ W^T + b, W stored (out, in) in float32 and cast to the compute dtype for the matmul
    GeluTanh      GPT-2's GELU, composed from element-wise primitives (on CPU, ops.gelu and its gradient kernel are
                  ~10x slower than this composition of tanh, mul and add); silu
    LayerNorm     fp32 islands whatever the compute dtype
    RMSNorm
    GeluMLP       the GELU MLP (GPT-2), SwiGLU (Llama): the feed-forward blocks
    SwiGLU
"""
import numpy as np
import mindspore as ms
from mindspore import nn, ops

from ms_llm.nn.backend import PORTABLE
from ms_llm.nn.dropout import dropout_site
from ms_llm.nn.init import normal, ones, zeros


# --- the linear layer ---------------------------------------------------------------------------------------------

class Linear(nn.Cell):
    """y = x @ W^T + b with W stored (out, in) in float32 and cast to `compute_dtype` for the matmul.

    The transpose is folded into MatMul(transpose_b=True) instead of a separate Transpose kernel.
    """

    def __init__(self, in_features, out_features, bias=False, init_std=0.02, compute_dtype=ms.float32):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = normal((out_features, in_features), init_std, "weight")
        self.bias = zeros((out_features,), "bias") if bias else None
        self.has_bias = bias
        self.dtype = compute_dtype
        self.matmul = ops.MatMul(transpose_b=True)

    def construct(self, x):
        shape = x.shape
        y = self.matmul(x.reshape(-1, self.in_features).astype(self.dtype), self.weight.astype(self.dtype))
        if self.has_bias:
            y = y + self.bias.astype(self.dtype)
        return y.reshape(shape[:-1] + (self.out_features,))


# --- activations --------------------------------------------------------------------------------------------------

SQRT_2_OVER_PI = 0.7978845608028654


def gelu_tanh(x):
    """0.5 * x * (1 + tanh(u)), u = sqrt(2/pi) * (x + 0.044715 x^3), written as x * sigmoid(2u): the same
    function, without the cancellation in 1 + tanh(u) that costs float32 ~1e-4 absolute for x < -3."""
    return x * ops.sigmoid((2.0 * SQRT_2_OVER_PI) * (x + 0.044715 * x * x * x))


class GeluTanh(nn.Cell):
    """GPT-2's GELU; one fused CPU kernel forward and one backward on a backend with cpu_kernels."""

    def __init__(self, compute_dtype=ms.float32, backend=PORTABLE):
        super().__init__()
        self.op = backend.kernel("gelu_tanh") if compute_dtype == ms.float32 else None
        self.fused = self.op is not None
        self.recompute_output = False  # set by recompute() with the fused kernels: the MLP recomputes it (GeluMLP)

    def recompute(self, **kwargs):
        """Selective recompute. With the fused kernels the MLP recomputes the output in its down projection's
        backward (GeluDown); otherwise MindSpore's recompute, which does not recompute custom AOT ops, so a
        recomputed GELU then uses the composition."""
        if self.fused:
            self.recompute_output = True
            return self
        return super().recompute(**kwargs)

    def construct(self, x):
        if self.fused:
            return self.op(x)
        return gelu_tanh(x)


def silu(x):
    return x * ops.sigmoid(x)


# --- norms --------------------------------------------------------------------------------------------------------

class LayerNorm(nn.Cell):
    """LayerNorm over the last axis, computed on a 2-D (rows, hidden) view so that the gradients of the
    gain and bias are single-axis reductions (MindSpore's multi-axis CPU ReduceSum is ~4x slower).

    On a backend with cpu_kernels it is one fused kernel forward and one backward; otherwise it is written out
    from mean and variance, which on CPU beats the LayerNorm/LayerNormGrad kernels (docs/performance.md).
    """

    def __init__(self, dim, eps=1e-5, bias=True, backend=PORTABLE):
        super().__init__()
        self.weight = ones((dim,), "weight")
        self.bias = zeros((dim,), "bias") if bias else None
        self.has_bias = bias
        self.eps = eps
        self.op = backend.kernel("layer_norm")
        self.fused = self.op is not None
        self.ascend = backend.ascend and not self.fused  # Ascend's fused LayerNorm kernel
        if self.fused:
            self.eps_tensor = ms.Tensor([eps], ms.float32)
        elif self.ascend:
            self.op = ops.LayerNorm(-1, -1, eps)
        self.zero_bias = ms.Tensor(np.zeros(dim, np.float32))

    def construct(self, x):
        dtype, shape = x.dtype, x.shape
        x = x.astype(ms.float32).reshape(-1, shape[-1])
        bias = self.bias if self.has_bias else self.zero_bias
        if self.fused:
            return self.op(x, self.weight, bias, self.eps_tensor).astype(dtype).reshape(shape)
        if self.ascend:
            return self.op(x, self.weight, bias)[0].astype(dtype).reshape(shape)
        mean = x.mean(-1, keep_dims=True)
        centered = x - mean
        var = (centered * centered).mean(-1, keep_dims=True)
        y = centered * ops.rsqrt(var + self.eps) * self.weight
        if self.has_bias:
            y = y + self.bias
        return y.astype(dtype).reshape(shape)


class RMSNorm(nn.Cell):
    """x / sqrt(mean(x^2) + eps) * w in float32; Ascend's fused RmsNorm kernel there."""

    def __init__(self, dim, eps=1e-5, backend=PORTABLE):
        super().__init__()
        self.weight = ones((dim,), "weight")
        self.eps = eps
        self.ascend = backend.ascend
        self.op = ops.RmsNorm(eps) if self.ascend else None

    def construct(self, x):
        dtype, shape = x.dtype, x.shape
        x = x.astype(ms.float32).reshape(-1, shape[-1])
        if self.ascend:
            return self.op(x, self.weight)[0].astype(dtype).reshape(shape)
        y = x * ops.rsqrt((x * x).mean(-1, keep_dims=True) + self.eps) * self.weight
        return y.astype(dtype).reshape(shape)


# --- the feed-forward blocks ---------------------------------------------------------------------------------------

class GeluDown(nn.Cell):
    """down(gelu(u)) without keeping gelu(u): the backward recomputes it from u (selective recompute with the
    fused CPU kernels; float32). Inputs: u (rows, ffn), the down projection's weight (hidden, ffn)."""

    def __init__(self, backend):
        super().__init__()
        self.gelu = backend.kernel("gelu_tanh")
        self.gelu_grad = backend.kernel("gelu_tanh_grad")
        self.matmul = ops.MatMul(transpose_b=True)
        self.grad_x = ops.MatMul()
        self.grad_w = ops.MatMul(transpose_a=True)

    def construct(self, u, weight):
        return self.matmul(self.gelu(u), weight)

    def bprop(self, u, weight, out, dout):
        u = ops.depend(u, dout)  # recompute in the backward, not as soon as u exists (see ProbsRecomputedCore)
        return self.gelu_grad(u, self.grad_x(dout, weight)), self.grad_w(dout, self.gelu(u))


class GeluMLP(nn.Cell):
    def __init__(self, hidden, ffn, bias, init_std, out_std, dropout=0.0, compute_dtype=ms.float32,
                 backend=PORTABLE):
        super().__init__()
        self.up = Linear(hidden, ffn, bias, init_std, compute_dtype)
        self.down = Linear(ffn, hidden, bias, out_std, compute_dtype)
        self.act = GeluTanh(compute_dtype, backend)
        self.act_down = GeluDown(backend) if self.act.fused else None
        self.dropout = dropout_site(dropout)

    def construct(self, x):
        if self.act.recompute_output:  # selective recompute: GELU's output is rebuilt in the backward
            u = self.up(x)
            y = self.act_down(u.reshape(-1, u.shape[-1]), self.down.weight)
            if self.down.has_bias:
                y = y + self.down.bias
            return self.dropout(y.reshape(x.shape[:-1] + (y.shape[-1],)))
        return self.dropout(self.down(self.act(self.up(x))))


class SiluGate(nn.Cell):
    """silu(gate) * up from the fused gate|up projection: the activation selective recompute recomputes."""

    def __init__(self, ffn):
        super().__init__()
        self.ffn = ffn

    def construct(self, gate_up):
        return silu(gate_up[..., : self.ffn]) * gate_up[..., self.ffn:]


class SwiGLU(nn.Cell):
    """down(silu(gate(x)) * up(x)); gate and up are one fused matmul."""

    def __init__(self, hidden, ffn, init_std, out_std, dropout=0.0, compute_dtype=ms.float32):
        super().__init__()
        self.gate_up = Linear(hidden, 2 * ffn, False, init_std, compute_dtype)
        self.act = SiluGate(ffn)
        self.down = Linear(ffn, hidden, False, out_std, compute_dtype)
        self.dropout = dropout_site(dropout)

    def construct(self, x):
        return self.dropout(self.down(self.act(self.gate_up(x))))
