"""Hugging Face mixtures of experts (model_type mixtral, qwen3_moe) ↔ ms_llm's llama with model.moe (docs/moe.md).

Both are the Llama layer (llama.py converts their attention and norms) with the MLP replaced by a router and E SwiGLU
experts; Qwen3-MoE adds Qwen3's q/k RMSNorm and may keep dense MLPs in some layers:

    config.json                                        ms_llm
    num_local_experts (Mixtral; Qwen3-MoE as written   model.moe.num_experts
      by transformers 5) / num_experts (Qwen3-MoE 4.x)
    num_experts_per_tok                                model.moe.top_k
    intermediate_size (Mixtral: the experts' width)    model.ffn_hidden_size
    moe_intermediate_size (Qwen3-MoE)                  model.moe.ffn_hidden_size (intermediate_size: its dense MLPs)
    mlp_only_layers, decoder_sparse_step (Qwen3-MoE)   model.moe.layers
    norm_topk_prob (Qwen3-MoE; Mixtral always)         model.moe.normalize_top_k
    router_aux_loss_coef                               model.moe.aux_loss_coef = router_aux_loss_coef × top_k
                                                       (transformers' load-balancing loss is top_k times ours)
    router_jitter_noise (Mixtral, training only)       not implemented: noted, the weights convert as they are

Tensors. transformers 5 holds each layer's experts fused in memory (mlp.experts.gate_up_proj (E, 2F, h) = [gate; up],
mlp.experts.down_proj (E, h, F), router mlp.gate.weight) but its save_pretrained writes the per-expert layout of
4.x hub checkpoints, which is what we write too:

    Mixtral     block_sparse_moe.gate.weight, block_sparse_moe.experts.{j}.w1|w3|w2.weight (gate, up, down)
    Qwen3-MoE   mlp.gate.weight, mlp.experts.{j}.gate_proj|up_proj|down_proj.weight

Both layouts are read (a file in the fused layout is written back fused). Our layer holds
layers.{i}.mlp.router.weight (E, h), layers.{i}.mlp.experts.gate_up (E, 2F, h) and layers.{i}.mlp.experts.down
(E, h, F): transformers 5's fused layout, so the per-expert tensors are concatenated and stacked, nothing transposed.
"""
import numpy as np

from ms_llm.errors import UserError
from ms_llm.interop.huggingface import llama, rope
from ms_llm.config.validate import head_dim

ARCHITECTURES = {"mixtral": "MixtralForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}
MODEL_TYPES = tuple(ARCHITECTURES)
DEFAULTS = {  # transformers' defaults for the keys read here (configuration_mixtral.py, configuration_qwen3_moe.py)
    "mixtral": {"max_position_embeddings": 4096 * 32, "rms_norm_eps": 1e-5, "rope_theta": 1e6, "num_local_experts": 8,
                "num_experts_per_tok": 2, "router_aux_loss_coef": 0.001, "sliding_window": None},
    "qwen3_moe": {"max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
                  "num_local_experts": 128, "num_experts_per_tok": 8, "router_aux_loss_coef": 0.001,
                  "moe_intermediate_size": 768, "norm_topk_prob": False, "decoder_sparse_step": 1,
                  "use_sliding_window": False, "sliding_window": 4096},
}
EMBEDDING = llama.EMBEDDING
DEFAULT_PREFIX = llama.DEFAULT_PREFIX
# per-expert tensor names (4.x hub and transformers 5's save_pretrained): (gate, up, down)
EXPERT = {"mixtral": ("block_sparse_moe.experts.{j}.w1.weight", "block_sparse_moe.experts.{j}.w3.weight",
                      "block_sparse_moe.experts.{j}.w2.weight"),
          "qwen3_moe": ("mlp.experts.{j}.gate_proj.weight", "mlp.experts.{j}.up_proj.weight",
                        "mlp.experts.{j}.down_proj.weight")}
ROUTER = {"mixtral": "block_sparse_moe.gate.weight", "qwen3_moe": "mlp.gate.weight"}
FUSED_EXPERTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")  # transformers 5 in memory
FUSED_ROUTER = "mlp.gate.weight"


def get(c, key):
    kind = c["model_type"]
    if key == "num_local_experts":  # Qwen3-MoE: num_experts in 4.x files, num_local_experts as 5.x writes it
        return c.get("num_local_experts", c.get("num_experts", DEFAULTS[kind][key]))
    return c[key] if key in c else DEFAULTS[kind].get(key)


# --- config.json -> model section -------------------------------------------------------------------------

def model_section(c):
    kind = c["model_type"]
    llama.refuse_unsupported(c, "qwen3" if kind == "qwen3_moe" else "llama")
    if "rope_theta" not in c and not c.get("rope_parameters") and not c.get("rope_scaling"):
        c = dict(c, rope_theta=DEFAULTS[kind]["rope_theta"])  # the family's own default base, not rope.py's
    theta, scaling = rope.read(c)
    heads, hidden, layers = c["num_attention_heads"], c["hidden_size"], c["num_hidden_layers"]
    experts, top_k = get(c, "num_local_experts"), get(c, "num_experts_per_tok")
    if not experts or experts < 1:
        raise UserError(f"config.json ({kind}) has num_experts = {experts}: a model without experts. Convert it as "
                        f"model_type {'qwen3' if kind == 'qwen3_moe' else 'mistral'} instead.")
    section = {"arch": "llama", "num_layers": layers, "hidden_size": hidden, "num_heads": heads,
               "num_kv_heads": c.get("num_key_value_heads") or heads, "ffn_hidden_size": c["intermediate_size"],
               "seq_length": min(get(c, "max_position_embeddings"), llama.SEQ_LENGTH_CAP),
               "vocab_size": c["vocab_size"], "norm_eps": get(c, "rms_norm_eps"), "rope_theta": theta, "bias": False,
               "tie_embeddings": bool(c.get("tie_word_embeddings", False)), "dropout": 0.0}
    head_dim = c.get("head_dim")
    if head_dim and head_dim != hidden // heads:
        section["head_dim"] = head_dim
    if scaling:
        section["rope_scaling"] = scaling
    moe = {"num_experts": experts, "top_k": top_k,
           "aux_loss_coef": float(get(c, "router_aux_loss_coef")) * top_k}
    if kind == "qwen3_moe":
        section["qk_norm"] = True
        moe["ffn_hidden_size"] = get(c, "moe_intermediate_size")
        moe["normalize_top_k"] = bool(get(c, "norm_topk_prob"))
        routed = qwen3_moe_layers(c, layers)
        if len(routed) < layers:
            moe["layers"] = routed
        window = get(c, "sliding_window") if get(c, "use_sliding_window") else None
    else:
        window = get(c, "sliding_window")
    if window:
        section["sliding_window"] = window
    section["moe"] = moe
    return section


def qwen3_moe_layers(c, layers):
    """transformers' rule: layer i is sparse unless listed in mlp_only_layers, when (i + 1) % decoder_sparse_step == 0."""
    only = set(c.get("mlp_only_layers") or [])
    step = get(c, "decoder_sparse_step")
    routed = [i for i in range(layers) if i not in only and (i + 1) % step == 0]
    if not routed:
        raise UserError(f"config.json (qwen3_moe) makes no layer sparse (mlp_only_layers = {sorted(only)}, "
                        f"decoder_sparse_step = {step}): it is a dense Qwen3; convert it as model_type qwen3.")
    return routed


def notes(c):
    """What the conversion cannot carry over, said once when converting."""
    out = [f"model.moe.aux_loss_coef = router_aux_loss_coef {get(c, 'router_aux_loss_coef')} × top_k "
           f"{get(c, 'num_experts_per_tok')}: transformers' load-balancing loss is top_k times ms_llm's, so training "
           f"pulls the router as hard as transformers would (with output_router_logits on)"]
    if c.get("router_jitter_noise"):
        out.append(f"router_jitter_noise = {c['router_jitter_noise']} (Mixtral's multiplicative noise on the router "
                   f"input while training) is not implemented in ms_llm: the weights convert as they are, training "
                   f"here runs without the noise")
    return out


# --- model section -> config.json -------------------------------------------------------------------------

def model_type_of(m):
    moe = m.moe
    if m.qkv_bias:
        raise UserError("model.qkv_bias with model.moe: neither Mixtral nor Qwen3-MoE has q/k/v biases, so the model "
                        "cannot be written as a transformers checkpoint.")
    if moe.shared_expert_size:
        raise UserError(f"model.moe.shared_expert_size = {moe.shared_expert_size}: Mixtral and Qwen3-MoE have no "
                        f"shared expert (Qwen2-MoE and DeepSeek do, and are not converted yet), so the model cannot be "
                        f"written as a transformers checkpoint.")
    if m.qk_norm:
        return "qwen3_moe"
    if not moe.normalize_top_k:
        raise UserError("model.moe.normalize_top_k = false without model.qk_norm: Mixtral always renormalises the "
                        "top-k probabilities (Qwen3-MoE's norm_topk_prob comes with q/k norms), so no transformers "
                        "family computes this model.")
    if moe.layers is not None and len(moe.layers) < m.num_layers:
        raise UserError(f"model.moe.layers = {moe.layers}: Mixtral has experts in every layer (Qwen3-MoE's "
                        f"mlp_only_layers comes with q/k norms), so no transformers family computes this model.")
    if moe.ffn_hidden_size and moe.ffn_hidden_size != m.ffn_hidden_size:
        raise UserError(f"model.moe.ffn_hidden_size = {moe.ffn_hidden_size} apart from model.ffn_hidden_size = "
                        f"{m.ffn_hidden_size} with every layer an MoE layer: Mixtral's intermediate_size is the "
                        f"experts' width; set model.ffn_hidden_size to it to write the model.")
    return "mixtral"


def hf_config(m):
    from ms_llm.config.validate import expert_ffn, moe_layers

    kind = model_type_of(m)
    moe = m.moe
    d = head_dim(m)
    out = {"model_type": kind, "architectures": [ARCHITECTURES[kind]], "num_hidden_layers": m.num_layers,
           "hidden_size": m.hidden_size, "num_attention_heads": m.num_heads, "num_key_value_heads": m.num_kv_heads,
           "head_dim": d, "max_position_embeddings": m.seq_length, "vocab_size": m.vocab_size,
           "rms_norm_eps": m.norm_eps, **rope.write(m), "hidden_act": "silu", "tie_word_embeddings": m.tie_embeddings,
           "num_experts_per_tok": moe.top_k, "router_aux_loss_coef": moe.aux_loss_coef / moe.top_k}
    if kind == "mixtral":
        out.update({"num_local_experts": moe.num_experts, "intermediate_size": expert_ffn(m),
                    "sliding_window": m.sliding_window})
    else:
        routed = moe_layers(m)
        out.update({"num_experts": moe.num_experts, "intermediate_size": m.ffn_hidden_size,
                    "moe_intermediate_size": expert_ffn(m), "norm_topk_prob": moe.normalize_top_k,
                    "decoder_sparse_step": 1, "mlp_only_layers": [i for i in range(m.num_layers) if i not in routed],
                    "attention_bias": False, "use_sliding_window": bool(m.sliding_window),
                    "sliding_window": m.sliding_window, "max_window_layers": 0 if m.sliding_window else m.num_layers})
    return out


# --- tensors ----------------------------------------------------------------------------------------------

def kind_of(m):
    return "qwen3_moe" if m.qk_norm else "mixtral"


def attention_names(m):
    """Our per-layer tensors that are llama.py's (attention, norms), without the MLP's."""
    names = {k: v for k, v in llama.layer_names(m).items() if not k.startswith("mlp.")}
    return names, {"attention.qkv.weight": llama.FUSED["attention.qkv.weight"]}


def to_ours(m, prefix, take, put, used):
    from ms_llm.config.validate import moe_layers

    kind, routed = kind_of(m), set(moe_layers(m))
    for ours, hf in llama.TOP.items():
        put(ours, lambda hf=hf: take(prefix + hf))
    if not m.tie_embeddings:
        put("lm_head", lambda: take("lm_head.weight"))
    else:
        used.add("lm_head.weight")
    names, fused = attention_names(m)
    for i in range(m.num_layers):
        base = f"{prefix}layers.{i}."
        for ours, hf in names.items():
            put(f"layers.{i}.{ours}", lambda key=base + hf: take(key))
        for ours, parts in fused.items():
            put(f"layers.{i}.{ours}", lambda ps=parts, b=base: np.concatenate([take(b + p) for p in ps], axis=0))
        if i not in routed:  # a dense layer of Qwen3-MoE (mlp_only_layers)
            put(f"layers.{i}.mlp.down.weight", lambda b=base: take(b + "mlp.down_proj.weight"))
            put(f"layers.{i}.mlp.gate_up.weight", lambda b=base: np.concatenate(
                [take(b + p) for p in llama.FUSED["mlp.gate_up.weight"]], axis=0))
            continue
        put(f"layers.{i}.mlp.router.weight", lambda b=base: either(take, b + ROUTER[kind], b + FUSED_ROUTER))
        put(f"layers.{i}.mlp.experts.gate_up", lambda b=base: experts(take, b, kind, m.moe.num_experts, up=True))
        put(f"layers.{i}.mlp.experts.down", lambda b=base: experts(take, b, kind, m.moe.num_experts, up=False))


def either(take, key, fallback):
    """Tensor `key`, else `fallback` (the other layout); a KeyError names `key` when neither exists."""
    try:
        return take(key)
    except KeyError:
        try:
            return take(fallback)
        except KeyError:
            raise KeyError(key) from None


def experts(take, base, kind, n, up):
    """(E, 2F, h) [gate; up] or (E, h, F) down, from the per-expert tensors or transformers 5's fused ones."""
    gate, upp, down = EXPERT[kind]
    try:
        if up:
            return np.stack([np.concatenate([take(base + gate.format(j=j)), take(base + upp.format(j=j))], axis=0)
                             for j in range(n)])
        return np.stack([take(base + down.format(j=j)) for j in range(n)])
    except KeyError as missing:
        try:
            return take(base + FUSED_EXPERTS[0 if up else 1])
        except KeyError:
            raise missing from None


def expert_layout(tensors, prefix):
    """"fused" when the file holds transformers 5's in-memory expert tensors, else "per_expert"."""
    return "fused" if any(k.startswith(prefix) and k.endswith(FUSED_EXPERTS[0]) for k in tensors) else "per_expert"


def to_hf(arrays, m, prefix, origin):
    from ms_llm.config.validate import expert_ffn, moe_layers

    kind, routed = kind_of(m), set(moe_layers(m))
    fused_file = origin.get("expert_layout") == "fused"
    out = {prefix + hf: arrays[ours] for ours, hf in llama.TOP.items()}
    if not m.tie_embeddings:
        out["lm_head.weight"] = arrays["lm_head"]
    elif origin.get("has_lm_head"):
        out["lm_head.weight"] = arrays["embedding"]
    d = head_dim(m)
    qkv_cuts = [m.num_heads * d, (m.num_heads + m.num_kv_heads) * d]
    names, fused = attention_names(m)
    f = expert_ffn(m)
    for i in range(m.num_layers):
        base, ours = f"{prefix}layers.{i}.", f"layers.{i}."
        for name, hf in names.items():
            out[base + hf] = arrays[ours + name]
        for name, parts in fused.items():
            for p, piece in zip(parts, np.split(arrays[ours + name], qkv_cuts, axis=0)):
                out[base + p] = piece.copy()
        if i not in routed:
            out[base + "mlp.down_proj.weight"] = arrays[ours + "mlp.down.weight"]
            for p, piece in zip(llama.FUSED["mlp.gate_up.weight"],
                                np.split(arrays[ours + "mlp.gate_up.weight"], [m.ffn_hidden_size], axis=0)):
                out[base + p] = piece.copy()
            continue
        gate_up, down = arrays[ours + "mlp.experts.gate_up"], arrays[ours + "mlp.experts.down"]
        if fused_file:
            out[base + FUSED_ROUTER] = arrays[ours + "mlp.router.weight"]
            out[base + FUSED_EXPERTS[0]], out[base + FUSED_EXPERTS[1]] = gate_up, down
            continue
        out[base + ROUTER[kind]] = arrays[ours + "mlp.router.weight"]
        gate, upp, dn = EXPERT[kind]
        for j in range(m.moe.num_experts):
            out[base + gate.format(j=j)] = np.ascontiguousarray(gate_up[j, :f])
            out[base + upp.format(j=j)] = np.ascontiguousarray(gate_up[j, f:])
            out[base + dn.format(j=j)] = np.ascontiguousarray(down[j])
    return out
