"""Rotary position embedding in the Hugging Face layout (rotate the two halves of each head), with the llama3
frequency scaling of Llama 3.1/3.2. Tables are computed in float64 and cast to float32 once."""
import math

import numpy as np
import mindspore as ms
from mindspore import nn, ops


def inverse_frequencies(head_dim, theta, scaling=None):
    """theta^(-2i/d) for i < d/2, float64; `scaling` (type, factor, low_freq_factor, high_freq_factor,
    original_max_position_embeddings: a model.rope_scaling section) rescales them."""
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    if scaling is None:
        return inv_freq
    if scaling.type != "llama3":
        raise ValueError(f"unknown RoPE scaling {scaling.type!r}")
    return llama3_scaled(inv_freq, scaling)


def llama3_scaled(inv_freq, s):
    """Llama 3.1's rule: wavelengths shorter than original/high_freq_factor are kept, those longer than
    original/low_freq_factor are stretched `factor` times, and the band between is interpolated smoothly."""
    wavelen = 2 * math.pi / inv_freq
    old = s.original_max_position_embeddings
    smooth = (old / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    between = (1 - smooth) * inv_freq / s.factor + smooth * inv_freq
    return np.where(wavelen < old / s.high_freq_factor, inv_freq,
                    np.where(wavelen > old / s.low_freq_factor, inv_freq / s.factor, between))


def rope_tables(head_dim, seq_length, theta, scaling=None):
    inv_freq = inverse_frequencies(head_dim, theta, scaling)
    angles = np.outer(np.arange(seq_length, dtype=np.float64), inv_freq)  # (T, D/2)
    angles = np.concatenate([angles, angles], axis=-1)  # (T, D)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


class RotaryEmbedding(nn.Cell):
    def __init__(self, head_dim, seq_length, theta=10000.0, scaling=None):
        super().__init__()
        cos, sin = rope_tables(head_dim, seq_length, theta, scaling)
        self.cos, self.sin = ms.Tensor(cos), ms.Tensor(sin)
        self.half = head_dim // 2

    def construct(self, x):
        """x: (B, H, T, D) → same shape, rotated by position."""
        t = x.shape[2]
        cos, sin = self.cos[:t].astype(x.dtype), self.sin[:t].astype(x.dtype)
        rotated = ops.concat((-x[..., self.half:], x[..., : self.half]), -1)
        return x * cos + rotated * sin
