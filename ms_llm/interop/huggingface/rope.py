"""RoPE settings of a Hugging Face config.json, in either of its two forms, ↔ model.rope_theta / model.rope_scaling.

    transformers 4.x (hub checkpoints)   "rope_theta": 500000.0,
                                         "rope_scaling": {"rope_type": "llama3", "factor": 8.0, ...}   (or null)
    transformers 5.x (save_pretrained)   "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0,
                                                             "factor": 8.0, ...}

transformers 5.x reads both: `rope_scaling` when present, else `rope_parameters`; the base from that dict, else the
top-level `rope_theta`; "type" is the old spelling of "rope_type". We read them the same way. ms_llm implements the
plain rotation ("default") and Llama 3's "llama3" rule; any other type or key would change the model, so it is
refused naming the key, never dropped.
"""
from ms_llm.errors import UserError

DEFAULT_THETA = 10000.0
LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
NAMES = ("rope_type", "type", "rope_theta")


def read(c):
    """(rope_theta, our rope_scaling section or None) from config.json `c`."""
    key = "rope_scaling" if c.get("rope_scaling") else "rope_parameters"
    params = c.get(key) or {}
    if not isinstance(params, dict):
        raise UserError(f"config.json's {key} = {params!r} is not a mapping of RoPE settings.")
    if params and all(isinstance(v, dict) for v in params.values()):
        raise UserError(f"config.json's {key} holds one RoPE setting per layer type ({', '.join(params)}), which "
                        f"ms_llm's Llama family does not implement (one rotation for every layer). Such a model "
                        f"cannot be converted yet.")
    partial = params.get("partial_rotary_factor", c.get("partial_rotary_factor"))
    if partial not in (None, 1, 1.0):
        blocked(key if "partial_rotary_factor" in params else "", "partial_rotary_factor", partial,
                "a rotation of part of each head: ms_llm rotates whole heads")
    params = {k: v for k, v in params.items() if k != "partial_rotary_factor"}
    theta = float(params.get("rope_theta", c.get("rope_theta") or DEFAULT_THETA))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        extra = sorted(k for k in params if k not in NAMES)
        if extra:
            blocked(key, extra[0], params[extra[0]], "a RoPE setting ms_llm's plain rotation does not have")
        return theta, None
    if kind != "llama3":
        blocked(key, "rope_type", kind, f"the {kind!r} RoPE scaling: ms_llm implements the plain rotation and "
                                        f"Llama 3's 'llama3' rule only")
    extra = sorted(k for k in params if k not in NAMES + LLAMA3_KEYS)
    if extra:
        blocked(key, extra[0], params[extra[0]], "a setting the llama3 rule does not have")
    # transformers' default for a missing original context is max_position_embeddings (standardize_rope_params)
    original = params.get("original_max_position_embeddings") or c.get("max_position_embeddings")
    missing = [k for k in ("factor", "low_freq_factor", "high_freq_factor") if params.get(k) is None]
    if missing or not original:
        raise UserError(f"config.json's {key} (rope_type llama3) lacks {', '.join(missing) or 'the original context'}"
                        f": the llama3 rule needs factor, low_freq_factor, high_freq_factor and "
                        f"original_max_position_embeddings (Llama 3.1: 8.0, 1.0, 4.0, 8192).")
    return theta, {"type": "llama3", "factor": float(params["factor"]),
                   "low_freq_factor": float(params["low_freq_factor"]),
                   "high_freq_factor": float(params["high_freq_factor"]),
                   "original_max_position_embeddings": int(original)}


def blocked(section, key, value, what):
    where = f"{section}.{key}" if section else key
    raise UserError(f"config.json sets {where} = {value!r}, {what}. Converting it would silently change "
                    f"where every position rotates (the logits would differ from transformers'), so it is refused. "
                    f"To train the model without that RoPE extension, remove '{section or key}' from config.json (keep "
                    f"its rope_theta) and convert again: the result is the unextended model, exact within its "
                    f"original context for 'dynamic', different everywhere for 'linear', 'yarn' and 'longrope'.")


def write(m):
    """The transformers 4.x form (rope_theta + rope_scaling): what hub checkpoints carry, and what both 4.x and 5.x
    read (4.x ignores rope_parameters, which would drop the scaling without a word)."""
    out = {"rope_theta": m.rope_theta}
    s = m.rope_scaling
    if s is not None:
        out["rope_scaling"] = {"rope_type": s.type, "factor": s.factor, "low_freq_factor": s.low_freq_factor,
                               "high_freq_factor": s.high_freq_factor,
                               "original_max_position_embeddings": s.original_max_position_embeddings}
    return out
