"""LayerNorm and RMSNorm computed in float32 whatever the compute dtype (an fp32 island)."""
import mindspore as ms
from mindspore import nn, ops

from ms_llm.nn.init import ones, zeros


class LayerNorm(nn.Cell):
    """Written out from mean/variance instead of ops.LayerNorm: on CPU the composed form and its
    gradient are faster than the LayerNorm/LayerNormGrad kernels (see docs/performance.md)."""

    def __init__(self, dim, eps=1e-5, bias=True):
        super().__init__()
        self.weight = ones((dim,), "weight")
        self.bias = zeros((dim,), "bias") if bias else None
        self.has_bias = bias
        self.eps = eps

    def construct(self, x):
        dtype = x.dtype
        x = x.astype(ms.float32)
        mean = x.mean(-1, keep_dims=True)
        centered = x - mean
        var = (centered * centered).mean(-1, keep_dims=True)
        y = centered * ops.rsqrt(var + self.eps) * self.weight
        if self.has_bias:
            y = y + self.bias
        return y.astype(dtype)


class RMSNorm(nn.Cell):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.weight = ones((dim,), "weight")
        self.eps = eps

    def construct(self, x):
        dtype = x.dtype
        x = x.astype(ms.float32)
        y = x * ops.rsqrt((x * x).mean(-1, keep_dims=True) + self.eps) * self.weight
        return y.astype(dtype)
