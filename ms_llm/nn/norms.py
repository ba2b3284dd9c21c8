"""LayerNorm and RMSNorm computed in float32 whatever the compute dtype (an fp32 island)."""
import numpy as np
import mindspore as ms
from mindspore import nn, ops

from ms_llm.nn.backend import PORTABLE
from ms_llm.nn.init import ones, zeros


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
