"""Rotary position embedding in the Hugging Face layout (rotate the two halves of each head)."""
import numpy as np
import mindspore as ms
from mindspore import nn, ops


def rope_tables(head_dim, seq_length, theta):
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    angles = np.outer(np.arange(seq_length, dtype=np.float64), inv_freq)  # (T, D/2)
    angles = np.concatenate([angles, angles], axis=-1)  # (T, D)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


class RotaryEmbedding(nn.Cell):
    def __init__(self, head_dim, seq_length, theta=10000.0):
        super().__init__()
        cos, sin = rope_tables(head_dim, seq_length, theta)
        self.cos, self.sin = ms.Tensor(cos), ms.Tensor(sin)
        self.half = head_dim // 2

    def construct(self, x):
        """x: (B, H, T, D) → same shape, rotated by position."""
        t = x.shape[2]
        cos, sin = self.cos[:t].astype(x.dtype), self.sin[:t].astype(x.dtype)
        rotated = ops.concat((-x[..., self.half:], x[..., : self.half]), -1)
        return x * cos + rotated * sin
