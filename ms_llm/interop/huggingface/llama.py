"""Hugging Face Llama and its relatives (model_type llama, mistral, qwen2, qwen3) ↔ ms_llm's llama.

All four are the same decoder layer; what differs is a few options, each one of our `model.` keys:

    model_type  config.json                                     ms_llm
    llama       rope_scaling / rope_parameters (llama3)         rope_scaling; head_dim
    mistral     sliding_window (every layer; 4096 when absent)  sliding_window; head_dim
    qwen2       q/k/v biases (always); use_sliding_window,      qkv_bias: true; sliding_window
                max_window_layers, layer_types
    qwen3       q_norm/k_norm (always); head_dim (128 when      qk_norm: true; head_dim; sliding_window
                absent); use_sliding_window, layer_types

Tensors: q_proj|k_proj|v_proj (and their biases) are concatenated into our fused qkv, gate_proj|up_proj into
gate_up; HF's rotate-half RoPE is the convention our RotaryEmbedding uses, so no permutation. Keys a family's
transformers class would read and we cannot express (attention_bias on o_proj, mlp_bias, another activation, a
window on some layers only, RoPE scaling other than llama3) are refused naming the key, never dropped. Defaults for
absent keys are those of the transformers config class (DEFAULTS).
"""
import numpy as np

from ms_llm.errors import UserError
from ms_llm.interop.huggingface import rope
from ms_llm.config.validate import head_dim

ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM"}
MODEL_TYPES = tuple(ARCHITECTURES)
# transformers' defaults for the keys read here, where a config.json leaves them out (configuration_<type>.py)
DEFAULTS = {
    "llama": {"max_position_embeddings": 2048, "rms_norm_eps": 1e-6},
    "mistral": {"max_position_embeddings": 4096 * 32, "rms_norm_eps": 1e-6, "sliding_window": 4096},
    "qwen2": {"max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "use_sliding_window": False,
              "sliding_window": 4096, "max_window_layers": 28},
    "qwen3": {"max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "use_sliding_window": False,
              "sliding_window": 4096, "max_window_layers": 28, "head_dim": 128},
}
# Converted configs train at most this many tokens per sample by default: RoPE tables and the mask are built for
# seq_length, and max_position_embeddings (128k for Llama 3.1) is a capacity, not a training length.
SEQ_LENGTH_CAP = 4096
EMBEDDING = "embed_tokens.weight"  # finds the key prefix ("", "model.")
DEFAULT_PREFIX = "model."
LAYER = {"attn_norm.weight": "input_layernorm.weight", "attention.out.weight": "self_attn.o_proj.weight",
         "mlp_norm.weight": "post_attention_layernorm.weight", "mlp.down.weight": "mlp.down_proj.weight"}
FUSED = {"attention.qkv.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
         "mlp.gate_up.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight")}
QKV_BIAS = {"attention.qkv.bias": ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias")}
QK_NORM = {"attention.q_norm.weight": "self_attn.q_norm.weight", "attention.k_norm.weight": "self_attn.k_norm.weight"}
TOP = {"embedding": "embed_tokens.weight", "final_norm.weight": "norm.weight"}


# --- config.json -> model section -------------------------------------------------------------------------

def model_section(c):
    kind = c["model_type"]
    get = lambda key: c[key] if key in c else DEFAULTS[kind].get(key)  # noqa: E731  (null is a value: no window)
    refuse_unsupported(c, kind)
    heads, hidden = c["num_attention_heads"], c["hidden_size"]
    head_dim = get("head_dim")
    theta, scaling = rope.read(c)
    max_positions = get("max_position_embeddings")
    section = {"arch": "llama", "num_layers": c["num_hidden_layers"], "hidden_size": hidden, "num_heads": heads,
               "num_kv_heads": c.get("num_key_value_heads") or heads, "ffn_hidden_size": c["intermediate_size"],
               "seq_length": min(max_positions, SEQ_LENGTH_CAP), "vocab_size": c["vocab_size"],
               "norm_eps": get("rms_norm_eps"), "rope_theta": theta, "bias": False,
               "tie_embeddings": bool(c.get("tie_word_embeddings", False)), "dropout": 0.0}
    if head_dim and head_dim != hidden // heads:
        section["head_dim"] = head_dim
    if scaling:
        section["rope_scaling"] = scaling
    if kind == "qwen2":
        section["qkv_bias"] = True
    if kind == "qwen3":
        section["qk_norm"] = True
    window = sliding_window(c, kind, get)
    if window:
        section["sliding_window"] = window
    return section


def refuse_unsupported(c, kind):
    """Keys whose value the family's transformers class would honour and our layer cannot express."""
    blocking = []
    if c.get("attention_bias") and kind in ("llama", "qwen3", "mistral"):
        blocking.append(("attention_bias", True, "biases on q, k, v and o_proj; ms_llm's model.qkv_bias puts them on "
                                                 "q, k and v only (Qwen2.5's layout)"))
    if c.get("mlp_bias"):
        blocking.append(("mlp_bias", True, "biases in the MLP, which ms_llm's SwiGLU does not have"))
    if c.get("hidden_act", "silu") != "silu":
        blocking.append(("hidden_act", c["hidden_act"], "an MLP activation other than SwiGLU's silu"))
    if blocking:
        key, value, what = blocking[0]
        raise UserError(f"config.json ({kind}) sets {key} = {value!r}: {what}. Converting would silently change "
                        f"the model, so it is refused; such a checkpoint cannot be converted yet.")


def sliding_window(c, kind, get):
    """The window every layer uses, or None. Mistral windows every layer when sliding_window is set; Qwen2/3 only
    with use_sliding_window, and then only layers >= max_window_layers (or as layer_types lists them)."""
    if kind == "mistral":
        return get("sliding_window")
    if kind not in ("qwen2", "qwen3"):
        return None
    window = get("sliding_window") if get("use_sliding_window") else None
    if not window:  # transformers' Qwen2/3 config: no window unless use_sliding_window, whatever layer_types says
        return None
    types = c.get("layer_types") or ["sliding_attention" if i >= get("max_window_layers") else "full_attention"
                                     for i in range(c["num_hidden_layers"])]
    sliding = [i for i, t in enumerate(types) if t == "sliding_attention"]
    other = sorted({t for t in types if t not in ("sliding_attention", "full_attention")})
    if other:
        raise UserError(f"config.json's layer_types has {', '.join(other)}: ms_llm's Llama family has full and "
                        f"sliding-window attention only.")
    if not sliding:
        return None
    if len(sliding) < len(types):
        source = "layer_types" if c.get("layer_types") else f"max_window_layers = {get('max_window_layers')}"
        raise UserError(f"config.json ({kind}) sets use_sliding_window = true and gives {len(sliding)} of "
                        f"{len(types)} layers a sliding window of {window} tokens (from {source}); ms_llm's "
                        f"model.sliding_window applies to every layer, so this model cannot be expressed and is "
                        f"refused. Qwen's released configs set use_sliding_window: false; if you will train at "
                        f"seq_length <= {window}, the window never takes effect and setting use_sliding_window to "
                        f"false in config.json converts the same model.")
    return window


# --- model section -> config.json -------------------------------------------------------------------------

def model_type_of(m):
    """The Hugging Face family whose transformers class computes exactly our model `m`."""
    if m.qk_norm and m.qkv_bias:
        raise UserError("model.qk_norm and model.qkv_bias together have no Hugging Face family (Qwen3's "
                        "attention_bias would also put a bias on o_proj): the model cannot be written as a "
                        "transformers checkpoint.")
    if m.qk_norm:
        return "qwen3"
    if m.qkv_bias:
        if head_dim(m) != m.hidden_size // m.num_heads:
            raise UserError(f"model.qkv_bias with model.head_dim = {m.head_dim} (not hidden_size / num_heads): "
                            f"transformers' Qwen2 before 5.0 ignores head_dim, so the checkpoint would load as a "
                            f"different model there; it is not written.")
        return "qwen2"
    return "mistral" if m.sliding_window else "llama"


def hf_config(m):
    kind = model_type_of(m)
    d = head_dim(m)
    out = {"model_type": kind, "architectures": [ARCHITECTURES[kind]], "num_hidden_layers": m.num_layers,
           "hidden_size": m.hidden_size, "num_attention_heads": m.num_heads, "num_key_value_heads": m.num_kv_heads,
           "head_dim": d, "intermediate_size": m.ffn_hidden_size, "max_position_embeddings": m.seq_length,
           "vocab_size": m.vocab_size, "rms_norm_eps": m.norm_eps, **rope.write(m), "hidden_act": "silu",
           "tie_word_embeddings": m.tie_embeddings}
    if kind in ("llama", "qwen3"):
        out["attention_bias"] = False
    if kind == "llama":
        out["mlp_bias"] = False
    if kind == "mistral":
        out["sliding_window"] = m.sliding_window
    if kind in ("qwen2", "qwen3"):  # every layer windowed, or none
        out.update({"use_sliding_window": bool(m.sliding_window), "sliding_window": m.sliding_window,
                    "max_window_layers": 0 if m.sliding_window else m.num_layers})
    return out


# --- tensors ----------------------------------------------------------------------------------------------

def fused(m):
    """Our fused tensors of one layer and the Hugging Face tensors they concatenate, for model `m`."""
    return {**FUSED, **(QKV_BIAS if m.qkv_bias else {})}


def layer_names(m):
    return {**LAYER, **(QK_NORM if m.qk_norm else {})}


def to_ours(m, prefix, take, put, used):
    """Fill our tensors through put(our name, thunk); take(hf key) reads one tensor as float32."""
    for ours, hf in TOP.items():
        put(ours, lambda hf=hf: take(prefix + hf))
    if not m.tie_embeddings:
        put("lm_head", lambda: take("lm_head.weight"))
    else:
        used.add("lm_head.weight")
    for i in range(m.num_layers):
        base = f"{prefix}layers.{i}."
        for ours, hf in layer_names(m).items():
            put(f"layers.{i}.{ours}", lambda key=base + hf: take(key))
        for ours, parts in fused(m).items():
            put(f"layers.{i}.{ours}", lambda ps=parts, b=base: np.concatenate([take(b + p) for p in ps], axis=0))


def to_hf(arrays, m, prefix, origin):
    out = {prefix + hf: arrays[ours] for ours, hf in TOP.items()}
    if not m.tie_embeddings:
        out["lm_head.weight"] = arrays["lm_head"]
    elif origin.get("has_lm_head"):
        out["lm_head.weight"] = arrays["embedding"]
    d = head_dim(m)
    qkv_cuts = [m.num_heads * d, (m.num_heads + m.num_kv_heads) * d]
    cuts = {"attention.qkv.weight": qkv_cuts, "attention.qkv.bias": qkv_cuts, "mlp.gate_up.weight": [m.ffn_hidden_size]}
    for i in range(m.num_layers):
        base = f"{prefix}layers.{i}."
        for ours, hf in layer_names(m).items():
            out[base + hf] = arrays[f"layers.{i}.{ours}"]
        for ours, parts in fused(m).items():
            for p, piece in zip(parts, np.split(arrays[f"layers.{i}.{ours}"], cuts[ours], axis=0)):
                out[base + p] = piece.copy()
    return out
