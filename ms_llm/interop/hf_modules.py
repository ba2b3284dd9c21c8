"""Which transformers module computes what an ms_llm module computes, per Hugging Face `model_type`.

One entry per family: a tuple of (ms_llm module, transformers module) pairs, "{i}" standing for the layer
number. ms_llm's names are those of its probe (ms_llm.debug.probe: the Cell paths, plus "logits" for the model's
output); the transformers names are those of the *ForCausalLM class that AutoModelForCausalLM loads. Families
whose transformers modules are named like Llama's (model.layers.N.self_attn / mlp / input_layernorm ...) share
LLAMA's entry: adding one is one line here, once ms_llm.interop.huggingface converts its checkpoints.

Parameters need no table: their gradients and updated values are named like the checkpoint's tensors and go
through the checkpoint converter (huggingface.hf_to_ours), as the weights do.
"""

GPT2 = (
    ("embed_dropout", "transformer.drop"),  # token + position embedding, after (inactive) dropout
    ("layers.{i}.attn_norm", "transformer.h.{i}.ln_1"),
    ("layers.{i}.attention", "transformer.h.{i}.attn"),
    ("layers.{i}.mlp_norm", "transformer.h.{i}.ln_2"),
    ("layers.{i}.mlp", "transformer.h.{i}.mlp"),
    ("layers.{i}", "transformer.h.{i}"),  # the residual stream after the block
    ("final_norm", "transformer.ln_f"),
    ("logits", "logits"),
)

LLAMA = (
    ("embed_dropout", "model.embed_tokens"),
    ("layers.{i}.attn_norm", "model.layers.{i}.input_layernorm"),
    ("layers.{i}.attention", "model.layers.{i}.self_attn"),
    ("layers.{i}.mlp_norm", "model.layers.{i}.post_attention_layernorm"),
    ("layers.{i}.mlp", "model.layers.{i}.mlp"),
    ("layers.{i}", "model.layers.{i}"),
    ("final_norm", "model.norm"),
    ("logits", "logits"),
)

MODULES = {"gpt2": GPT2, "llama": LLAMA, "mistral": LLAMA, "qwen2": LLAMA, "qwen3": LLAMA}


def module_pairs(model_type, num_layers):
    """[(ms_llm name, transformers name)] of every compared module of a model, the layers expanded (the
    comparison orders them by execution)."""
    pairs = []
    for ours, theirs in MODULES[model_type]:
        for i in range(num_layers) if "{i}" in ours else (None,):
            pairs.append((ours, theirs) if i is None else (ours.replace("{i}", str(i)), theirs.replace("{i}", str(i))))
    return pairs
