"""A fixed-size key/value cache for generation: prefill once, then one token per step.

The cache of each layer is a (B, KV, S, D) Parameter with S the model's context (seq_length), held by `KVCache` and
written in place: a prefill assigns a prompt's keys and values, a decode step scatters one new key and value per
row at its position. Nothing of the cache crosses between the host and the graph, and every decode step has the
same shapes and compiles once. A prompt is right-padded to one of a few lengths (buckets) and prefilled in one
call. Both Cells run the model's own sub-cells (embedding, norms, `CausalSelfAttention.heads`, its core and
`output`, the MLPs), so a prefill computes what the model's forward computes.

    cache = KVCache(model, B, S)
    Prefill(model, cache)(ids (B, P), last (B,))   → logits at `last` (B, V), cache written
    DecodeStep(model, cache)(token (B, 1), pos (B,)) → logits (B, V), cache updated at pos
    DecodeStep(model, cache, greedy=True)(...)     → the argmax token (B,) instead of the logits

Row b of a batch holds its tokens at positions 0..pos[b] - 1; DecodeStep writes the new token's key and value at
pos[b] and attends to 0..pos[b] (within the sliding window where the model has one). Cache entries past a row's
length hold prompt padding or nothing: they are masked, then overwritten as the row grows. With grouped-query
attention the `groups` query heads of a key/value head attend to its cache as one (groups, D) block, so the cache is
never repeated per query head. Scores, mask and softmax are float32, as in training.

A model built with the fused float32 CPU kernels decodes with them (ms_llm/nn/cpu_kernels): per layer one
(`DecodeAttention`) writes the new key and value into the cache in place and attends over positions 0..pos only,
one rotates q and k, one computes each RMSNorm. The composition in their place (every other backend) pays twice for
the whole cache at every step on CPU: MindSpore's ScatterNdUpdate copies the whole cache to its output, and the
masked attention reads every position; and it launches 2-3 times as many kernels, each of which costs about as much
as a small one's arithmetic (docs/evaluation.md; `benchmarks/generate_speed.py --composed` times both).
"""
import numpy as np

import mindspore as ms
from mindspore import Parameter, nn, ops

from ms_llm.nn.attention import MASKED
from ms_llm.nn.layers import RMSNorm


def _embed(model, ids, positions):
    """Token embedding (+ learned positions: GPT-2) for ids (B, T) at `positions` (B, T) int32."""
    x = model.embedding_gather(model.embedding, ids, 0)
    if model.has_positions:
        x = x + model.embedding_gather(model.positions, positions, 0)
    return model.embed_dropout(x.astype(model.dtype))


def _mlp(layer, x):
    return _mlp_of(layer, layer.mlp_norm(x))


def _mlp_of(layer, normed):
    out = layer.mlp(normed)
    return out[0] if layer.routed else out  # a mixture of experts also returns its router loss and statistics


def _rms_eps(norm):
    """An RMSNorm's epsilon as the fused kernel takes it; None for another norm (a LayerNorm: fused already)."""
    return ms.Tensor([norm.eps], ms.float32) if isinstance(norm, RMSNorm) else None


def _last_rows(x, last):
    """x (B, T, H) → (B, 1, H): row b's position last[b] (a one-hot matmul: exact, and one op on every backend)."""
    pick = ops.one_hot(last, x.shape[1], ops.ones((), x.dtype), ops.zeros((), x.dtype))  # (B, T)
    return ops.BatchMatMul()(pick.expand_dims(1), x)


class KVCache(nn.Cell):
    """Every layer's keys and values for `batch_size` rows of `length` positions, as Parameters written in place
    (not trained: they are no part of the model's weights or checkpoints)."""

    def __init__(self, model, batch_size, length):
        super().__init__(auto_prefix=False)
        core = model.layers[0].attention.core
        kv, d = core.num_heads // core.groups, core.head_dim
        shape, dtype = (batch_size, kv, length, d), model.dtype
        zeros = lambda: ms.Tensor(np.zeros(shape, ms.dtype_to_nptype(dtype)))  # noqa: E731
        n = len(model.layers)
        self.keys = ms.ParameterTuple([Parameter(zeros(), f"kv_cache.keys.{i}", requires_grad=False) for i in range(n)])
        self.values = ms.ParameterTuple([Parameter(zeros(), f"kv_cache.values.{i}", requires_grad=False)
                                         for i in range(n)])
        self.batch_size, self.length, self.kv_heads = batch_size, length, kv
        # scatter indices (B, KV, 3) = [row, head, position]: the first two fixed, the position per step
        rows = np.broadcast_to(np.arange(batch_size).reshape(-1, 1, 1), (batch_size, kv, 1))
        heads = np.broadcast_to(np.arange(kv).reshape(1, -1, 1), (batch_size, kv, 1))
        self.row_head = ms.Tensor(np.concatenate([rows, heads], -1).astype(np.int32))


class Prefill(nn.Cell):
    """The prompt's forward: the logits at each row's last real token; every layer's keys and values, padded to the
    cache length, written into the cache."""

    def __init__(self, model, cache):
        super().__init__(auto_prefix=False)
        self.model, self.cache = model, cache

    def construct(self, ids, last):
        m = self.model
        b, t = ids.shape
        if m.has_positions:  # the same slice of the table the model's forward adds
            x = m.embed_dropout((m.embedding_gather(m.embedding, ids, 0) + m.positions[:t]).astype(m.dtype))
        else:
            x = m.embed_dropout(m.embedding_gather(m.embedding, ids, 0).astype(m.dtype))
        i = 0
        for layer in m.layers:
            attn = layer.attention
            q, k, v = attn.heads(layer.attn_norm(x))
            x = x + attn.output(attn.core(q, k, v))
            x = x + _mlp(layer, x)
            ops.assign(self.cache.keys[i], self.padded(k))
            ops.assign(self.cache.values[i], self.padded(v))
            i += 1
        logits = m.logits(_last_rows(m.final_norm(x), last))
        return logits.reshape(b, -1)

    def padded(self, x):
        b, kv, t, d = x.shape
        if t == self.cache.length:
            return x
        return ops.concat((x, ops.zeros((b, kv, self.cache.length - t, d), x.dtype)), 2)


class DecodeStep(nn.Cell):
    """One new token per row against the cache: its key and value written at `pos`, attention over 0..pos; the
    logits, or with `greedy` the argmax token (the first of equal maxima, as numpy's), computed in the graph.
    `fused`: False takes the composition where the model has the fused kernel (to compare the two)."""

    def __init__(self, model, cache, greedy=False, fused=True):
        super().__init__(auto_prefix=False)
        self.model, self.cache, self.greedy = model, cache, greedy
        self.qk = ops.BatchMatMul(transpose_b=True)
        self.pv = ops.BatchMatMul()
        self.softmax = ops.Softmax(-1)
        self.argmax = ops.Argmax(-1, ms.int32)
        # the fused kernels are in use where the attention splits its heads with them (CPU, float32)
        self.fused = fused and all(layer.attention.fused_heads for layer in model.layers)
        if self.fused:
            from ms_llm.nn import cpu_kernels

            self.decode_attention = cpu_kernels.op("decode_attention")
            self.rope, self.rms_norm = cpu_kernels.op("decode_rope"), cpu_kernels.op("rms_norm")
            cores = [layer.attention.core for layer in model.layers]
            self.windows = [ms.Tensor([core.window or 0], ms.int32) for core in cores]  # 0: no sliding window
            self.scales = [ms.Tensor([core.scale], ms.float32) for core in cores]
            self.attn_eps = [_rms_eps(layer.attn_norm) for layer in model.layers]
            self.mlp_eps = [_rms_eps(layer.mlp_norm) for layer in model.layers]
            self.final_eps = _rms_eps(model.final_norm)

    def construct(self, token, pos):
        m, c = self.model, self.cache
        b = token.shape[0]
        positions = pos.reshape(b, 1)
        x = _embed(m, token, positions)
        slots = ops.arange(c.length, dtype=ms.int32).reshape(1, -1)  # (1, S)
        at = ops.concat((c.row_head, ops.broadcast_to(pos.reshape(b, 1, 1), (b, c.kv_heads, 1))), -1)  # (B, KV, 3)
        i = 0
        for layer in m.layers:
            attn = layer.attention
            if self.fused:  # writes k and v into the cache in place; nothing else in this graph reads the cache
                q, k, v = self.heads(attn, self.norm(layer.attn_norm, x, self.attn_eps[i]), pos)
                y = self.decode_attention(q, k, v, c.keys[i], c.values[i], pos, self.windows[i], self.scales[i])
                x = x + attn.output(y)
                x = x + _mlp_of(layer, self.norm(layer.mlp_norm, x, self.mlp_eps[i]))
            else:
                q, k, v = attn.heads(layer.attn_norm(x), positions)
                keys = ops.scatter_nd_update(c.keys[i], at, k.squeeze(2))
                values = ops.scatter_nd_update(c.values[i], at, v.squeeze(2))
                x = x + attn.output(self.attend(attn.core, q, keys, values, slots, positions))
                x = x + _mlp(layer, x)
            i += 1
        logits = m.logits(self.norm(m.final_norm, x, self.final_eps) if self.fused else m.final_norm(x)).reshape(b, -1)
        if self.greedy:
            return self.argmax(logits.astype(ms.float32))
        return logits

    def heads(self, attn, x, pos):
        """CausalSelfAttention.heads for one token per row (the fused path), the rotation of q and k in one kernel."""
        b = x.shape[0]
        q, k, v = attn.split_heads(attn.qkv(x).reshape(b, 1, attn.num_heads + 2 * attn.num_kv_heads, attn.head_dim))
        if attn.qk_norm:
            q, k = attn.q_norm(q), attn.k_norm(k)
        if attn.use_rope:
            q, k = self.rope(q, k, attn.rope.cos, attn.rope.sin, pos)
        return q, k, v

    def norm(self, norm, x, eps):
        """norm(x) (B, 1, hidden); an RMSNorm (eps given) in one fused kernel."""
        if eps is None:
            return norm(x)
        b, t, h = x.shape
        return self.rms_norm(x.reshape(b * t, h), norm.weight, eps).reshape(b, t, h)

    def attend(self, core, q, k, v, slots, positions):
        """softmax(q kᵀ·scale + mask) v for one query per row, with the core's scale, grouping and window: q (B, H,
        1, D) as (B, KV, groups, D) against k, v (B, KV, S, D)."""
        b, kv, s, d = k.shape
        q = q.reshape(b, kv, core.groups, d)
        visible = slots <= positions  # (B, S): keys 0..pos
        if core.window is not None:  # the query attends to itself and the window - 1 tokens before it
            visible = visible & (slots > positions - core.window)
        bias = ops.select(visible, ops.zeros(visible.shape, ms.float32), ops.fill(ms.float32, visible.shape, MASKED))
        scores = self.qk(q * core.scale, k).astype(ms.float32) + bias.expand_dims(1).expand_dims(1)
        return self.pv(self.softmax(scores).astype(core.dtype), v).reshape(b, kv * core.groups, 1, d)
