"""Activations composed from element-wise primitives.

The tanh-approximate GELU (GPT-2's) is written out: on CPU, ops.gelu and its gradient kernel are
~10x slower than this composition of tanh, mul and add.
"""
from mindspore import ops

SQRT_2_OVER_PI = 0.7978845608028654


def gelu_tanh(x):
    return 0.5 * x * (1.0 + ops.tanh(SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))


def silu(x):
    return x * ops.sigmoid(x)
