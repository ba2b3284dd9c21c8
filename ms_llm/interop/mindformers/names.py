"""MindFormers' Llama parameter names and fused layouts ↔ ours: pure numpy, no files.

    ours                              MindFormers (model.layers.N. ...)
    embedding                         model.tok_embeddings.embedding_weight
    layers.N.attn_norm.weight         attention_norm.weight
    layers.N.attention.qkv.weight     attention.wq|wk|wv.weight, or fused attention.w_qkv.weight
    layers.N.attention.qkv.bias       attention.wq|wk|wv.bias, or fused attention.w_qkv.bias (qkv_has_bias: Qwen2.5)
    layers.N.attention.out.weight     attention.wo.weight
    layers.N.mlp_norm.weight          ffn_norm.weight
    layers.N.mlp.gate_up.weight       feed_forward.w1 (gate) | w3 (up), or fused feed_forward.w_gate_hidden.weight
    layers.N.mlp.down.weight          feed_forward.w2.weight
    final_norm.weight                 model.norm_out.weight
    lm_head                           lm_head.weight
A Linear wrapped by a MindFormers adapter or quantisation cell is saved as `<linear>._layer.weight`.

The two fused layouts, by MindFormers version (our fused rows are [q; k; v] and [gate; up]):
    concatenated  (MindFormers ≤ 1.3)  w_qkv = [q; k; v]; w_gate_hidden = [gate; up]   — ours exactly
    grouped       (MindFormers ≥ 1.4)  w_qkv rows per key/value head g: [q heads of g, k_g, v_g];
                                       w_gate_hidden rows interleaved: gate_0, up_0, gate_1, up_1, ...
(a fused q/k/v bias is grouped as its weight's rows are: research/qwen2_5/convert_weight.py applies the same
qkv_concat_hf2mg to both). Nothing in a checkpoint says which one it is, so the user names it (--fused-layout).
MindFormers' RoPE rotates halves (as Hugging Face's and ours do): q/k rows are not permuted.
"""
import re

import numpy as np
from ms_llm.config.validate import head_dim

FUSED_LAYOUTS = ("grouped", "concatenated")
LAYER = {"attn_norm.weight": "attention_norm.weight", "attention.out.weight": "attention.wo.weight",
         "mlp_norm.weight": "ffn_norm.weight", "mlp.down.weight": "feed_forward.w2.weight"}
SPLIT = {"attention.qkv.weight": ("attention.wq.weight", "attention.wk.weight", "attention.wv.weight"),
         "mlp.gate_up.weight": ("feed_forward.w1.weight", "feed_forward.w3.weight")}
FUSED = {"attention.qkv.weight": "attention.w_qkv.weight", "mlp.gate_up.weight": "feed_forward.w_gate_hidden.weight",
         "attention.qkv.bias": "attention.w_qkv.bias"}
QKV_BIAS = {"attention.qkv.bias": ("attention.wq.bias", "attention.wk.bias", "attention.wv.bias")}
TOP = {"embedding": "model.tok_embeddings.embedding_weight", "final_norm.weight": "model.norm_out.weight",
       "lm_head": "lm_head.weight"}
WRAPPED = re.compile(r"\._layer\.(weight)$")
# Training state a MindFormers checkpoint carries next to the weights; ms_llm's optimizer starts fresh.
STATE_PREFIXES = ("adam_m.", "adam_v.", "accu_grads.", "moments.", "moment1.", "moment2.", "exp_avg.", "exp_avg_sq.",
                  "global_step", "scale_sense", "epoch_num", "step_num", "loss_scale", "current_iterator_step",
                  "last_overflow_iterator_step", "learning_rate", "beta1_power", "beta2_power")


def canonical(name):
    """The name without the `._layer.` of a wrapped Linear."""
    return WRAPPED.sub(r".\1", name)


def is_training_state(name):
    return name.startswith(STATE_PREFIXES)


def dims(m):
    d = head_dim(m)
    return m.hidden_size, m.num_heads, m.num_kv_heads, d, m.ffn_hidden_size, m.vocab_size


def split(m):
    """Our fused tensors of one layer and MindFormers' separate tensors they concatenate, for model `m`."""
    return {**SPLIT, **(QKV_BIAS if m.qkv_bias else {})}


def expected_shapes(m, fused_qkv, fused_ffn):
    """{MindFormers canonical name: shape} for a model config, with or without the fused tensors."""
    c, h, kv, d, f, v = dims(m)
    shapes = {TOP["embedding"]: (v, c), TOP["final_norm.weight"]: (c,)}
    if not m.tie_embeddings:
        shapes[TOP["lm_head"]] = (v, c)
    per_layer = {"attention_norm.weight": (c,), "ffn_norm.weight": (c,), "attention.wo.weight": (c, h * d),
                 "feed_forward.w2.weight": (c, f)}
    if fused_qkv:
        per_layer["attention.w_qkv.weight"] = ((h + 2 * kv) * d, c)
        if m.qkv_bias:
            per_layer["attention.w_qkv.bias"] = ((h + 2 * kv) * d,)
    else:
        per_layer.update({"attention.wq.weight": (h * d, c), "attention.wk.weight": (kv * d, c),
                          "attention.wv.weight": (kv * d, c)})
        if m.qkv_bias:
            per_layer.update({"attention.wq.bias": (h * d,), "attention.wk.bias": (kv * d,),
                              "attention.wv.bias": (kv * d,)})
    if fused_ffn:
        per_layer["feed_forward.w_gate_hidden.weight"] = (2 * f, c)
    else:
        per_layer.update({"feed_forward.w1.weight": (f, c), "feed_forward.w3.weight": (f, c)})
    for i in range(m.num_layers):
        shapes.update({f"model.layers.{i}.{k}": s for k, s in per_layer.items()})
    return shapes


def unfuse(name, w, m, layout):
    """A fused MindFormers tensor → our fused layout ([q; k; v] or [gate; up] rows)."""
    if layout == "concatenated":
        return w
    c, h, kv, d, f, _ = dims(m)
    if name.endswith(("w_qkv.weight", "w_qkv.bias")):
        cols = w.shape[1:]  # (c,) for the weight, () for the bias
        g = w.reshape((kv, (h // kv + 2) * d) + cols)
        q, k, v = g[:, :h // kv * d], g[:, h // kv * d:(h // kv + 1) * d], g[:, (h // kv + 1) * d:]
        return np.concatenate([q.reshape((h * d,) + cols), k.reshape((kv * d,) + cols), v.reshape((kv * d,) + cols)],
                              axis=0)
    pairs = w.reshape(f, 2, c)
    return np.concatenate([pairs[:, 0], pairs[:, 1]], axis=0)


def fuse(ours_name, w, m, layout):
    """Our fused tensor → MindFormers' fused tensor in `layout` (the inverse of `unfuse`)."""
    if layout == "concatenated":
        return w
    c, h, kv, d, f, _ = dims(m)
    if ours_name.endswith(("qkv.weight", "qkv.bias")):
        cols = w.shape[1:]
        q, k, v = np.split(w, [h * d, (h + kv) * d], axis=0)
        g = np.concatenate([q.reshape((kv, h // kv * d) + cols), k.reshape((kv, d) + cols),
                            v.reshape((kv, d) + cols)], axis=1)
        return g.reshape((-1,) + cols)
    gate, up = np.split(w, 2, axis=0)
    return np.stack([gate, up], axis=1).reshape(2 * f, c)


def to_ours(mf, m, layout):
    """{MindFormers canonical name: float32 array} (already shape-checked) → {our name: float32 array}."""
    out = {ours: mf[name] for ours, name in TOP.items() if name in mf}
    for i in range(m.num_layers):
        base = f"model.layers.{i}."
        for ours, name in LAYER.items():
            out[f"layers.{i}.{ours}"] = mf[base + name]
        for ours, parts in split(m).items():
            fused = base + FUSED[ours]
            out[f"layers.{i}.{ours}"] = (np.ascontiguousarray(unfuse(fused, mf[fused], m, layout)) if fused in mf
                                         else np.concatenate([mf[base + p] for p in parts], axis=0))
    return out


def to_mindformers(arrays, m, fused_qkv, fused_ffn, layout):
    """{our name: array} → {MindFormers canonical name: array}."""
    c, h, kv, d, f, _ = dims(m)
    out = {name: arrays[ours] for ours, name in TOP.items() if ours in arrays}
    cuts = {"attention.qkv.weight": [h * d, (h + kv) * d], "attention.qkv.bias": [h * d, (h + kv) * d],
            "mlp.gate_up.weight": [f]}
    wanted = {"attention.qkv.weight": fused_qkv, "attention.qkv.bias": fused_qkv, "mlp.gate_up.weight": fused_ffn}
    for i in range(m.num_layers):
        base = f"model.layers.{i}."
        for ours, name in LAYER.items():
            out[base + name] = arrays[f"layers.{i}.{ours}"]
        for ours, parts in split(m).items():
            w = arrays[f"layers.{i}.{ours}"]
            if wanted[ours]:
                out[base + FUSED[ours]] = np.ascontiguousarray(fuse(ours, w, m, layout))
            else:
                for p, piece in zip(parts, np.split(w, cuts[ours], axis=0)):
                    out[base + p] = np.ascontiguousarray(piece)
    return out
