"""Hugging Face GPT-2 (model_type gpt2) ↔ ms_llm's gpt2.

Conv1D weights are stored (in, out): transposed to our (out, in); c_attn is already fused QKV with q|k|v blocks of
whole heads, which is our layout; the LM head is tied to wte.
"""
import numpy as np

MODEL_TYPES = ("gpt2",)
EMBEDDING = "wte.weight"  # finds the key prefix ("", "transformer.")
DEFAULT_PREFIX = "transformer."
LAYER = {  # ours (per layer) -> (hf suffix, transpose)
    "attn_norm.weight": ("ln_1.weight", False), "attn_norm.bias": ("ln_1.bias", False),
    "attention.qkv.weight": ("attn.c_attn.weight", True), "attention.qkv.bias": ("attn.c_attn.bias", False),
    "attention.out.weight": ("attn.c_proj.weight", True), "attention.out.bias": ("attn.c_proj.bias", False),
    "mlp_norm.weight": ("ln_2.weight", False), "mlp_norm.bias": ("ln_2.bias", False),
    "mlp.up.weight": ("mlp.c_fc.weight", True), "mlp.up.bias": ("mlp.c_fc.bias", False),
    "mlp.down.weight": ("mlp.c_proj.weight", True), "mlp.down.bias": ("mlp.c_proj.bias", False),
}
TOP = {"embedding": "wte.weight", "positions": "wpe.weight", "final_norm.weight": "ln_f.weight",
       "final_norm.bias": "ln_f.bias"}


def model_section(c):
    return {"arch": "gpt2", "num_layers": c["n_layer"], "hidden_size": c["n_embd"], "num_heads": c["n_head"],
            "seq_length": c.get("n_positions", c.get("n_ctx")), "vocab_size": c["vocab_size"],
            "ffn_hidden_size": c.get("n_inner") or 4 * c["n_embd"], "norm_eps": c.get("layer_norm_epsilon", 1e-5),
            "bias": True, "tie_embeddings": True, "dropout": 0.0}


def hf_config(m):
    return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": m.num_layers,
            "n_embd": m.hidden_size, "n_head": m.num_heads, "n_positions": m.seq_length, "n_ctx": m.seq_length,
            "vocab_size": m.vocab_size, "n_inner": m.ffn_hidden_size, "layer_norm_epsilon": m.norm_eps,
            "activation_function": "gelu_new", "tie_word_embeddings": True}


def to_ours(m, prefix, take, put, used):
    """Fill our tensors through put(our name, thunk); take(hf key) reads one tensor as float32."""
    for ours, hf in TOP.items():
        put(ours, lambda hf=hf: take(prefix + hf))
    for i in range(m.num_layers):
        for ours, (hf, transpose) in LAYER.items():
            key = f"{prefix}h.{i}.{hf}"
            put(f"layers.{i}.{ours}", lambda key=key, tr=transpose: take(key).T.copy() if tr else take(key))
    used.add("lm_head.weight")  # tied: equal to wte when present


def to_hf(arrays, m, prefix, origin):
    out = {prefix + hf: arrays[ours] for ours, hf in TOP.items()}
    for i in range(m.num_layers):
        for ours, (hf, transpose) in LAYER.items():
            a = arrays[f"layers.{i}.{ours}"]
            out[f"{prefix}h.{i}.{hf}"] = np.ascontiguousarray(a.T) if transpose else a
    if origin.get("has_lm_head"):
        out["lm_head.weight"] = arrays["embedding"]
    return out
