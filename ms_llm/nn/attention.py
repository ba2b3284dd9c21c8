"""Causal self-attention with fused QKV projection, optional RoPE and grouped-query attention.

Scores, mask and softmax are computed in float32 whatever the compute dtype: QK^T overflows float16
on long sequences long before anything else does.
"""
import math

import numpy as np
import mindspore as ms
from mindspore import nn, ops

from ms_llm.nn import device
from ms_llm.nn.linear import Linear
from ms_llm.nn.rope import RotaryEmbedding

MASKED = -1e9  # finite, so a fully masked row cannot produce NaN
FLASH_MASK = 2048  # FlashAttentionScore's causal mode (sparse_mode=2) takes a fixed 2048x2048 mask


def use_flash_attention(compute_dtype, head_dim, dropout):
    """Ascend's fused FlashAttentionScore: float16/bfloat16, head size a multiple of 16, no dropout."""
    return device.is_ascend() and compute_dtype in (ms.float16, ms.bfloat16) and head_dim % 16 == 0 and dropout == 0


class CausalSelfAttention(nn.Cell):
    def __init__(self, hidden, num_heads, num_kv_heads, seq_length, bias=False, init_std=0.02, out_std=0.02,
                 dropout=0.0, rope_theta=None, compute_dtype=ms.float32):
        super().__init__()
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim = hidden // num_heads
        self.groups = num_heads // num_kv_heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.dtype = compute_dtype
        self.qkv = Linear(hidden, (num_heads + 2 * num_kv_heads) * self.head_dim, bias, init_std, compute_dtype)
        self.out = Linear(num_heads * self.head_dim, hidden, bias, out_std, compute_dtype)
        self.rope = RotaryEmbedding(self.head_dim, seq_length, rope_theta) if rope_theta else None
        self.use_rope = rope_theta is not None
        self.flash = use_flash_attention(compute_dtype, self.head_dim, dropout)
        if self.flash:  # 1 = masked, upper triangle: the compressed causal mask of sparse_mode=2
            self.mask = ms.Tensor(np.triu(np.ones((FLASH_MASK, FLASH_MASK), np.uint8), 1))
        else:
            self.mask = ms.Tensor(np.triu(np.full((seq_length, seq_length), MASKED, np.float32), 1))
        self.qk = ops.BatchMatMul(transpose_b=True)
        self.pv = ops.BatchMatMul()
        self.attn_dropout = nn.Dropout(p=dropout) if dropout > 0 else nn.Identity()
        self.resid_dropout = nn.Dropout(p=dropout) if dropout > 0 else nn.Identity()

    def construct(self, x):
        b, t, _ = x.shape
        h, kv, d = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self.qkv(x).reshape(b, t, h + 2 * kv, d).transpose(0, 2, 1, 3)  # (B, H+2KV, T, D)
        q, k, v = qkv[:, :h], qkv[:, h:h + kv], qkv[:, h + kv:]
        if self.use_rope:
            q, k = self.rope(q), self.rope(k)
        if self.flash:  # softmax statistics are kept in float32 inside the kernel; GQA is native
            y = ops.flash_attention_score(q, k, v, h, attn_mask=self.mask, scalar_value=self.scale,
                                          input_layout="BNSD", sparse_mode=2)
            return self.out(y.transpose(0, 2, 1, 3).reshape(b, t, h * d))
        if self.groups > 1:
            k = ops.broadcast_to(k.reshape(b, kv, 1, t, d), (b, kv, self.groups, t, d)).reshape(b, h, t, d)
            v = ops.broadcast_to(v.reshape(b, kv, 1, t, d), (b, kv, self.groups, t, d)).reshape(b, h, t, d)
        # q is scaled before the matmul so that float16 scores overflow sqrt(head_dim) times later
        scores = self.qk(q * self.scale, k).astype(ms.float32) + self.mask[:t, :t]
        probs = self.attn_dropout(ops.softmax(scores, -1)).astype(self.dtype)
        y = self.pv(probs, v).transpose(0, 2, 1, 3).reshape(b, t, h * d)
        return self.resid_dropout(self.out(y))
