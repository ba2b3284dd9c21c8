"""What LoRA (finetune.lora, ms_llm/nn/lora.py) changes in a device's memory: the base weights stay, frozen, and the
adapters join them; only the adapters have gradients and AdamW moments. The saving is in those two terms: for a
7B model at rank 8 on every projection, 16 bytes × 6.7 billion parameters of gradients and optimizer states become
16 bytes × 20 million. Pure arithmetic, like memory.py (which calls it, so it imports nothing of memory.py)."""
FP32_BYTES = 4
ADAMW_STATE_BYTES = 8  # two fp32 moments per parameter


def layer_lora_params(shape, rank, targets):
    """Adapter parameters of one decoder layer: r · (in + out) for each targeted projection."""
    h, f, width = shape.hidden, shape.ffn, shape.attention_width
    qkv_out = (shape.heads + 2 * shape.kv_heads) * shape.head_dim
    sizes = {"qkv": (h, qkv_out), "out": (width, h), "down": (f, h)}
    if shape.swiglu:
        sizes["gate_up"] = (h, 2 * f)
    else:
        sizes["up"] = (h, f)
    return sum(rank * (i + o) for name, (i, o) in sizes.items() if name in targets)


def lora_terms(terms, shape, layout, layers, Term):
    """The terms of a full fine-tuning `stage_memory` turned into LoRA's: an adapters line beside the weights, and
    gradients and optimizer states of the adapters alone (sharded like the rest when the optimizer is). `Term`:
    memory.Term."""
    n = layers * layer_lora_params(shape, layout.lora_rank, layout.lora_targets)
    shard = layout.dp if layout.optimizer_shard else 1
    out = []
    for t in terms:
        if t.name.startswith("gradients"):
            full = t.bytes
            t = Term(f"gradients, fp32 (LoRA adapters; base frozen)", FP32_BYTES * n / shard,
                     f"4 B × {n:,} adapter params{f' ÷ {shard}' if shard > 1 else ''} (full fine-tuning: "
                     f"{full / 2 ** 30:.2f} GiB)", "gradients")
        elif t.name.startswith("optimizer states"):
            full = t.bytes
            t = Term(f"optimizer states, AdamW (LoRA adapters)", ADAMW_STATE_BYTES * n / shard,
                     f"8 B × {n:,} adapter params{f' ÷ {shard}' if shard > 1 else ''} (full fine-tuning: "
                     f"{full / 2 ** 30:.2f} GiB)", "optimizer states")
        out.append(t)
        if t.name.startswith("weights, fp32 master"):
            out.append(Term(f"LoRA adapters, fp32 (rank {layout.lora_rank})", FP32_BYTES * n,
                            f"4 B × {layers} layers × r·(in + out) summed over {', '.join(layout.lora_targets)} "
                            f"= {n:,} params", "weights"))
    return out


def trainable_device_params(shape, layout, stage_params, layers):
    """What the data-parallel all-reduce moves: every parameter, or with LoRA the adapters of `layers` layers."""
    if not layout.lora_rank:
        return stage_params
    return layers * layer_lora_params(shape, layout.lora_rank, layout.lora_targets)
