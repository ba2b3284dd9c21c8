"""Activations composed from element-wise primitives.

The tanh-approximate GELU (GPT-2's) is written out: on CPU, ops.gelu and its gradient kernel are
~10x slower than this composition of tanh, mul and add.
"""
import mindspore as ms
from mindspore import nn, ops

from ms_llm.nn.backend import PORTABLE

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
