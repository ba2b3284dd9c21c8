"""A fixed-size key/value cache for generation: prefill once, then one token per step.

The cache of each layer is a (B, KV, S, D) tensor with S the model's context (seq_length), so every decode step
has the same shapes and compiles once; a prompt is right-padded to one of a few lengths (buckets) and prefilled
in one call. Both Cells run the model's own sub-cells (embedding, norms, `CausalSelfAttention.heads`, its core
and `output`, the MLPs), so a prefill computes what the model's forward computes.

    Prefill(model, S)(ids (B, P), last (B,))            → logits at `last` (B, V), keys, values
    DecodeStep(model, S)(token (B, 1), pos (B,), keys, values) → logits (B, V), keys, values

`keys` and `values` are tuples with one (B, KV, S, D) tensor per layer. Row b of a batch holds its tokens at
positions 0..pos[b] - 1; DecodeStep writes the new token's key and value at pos[b] and attends to 0..pos[b] (within
the sliding window where the model has one). Cache entries past a row's length hold prompt padding or nothing:
they are masked, then overwritten as the row grows. Scores, mask and softmax are float32, as in training.
"""
import mindspore as ms
from mindspore import nn, ops

from ms_llm.nn.attention import MASKED


def _embed(model, ids, positions):
    """Token embedding (+ learned positions: GPT-2) for ids (B, T) at `positions` (B, T) int32."""
    x = model.embedding_gather(model.embedding, ids, 0)
    if model.has_positions:
        x = x + model.embedding_gather(model.positions, positions, 0)
    return model.embed_dropout(x.astype(model.dtype))


def _mlp(layer, x):
    out = layer.mlp(layer.mlp_norm(x))
    return out[0] if layer.routed else out  # a mixture of experts also returns its router loss and statistics


def _last_rows(x, last):
    """x (B, T, H) → (B, 1, H): row b's position last[b] (a one-hot matmul: exact, and one op on every backend)."""
    pick = ops.one_hot(last, x.shape[1], ops.ones((), x.dtype), ops.zeros((), x.dtype))  # (B, T)
    return ops.BatchMatMul()(pick.expand_dims(1), x)


class Prefill(nn.Cell):
    """The prompt's forward: the logits at each row's last real token and every layer's keys and values, padded
    to the cache length."""

    def __init__(self, model, cache_length):
        super().__init__(auto_prefix=False)
        self.model, self.cache_length = model, cache_length

    def construct(self, ids, last):
        m = self.model
        b, t = ids.shape
        if m.has_positions:  # the same slice of the table the model's forward adds
            x = m.embed_dropout((m.embedding_gather(m.embedding, ids, 0) + m.positions[:t]).astype(m.dtype))
        else:
            x = m.embed_dropout(m.embedding_gather(m.embedding, ids, 0).astype(m.dtype))
        keys, values = (), ()
        for layer in m.layers:
            attn = layer.attention
            q, k, v = attn.heads(layer.attn_norm(x))
            x = x + attn.output(attn.core(q, k, v))
            x = x + _mlp(layer, x)
            keys = keys + (self.padded(k),)
            values = values + (self.padded(v),)
        logits = m.logits(_last_rows(m.final_norm(x), last))
        return logits.reshape(b, -1), keys, values

    def padded(self, x):
        b, kv, t, d = x.shape
        if t == self.cache_length:
            return x
        return ops.concat((x, ops.zeros((b, kv, self.cache_length - t, d), x.dtype)), 2)


class DecodeStep(nn.Cell):
    """One new token per row against the cache: its key and value written at `pos`, attention over 0..pos."""

    def __init__(self, model, cache_length):
        super().__init__(auto_prefix=False)
        self.model, self.cache_length = model, cache_length
        self.qk = ops.BatchMatMul(transpose_b=True)
        self.pv = ops.BatchMatMul()
        self.softmax = ops.Softmax(-1)

    def construct(self, token, pos, keys, values):
        m = self.model
        b = token.shape[0]
        positions = pos.reshape(b, 1)
        x = _embed(m, token, positions)
        slots = ops.arange(self.cache_length, dtype=ms.int32).reshape(1, -1)  # (1, S)
        here = (slots == positions).reshape(b, 1, self.cache_length, 1)  # where the new key goes
        new_keys, new_values = (), ()
        for i, layer in enumerate(m.layers):
            attn = layer.attention
            q, k, v = attn.heads(layer.attn_norm(x), positions)
            kc = ops.select(ops.broadcast_to(here, keys[i].shape), ops.broadcast_to(k, keys[i].shape), keys[i])
            vc = ops.select(ops.broadcast_to(here, values[i].shape), ops.broadcast_to(v, values[i].shape), values[i])
            x = x + attn.output(self.attend(attn.core, q, kc, vc, slots, positions))
            x = x + _mlp(layer, x)
            new_keys = new_keys + (kc,)
            new_values = new_values + (vc,)
        logits = m.logits(m.final_norm(x))
        return logits.reshape(b, -1), new_keys, new_values

    def attend(self, core, q, k, v, slots, positions):
        """softmax(q kᵀ·scale + mask) v for one query per row, with the core's scale, grouping and window."""
        if core.groups > 1:  # grouped-query attention: each key/value head serves `groups` query heads
            b, kv, s, d = k.shape
            k = ops.broadcast_to(k.reshape(b, kv, 1, s, d), (b, kv, core.groups, s, d)).reshape(b, -1, s, d)
            v = ops.broadcast_to(v.reshape(b, kv, 1, s, d), (b, kv, core.groups, s, d)).reshape(b, -1, s, d)
        visible = slots <= positions  # (B, S): keys 0..pos
        if core.window is not None:  # the query attends to itself and the window - 1 tokens before it
            visible = visible & (slots > positions - core.window)
        bias = ops.select(visible, ops.zeros(visible.shape, ms.float32), ops.fill(ms.float32, visible.shape, MASKED))
        scores = self.qk(q * core.scale, k).astype(ms.float32) + bias.expand_dims(1).expand_dims(1)
        return self.pv(self.softmax(scores).astype(core.dtype), v)
