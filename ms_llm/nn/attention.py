"""Causal self-attention with fused QKV projection, optional RoPE and grouped-query attention, and the options of
Llama's relatives: q/k/v biases (Qwen2.5), per-head q/k RMSNorm (Qwen3), a head size apart from hidden/heads
(Qwen3), a sliding window (Mistral).

Scores, mask and softmax are computed in float32 whatever the compute dtype: QK^T overflows float16
on long sequences long before anything else does.
"""
import math

import numpy as np
import mindspore as ms
from mindspore import nn, ops

from ms_llm.nn.backend import PORTABLE
from ms_llm.nn.layers import Linear
from ms_llm.nn.layers import RMSNorm
from ms_llm.nn.rope import RotaryEmbedding
from ms_llm.nn.dropout import dropout_site

MASKED = -1e9  # finite, so a fully masked row cannot produce NaN
FLASH_MASK = 2048  # FlashAttentionScore's causal mode (sparse_mode=2) takes a fixed 2048x2048 mask


def use_flash_attention(compute_dtype, head_dim, dropout, backend, window=None):
    """Ascend's fused FlashAttentionScore: float16/bfloat16, head size a multiple of 16, no dropout, and (as its
    compressed causal mask is used) no sliding window."""
    return (backend.ascend and compute_dtype in (ms.float16, ms.bfloat16) and head_dim % 16 == 0 and dropout == 0
            and window is None)


def causal_mask(seq_length, window=None):
    """(T, T) float32: 0 where query i may attend to key j, MASKED elsewhere: j > i, and with a sliding window
    also i - j >= window (i attends to itself and the window - 1 tokens before it, as Hugging Face's Mistral)."""
    mask = np.triu(np.full((seq_length, seq_length), MASKED, np.float32), 1)
    if window is not None:
        mask += np.tril(np.full((seq_length, seq_length), MASKED, np.float32), -window)
    return mask


class DocumentMask(nn.Cell):
    """Packed samples (fine-tuning): segment ids (B, T) int32, the document each token belongs to, → (document bias
    (B, 1, T, T) float32: 0 where query i and key j are in the same document, MASKED elsewhere; positions (B, T)
    int32: each token's index within its document). Added to `causal_mask` (and the sliding window) by every
    layer, it makes attention block-diagonal: no token sees another conversation, and RoPE / learned positions
    restart at 0 at each document. Built once per forward from the ids, so nothing (B, T, T) travels from the host.

    MindSpore has no fused variable-length kernel on CPU or GPU, so the bias is a dense (B, T, T) tensor and the
    scores of masked blocks are still computed (docs/finetuning.md measures the cost). On Ascend,
    FlashAttentionScore takes the document lengths instead (actual_seq_qlen / actual_seq_kvlen with the TND
    layout) and skips masked blocks; ms_llm does not use that path yet: with a document bias the layer takes the
    composed attention."""

    def construct(self, segments):
        t = segments.shape[1]
        same = segments.expand_dims(2) == segments.expand_dims(1)  # (B, T, T)
        index = ops.arange(t, dtype=ms.int32)
        before = index.expand_dims(1) > index.expand_dims(0)  # key j strictly before query i
        positions = (same & before).astype(ms.int32).sum(-1)  # same-document tokens before i
        bias = ops.select(same, ops.zeros(same.shape, ms.float32), ops.fill(ms.float32, same.shape, MASKED))
        return bias.expand_dims(1), positions


class ProbsRecomputedCore(nn.Cell):
    """softmax(q kᵀ·scale, causal) v whose backward recomputes the probabilities from q and k instead of keeping
    them: selective recompute on CPU. MindSpore's Cell.recompute() on the CPU backend keeps more than it
    saves there (benchmarks/cpu_recompute_memory.py), so the core's backward is written out with the fused
    kernels. Inputs: q (B, H, T, D) compute dtype, k and v with the heads already repeated for GQA."""

    def __init__(self, scale, compute_dtype, backend):
        super().__init__()
        self.scale, self.dtype = scale, compute_dtype
        self.softmax = backend.kernel("causal_softmax")
        self.softmax_grad = backend.kernel("causal_softmax_grad")
        self.qk = ops.BatchMatMul(transpose_b=True)
        self.pv = ops.BatchMatMul()
        self.grad_a = ops.BatchMatMul(transpose_a=True)

    def probs(self, q, k):
        return self.softmax(self.qk(q * self.scale, k).astype(ms.float32))

    def construct(self, q, k, v):
        return self.pv(self.probs(q, k).astype(self.dtype), v)

    def bprop(self, q, k, v, out, dout):
        # recomputed once the backward reaches this layer: without the dependency on dout the runtime would run it
        # as soon as q and k exist, in the forward pass, and keep it as long as the probabilities it replaces
        q = ops.depend(q, dout)
        p = self.probs(q, k)
        dv = self.grad_a(p.astype(self.dtype), dout)
        dscores = self.softmax_grad(p, self.qk(dout, v).astype(ms.float32)).astype(self.dtype)
        dq = self.pv(dscores, k) * self.scale
        dk = self.grad_a(dscores, q * self.scale)
        return dq, dk, dv


class AttentionCore(nn.Cell):
    """softmax(q k^T / sqrt(d) + causal mask) v on (B, H, T, D) heads: the part selective recompute
    recomputes and tensor parallelism splits by head. Its primitives are attributes so that
    `ms_llm.parallel` can shard them by name from outside."""

    def __init__(self, num_heads, num_kv_heads, head_dim, seq_length, dropout=0.0, compute_dtype=ms.float32,
                 backend=PORTABLE, window=None):
        super().__init__()
        self.num_heads, self.groups, self.head_dim = num_heads, num_heads // num_kv_heads, head_dim
        self.scale = 1.0 / math.sqrt(head_dim)
        self.dtype = compute_dtype
        window = window if window is not None and window < seq_length else None  # wider than a sample: no-op
        self.window = window
        self.flash = use_flash_attention(compute_dtype, head_dim, dropout, backend, window)
        if self.flash:  # 1 = masked, upper triangle: the compressed causal mask of sparse_mode=2
            self.mask = ms.Tensor(np.triu(np.ones((FLASH_MASK, FLASH_MASK), np.uint8), 1))
            # packed documents take the composed path, which needs the float mask too
            self.float_mask = ms.Tensor(causal_mask(seq_length, window))
        else:
            self.mask = ms.Tensor(causal_mask(seq_length, window))
        self.qk = ops.BatchMatMul(transpose_b=True)
        self.pv = ops.BatchMatMul()
        self.softmax = ops.Softmax(-1)
        # CPU: mask and softmax in one kernel, and one for its backward. MindSpore's mask add and SoftmaxGrad
        # kept ~6 score-sized (B, H, T, T) temporaries per layer in backward (docs/performance.md, memory).
        # The kernel knows only the causal triangle: a sliding window takes the mask add.
        self.causal_softmax = None if self.flash or window is not None else backend.kernel("causal_softmax")
        self.fused = self.causal_softmax is not None
        self.dropout = dropout_site(dropout)
        self.recomputed = ProbsRecomputedCore(self.scale, compute_dtype, backend) if self.fused and not dropout \
            else None
        self.recompute_probs = False

    def recompute(self, **kwargs):
        """Selective recompute. With the fused CPU kernels (and no dropout, whose mask would have to be replayed) the
        probabilities are recomputed by ProbsRecomputedCore's own backward; otherwise by MindSpore's recompute,
        which does not recompute custom AOT ops, so the core then uses the composition."""
        if self.recomputed is not None:
            self.recompute_probs = True
            return self
        self.fused = False
        return super().recompute(**kwargs)

    def scores(self, q, k, documents=None):
        """Masked attention logits in float32. q is scaled before the matmul so that float16 scores
        overflow sqrt(head_dim) times later than with the scale applied after. `documents`: a DocumentMask bias."""
        t = q.shape[2]
        mask = self.float_mask if self.flash else self.mask
        scores = self.qk(q * self.scale, k).astype(ms.float32) + mask[:t, :t]
        if documents is not None:
            scores = scores + documents
        return scores

    def construct(self, q, k, v, documents=None):
        if self.flash and documents is None:  # softmax statistics are kept in float32 inside the kernel; GQA native
            return ops.flash_attention_score(q, k, v, self.num_heads, attn_mask=self.mask, scalar_value=self.scale,
                                             input_layout="BNSD", sparse_mode=2)
        if self.groups > 1:
            b, kv, t, d = k.shape
            k = ops.broadcast_to(k.reshape(b, kv, 1, t, d), (b, kv, self.groups, t, d)).reshape(b, -1, t, d)
            v = ops.broadcast_to(v.reshape(b, kv, 1, t, d), (b, kv, self.groups, t, d)).reshape(b, -1, t, d)
        if documents is None and self.recompute_probs:
            return self.recomputed(q, k, v)
        if documents is None and self.fused:  # causal mask applied inside the kernel
            probs = self.causal_softmax(self.qk(q * self.scale, k).astype(ms.float32))
        else:  # packed documents: their bias is added to the mask (the kernel knows only the causal triangle)
            probs = self.softmax(self.scores(q, k, documents))
        return self.pv(self.dropout(probs).astype(self.dtype), v)


class CausalSelfAttention(nn.Cell):
    """x → out(attention(rope(q), rope(k), v)) with q, k, v from one fused projection.

    head_dim: size of each head (None: hidden / num_heads). qkv_bias: biases on q, k, v but not on out (bias=True
    puts them on both). qk_norm_eps: when given, RMSNorm over each head's q and k before RoPE (Qwen3).
    rope_scaling: a model.rope_scaling section. window: sliding-window length (None: full causal).
    """

    def __init__(self, hidden, num_heads, num_kv_heads, seq_length, bias=False, init_std=0.02, out_std=0.02,
                 dropout=0.0, rope_theta=None, compute_dtype=ms.float32, backend=PORTABLE, head_dim=None,
                 qkv_bias=False, qk_norm_eps=None, rope_scaling=None, window=None):
        super().__init__()
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim = head_dim or hidden // num_heads
        self.qkv = Linear(hidden, (num_heads + 2 * num_kv_heads) * self.head_dim, bias or qkv_bias, init_std,
                          compute_dtype)
        self.out = Linear(num_heads * self.head_dim, hidden, bias, out_std, compute_dtype)
        self.qk_norm = qk_norm_eps is not None
        self.q_norm = RMSNorm(self.head_dim, qk_norm_eps, backend) if self.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, qk_norm_eps, backend) if self.qk_norm else None
        self.rope = RotaryEmbedding(self.head_dim, seq_length, rope_theta, rope_scaling) if rope_theta else None
        self.use_rope = rope_theta is not None
        self.core = AttentionCore(num_heads, num_kv_heads, self.head_dim, seq_length, dropout, compute_dtype, backend,
                                  window)
        self.flash = self.core.flash
        self.resid_dropout = dropout_site(dropout)
        # CPU, float32: heads split and merged by copy kernels. MindSpore's CPU Transpose keeps an int64 index
        # table of twice its input's size per kernel from compile time on, and the q/k/v slices' backward
        # writes three zero-padded full-size gradients that are then added (docs/performance.md, memory).
        fp32 = compute_dtype == ms.float32
        self.split_heads = backend.kernel("heads_split", num_heads, num_kv_heads) if fp32 else None
        self.merge_heads = backend.kernel("swap_middle_axes") if fp32 else None
        self.fused_heads = self.split_heads is not None

    def construct(self, x, documents=None, positions=None):
        """`documents`, `positions`: DocumentMask's outputs for packed samples (None: one sequence per row)."""
        q, k, v = self.heads(x, positions)
        return self.output(self.core(q, k, v, documents))

    def heads(self, x, positions=None):
        """x (B, T, hidden) → q (B, H, T, D), k and v (B, KV, T, D), normed and rotated: what a KV cache keeps
        (ms_llm.nn.kv_cache) is k and v as they leave here."""
        b, t, _ = x.shape
        h, kv, d = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self.qkv(x).reshape(b, t, h + 2 * kv, d)
        if self.fused_heads:
            q, k, v = self.split_heads(qkv)
        else:
            qkv = qkv.transpose(0, 2, 1, 3)  # (B, H+2KV, T, D)
            q, k, v = qkv[:, :h], qkv[:, h:h + kv], qkv[:, h + kv:]
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.use_rope:
            q, k = self.rope(q, positions), self.rope(k, positions)
        return q, k, v

    def output(self, y):
        """The heads' attention output (B, H, T, D) → (B, T, hidden)."""
        b, _, t, _ = y.shape
        y = self.merge_heads(y) if self.fused_heads else y.transpose(0, 2, 1, 3)
        return self.resid_dropout(self.out(y.reshape(b, t, self.num_heads * self.head_dim)))
