"""Hugging Face GPT-2 / Llama checkpoints (safetensors + config.json) ↔ ms_llm checkpoints + config.

    ms-llm convert --from-hf DIR --output OUT        OUT/model.ckpt, OUT/config.yaml, OUT/hf_origin.json
    ms-llm convert --to-hf OUT/model.ckpt --config OUT/config.yaml --output HF_DIR

Name and layout differences handled here:
  GPT-2   Conv1D weights are stored (in, out): transposed to our (out, in); c_attn is already fused QKV
          with q|k|v blocks of whole heads, which is our layout; the LM head is tied to wte.
  Llama   q_proj|k_proj|v_proj are concatenated into our fused qkv, gate_proj|up_proj into gate_up;
          HF's rotate-half RoPE is the convention our RotaryEmbedding uses, so no permutation.
Weights become float32 masters; `hf_origin.json` remembers the original key prefix, dtypes and whether
an lm_head tensor was present, so converting back reproduces the original tensors bit for bit.
"""
import json
import os

import numpy as np

from ms_llm.checkpoint import safetensors_io
from ms_llm.errors import UserError

GPT2_LAYER = {  # ours (per layer) -> (hf suffix, transpose)
    "attn_norm.weight": ("ln_1.weight", False), "attn_norm.bias": ("ln_1.bias", False),
    "attention.qkv.weight": ("attn.c_attn.weight", True), "attention.qkv.bias": ("attn.c_attn.bias", False),
    "attention.out.weight": ("attn.c_proj.weight", True), "attention.out.bias": ("attn.c_proj.bias", False),
    "mlp_norm.weight": ("ln_2.weight", False), "mlp_norm.bias": ("ln_2.bias", False),
    "mlp.up.weight": ("mlp.c_fc.weight", True), "mlp.up.bias": ("mlp.c_fc.bias", False),
    "mlp.down.weight": ("mlp.c_proj.weight", True), "mlp.down.bias": ("mlp.c_proj.bias", False),
}
GPT2_TOP = {"embedding": "wte.weight", "positions": "wpe.weight", "final_norm.weight": "ln_f.weight",
            "final_norm.bias": "ln_f.bias"}
LLAMA_LAYER = {"attn_norm.weight": "input_layernorm.weight", "attention.out.weight": "self_attn.o_proj.weight",
               "mlp_norm.weight": "post_attention_layernorm.weight", "mlp.down.weight": "mlp.down_proj.weight"}
LLAMA_FUSED = {"attention.qkv.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                        "self_attn.v_proj.weight"),
               "mlp.gate_up.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight")}
LLAMA_TOP = {"embedding": "embed_tokens.weight", "final_norm.weight": "norm.weight"}


# --- reading and writing Hugging Face folders ------------------------------------------------------------

def read_hf_config(path):
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        raise UserError(f"'{path}' has no config.json: give a Hugging Face model folder (config.json + "
                        f"*.safetensors).")
    try:
        with open(cfg_path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"'{cfg_path}' cannot be read as JSON ({e}).") from None


def read_hf_tensors(path):
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise UserError(f"'{path}' holds no .safetensors weights (PyTorch .bin files are not read: convert them to "
                        f"safetensors with the transformers library first).")
    tensors, dtypes = {}, {}
    for f in files:
        t, d, _ = safetensors_io.load(os.path.join(path, f))
        tensors.update(t)
        dtypes.update(d)
    return tensors, dtypes


def model_section(hf_cfg):
    """Our `model:` config section from a Hugging Face config.json."""
    kind = hf_cfg.get("model_type")
    if kind == "gpt2":
        return {"arch": "gpt2", "num_layers": hf_cfg["n_layer"], "hidden_size": hf_cfg["n_embd"],
                "num_heads": hf_cfg["n_head"], "seq_length": hf_cfg.get("n_positions", hf_cfg.get("n_ctx")),
                "vocab_size": hf_cfg["vocab_size"], "ffn_hidden_size": hf_cfg.get("n_inner") or 4 * hf_cfg["n_embd"],
                "norm_eps": hf_cfg.get("layer_norm_epsilon", 1e-5), "bias": True, "tie_embeddings": True,
                "dropout": 0.0}
    if kind == "llama":
        unsupported = [k for k in ("rope_scaling", "attention_bias", "mlp_bias") if hf_cfg.get(k)]
        if unsupported:
            raise UserError(f"config.json sets {', '.join(unsupported)}, which ms_llm's Llama does not implement; "
                            f"converting would silently change the model.")
        heads = hf_cfg["num_attention_heads"]
        return {"arch": "llama", "num_layers": hf_cfg["num_hidden_layers"], "hidden_size": hf_cfg["hidden_size"],
                "num_heads": heads, "num_kv_heads": hf_cfg.get("num_key_value_heads") or heads,
                "ffn_hidden_size": hf_cfg["intermediate_size"], "seq_length": hf_cfg.get("max_position_embeddings", 4096),
                "vocab_size": hf_cfg["vocab_size"], "norm_eps": hf_cfg.get("rms_norm_eps", 1e-6),
                "rope_theta": float(hf_cfg.get("rope_theta", 10000.0)), "bias": False,
                "tie_embeddings": bool(hf_cfg.get("tie_word_embeddings", False)), "dropout": 0.0}
    raise UserError(f"config.json has model_type {kind!r}: only 'gpt2' and 'llama' checkpoints are converted.")


def hf_config(m):
    if m.arch == "gpt2":
        return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": m.num_layers,
                "n_embd": m.hidden_size, "n_head": m.num_heads, "n_positions": m.seq_length, "n_ctx": m.seq_length,
                "vocab_size": m.vocab_size, "n_inner": m.ffn_hidden_size, "layer_norm_epsilon": m.norm_eps,
                "activation_function": "gelu_new", "tie_word_embeddings": True}
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": m.num_layers,
            "hidden_size": m.hidden_size, "num_attention_heads": m.num_heads, "num_key_value_heads": m.num_kv_heads,
            "intermediate_size": m.ffn_hidden_size, "max_position_embeddings": m.seq_length,
            "vocab_size": m.vocab_size, "rms_norm_eps": m.norm_eps, "rope_theta": m.rope_theta,
            "hidden_act": "silu", "tie_word_embeddings": m.tie_embeddings}


# --- the name/layout maps ---------------------------------------------------------------------------------

def detect_prefix(tensors, arch):
    probe = "wte.weight" if arch == "gpt2" else "embed_tokens.weight"
    for p in ("", "transformer.", "model."):
        if p + probe in tensors:
            return p
    raise UserError(f"cannot find '{probe}' (with or without a 'transformer.'/'model.' prefix) in the checkpoint: "
                    f"not a {arch} checkpoint in Hugging Face layout.")


def hf_to_ours(tensors, m, prefix):
    """{our name: float32 array}; raises with the list of missing / unexpected / mis-shaped tensors."""
    out, used = {}, set()

    def take(key):
        used.add(key)
        if key not in tensors:
            raise KeyError(key)
        return np.asarray(tensors[key], dtype=np.float32)

    missing = []
    try_ = lambda name, fn: _try(out, name, fn, missing)  # noqa: E731
    if m.arch == "gpt2":
        for ours, hf in GPT2_TOP.items():
            try_(ours, lambda hf=hf: take(prefix + hf))
        for i in range(m.num_layers):
            for ours, (hf, transpose) in GPT2_LAYER.items():
                key = f"{prefix}h.{i}.{hf}"
                try_(f"layers.{i}.{ours}", lambda key=key, tr=transpose: take(key).T.copy() if tr else take(key))
        used.add("lm_head.weight")  # tied: equal to wte when present
    else:
        for ours, hf in LLAMA_TOP.items():
            try_(ours, lambda hf=hf: take(prefix + hf))
        if not m.tie_embeddings:
            try_("lm_head", lambda: take("lm_head.weight"))
        else:
            used.add("lm_head.weight")
        for i in range(m.num_layers):
            base = f"{prefix}layers.{i}."
            for ours, hf in LLAMA_LAYER.items():
                try_(f"layers.{i}.{ours}", lambda key=base + hf: take(key))
            for ours, parts in LLAMA_FUSED.items():
                try_(f"layers.{i}.{ours}", lambda ps=parts: np.concatenate([take(base + p) for p in ps], axis=0))
    ignored = {k for k in tensors if k.endswith((".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq"))}
    unexpected = sorted(set(tensors) - used - ignored)
    if missing or unexpected:
        raise UserError("the Hugging Face checkpoint does not match its config.json: "
                        + (f"missing {', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''}; " if missing else "")
                        + (f"unexpected {', '.join(unexpected[:10])}{' ...' if len(unexpected) > 10 else ''}"
                           if unexpected else "") + ".")
    return out


def _try(out, name, fn, missing):
    try:
        out[name] = fn()
    except KeyError as e:
        missing.append(str(e.args[0]))


def ours_to_hf(arrays, m, origin):
    """Inverse of hf_to_ours, using the key prefix and tensor set recorded in `origin`."""
    prefix = origin.get("prefix", "transformer." if m.arch == "gpt2" else "model.")
    out = {}
    if m.arch == "gpt2":
        for ours, hf in GPT2_TOP.items():
            out[prefix + hf] = arrays[ours]
        for i in range(m.num_layers):
            for ours, (hf, transpose) in GPT2_LAYER.items():
                a = arrays[f"layers.{i}.{ours}"]
                out[f"{prefix}h.{i}.{hf}"] = a.T.copy() if transpose else a
        if origin.get("has_lm_head"):
            out["lm_head.weight"] = arrays["embedding"]
    else:
        for ours, hf in LLAMA_TOP.items():
            out[prefix + hf] = arrays[ours]
        if not m.tie_embeddings:
            out["lm_head.weight"] = arrays["lm_head"]
        elif origin.get("has_lm_head"):
            out["lm_head.weight"] = arrays["embedding"]
        d = m.hidden_size // m.num_heads
        splits = {"attention.qkv.weight": [m.num_heads * d, (m.num_heads + m.num_kv_heads) * d],
                  "mlp.gate_up.weight": [m.ffn_hidden_size]}
        for i in range(m.num_layers):
            base = f"{prefix}layers.{i}."
            for ours, hf in LLAMA_LAYER.items():
                out[base + hf] = arrays[f"layers.{i}.{ours}"]
            for ours, parts in LLAMA_FUSED.items():
                for p, piece in zip(parts, np.split(arrays[f"layers.{i}.{ours}"], splits[ours], axis=0)):
                    out[base + p] = piece.copy()
    return out


# --- the two directions -----------------------------------------------------------------------------------

def from_hf(hf_dir, out_dir, fmt="ckpt", log=print):
    from ms_llm.checkpoint import store
    from ms_llm.config import from_dict, save_config
    from ms_llm.config.validate import validate_config

    hf_cfg = read_hf_config(hf_dir)
    section = model_section(hf_cfg)  # refuses unsupported models before reading gigabytes of weights
    tensors, dtypes = read_hf_tensors(hf_dir)
    cfg = validate_config(from_dict({"model": section, "train": {"seed": 0}}))
    prefix = detect_prefix(tensors, cfg.model.arch)
    ours = hf_to_ours(tensors, cfg.model, prefix)
    check_shapes(cfg, ours)
    if os.path.exists(os.path.join(out_dir, "config.yaml")):
        raise UserError(f"'{out_dir}' already holds a converted model (config.yaml). Choose another --output.")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "model" + store.EXTENSIONS[fmt])
    store.write_tensors(path, ours, fmt)
    save_config(cfg, os.path.join(out_dir, "config.yaml"))
    origin = {"prefix": prefix, "has_lm_head": "lm_head.weight" in tensors, "dtypes": dtypes, "hf_config": hf_cfg}
    with open(os.path.join(out_dir, "hf_origin.json"), "w", encoding="utf-8") as f:
        json.dump(origin, f, indent=1)
    n = sum(a.size for a in ours.values())
    log(f"converted {cfg.model.arch} ({n:,} parameters, {len(tensors)} Hugging Face tensors) → {path} + config.yaml")
    return path


def check_shapes(cfg, ours):
    """Every converted tensor against the shape the config implies; all offenders listed at once."""
    from mindspore.nn.utils import no_init_parameters

    from model_zoo import build_model

    with no_init_parameters():  # shapes only, no memory
        shapes = {n: tuple(p.shape) for n, p in build_model(cfg.model).parameters_and_names()}
    bad = [f"{n}: checkpoint {tuple(a.shape)}, config {shapes.get(n)}" for n, a in ours.items()
           if shapes.get(n) != tuple(a.shape)]
    if bad:
        raise UserError("tensor shapes do not match config.json: " + "; ".join(bad[:10])
                        + (" ..." if len(bad) > 10 else "") + ".")


def to_hf(checkpoint, config_path, out_dir, log=print):
    from ms_llm.checkpoint import store
    from ms_llm.config import load_config

    cfg = load_config(config_path)
    arrays = store.read_tensors(checkpoint)
    origin_path = os.path.join(os.path.dirname(os.path.abspath(checkpoint)), "hf_origin.json")
    origin = {}
    if os.path.isfile(origin_path):
        with open(origin_path, encoding="utf-8") as f:
            origin = json.load(f)
    hf = ours_to_hf(arrays, cfg.model, origin)
    os.makedirs(out_dir, exist_ok=True)
    dtypes = {k: origin.get("dtypes", {}).get(k, "F32") for k in hf}
    safetensors_io.save(os.path.join(out_dir, "model.safetensors"), hf, dtypes, {"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(origin.get("hf_config") or hf_config(cfg.model), f, indent=1)
    log(f"wrote {len(hf)} tensors → {os.path.join(out_dir, 'model.safetensors')} + config.json")
    return out_dir
