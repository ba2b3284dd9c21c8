"""Per-device memory of a parallel layout, term by term, each with the formula that produced it.

Pure arithmetic on the config (no MindSpore): `ModelShape` is the model's sizes, `Layout` the parallel
choices, `stage_memory` the bytes one device of a pipeline stage holds. The assumptions behind every
term are stated in docs/parallel_planning.md; the short version is in the comments here.

Units: bytes everywhere in code; GiB (2**30) when printed, because device memory is sold in binary units.
"""
from dataclasses import dataclass

from ms_llm.parallel.shapes import balanced_stages
from ms_llm.parallel.shapes import stage_layer_ids as shapes_stage_layer_ids

GIB = 2 ** 30
MIB = 2 ** 20
FP32_BYTES = 4
ADAMW_STATE_BYTES = 8  # two fp32 moments per parameter
RECOMPUTE_MODES = ("none", "selective", "full")

# Host memory on CPU that the terms below do not cover, measured with `ms-llm benchmark --memory` (MindSpore 2.10,
# docs/performance.md): the process after importing MindSpore and ms_llm with the context set and the data
# pipeline open, and the compiled training step (graph, kernels), which grows with the decoder layers.
CPU_RUNTIME_BYTES = 400 * MIB
CPU_COMPILED_BYTES, CPU_COMPILED_LAYER_BYTES = 70 * MIB, 16 * MIB
# The whole-logits loss (train.loss_chunk_tokens = 0) on CPU: MindSpore's autodiff of ops.cross_entropy holds
# about this many float32 copies of the (tokens, vocab) logits at its peak (measured at a 32k vocabulary).
CPU_WHOLE_LOGITS_COPIES = 18


@dataclass
class Term:
    """One line of the memory table: what, how many bytes, and the formula with the numbers put in. `kind` groups
    the lines the way `ms-llm benchmark --memory` measures them (weights, gradients, optimizer states,
    activations, logits, runtime baseline, compiled graphs)."""
    name: str
    bytes: float
    formula: str
    kind: str = ""

    def as_dict(self):
        return {"name": self.name, "bytes": int(self.bytes), "gib": round(self.bytes / GIB, 3),
                "formula": self.formula, "kind": self.kind}


def planned_by_kind(terms):
    """{kind: bytes} summed over the terms (dicts from Term.as_dict, or Terms)."""
    out = {}
    for t in terms:
        kind, value = (t["kind"], t["bytes"]) if isinstance(t, dict) else (t.kind, t.bytes)
        out[kind] = out.get(kind, 0) + value
    return out


# -- activations (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models") --

def korthikanti_layer_bytes(s, b, h, a, t=1, seq_parallel=False, recompute="none"):
    """The paper's per-layer, per-micro-batch activation bytes for a GPT layer (MHA, 4h GELU MLP, dropout),
    16-bit activations: s·b·h·(34 + 5·a·s/h) without parallelism, s·b·h·(10 + 24/t + 5·a·s/(h·t)) with
    tensor parallelism t, s·b·h/t·(34 + 5·a·s/h) with sequence parallelism; selective recompute drops the
    5·a·s/h term; full recompute keeps only the layer input, 2·s·b·h (÷ t under sequence parallelism)."""
    scores = 0 if recompute == "selective" else 5 * a * s / h
    if recompute == "full":
        return 2 * s * b * h / (t if seq_parallel else 1)
    if seq_parallel:
        return s * b * h / t * (34 + scores)
    return s * b * h * (10 + 24 / t + scores / t)


def layer_activation_units(shape, t, seq_parallel, recompute, flash=False, compute_dtype="bfloat16", moe=False):
    """Per-layer activation bytes in units of s·b·h (16-bit), generalised from the paper's 34 + 5·a·s/h to
    grouped-query attention, SwiGLU, models without dropout and ms_llm's selective recompute, and returned
    with the formula used.

    Not split by tensor parallelism (10): both norm inputs 4, QKV input 2, MLP input 2, two dropout masks 2
    (8 without dropout: ms_llm's models keep no masks when model.dropout = 0, the default).
    Split t ways: Q 2, K and V 2·kv/a each, attention-out input 2 (each × a·d/h when the head size d is set
    apart from h/a, as Qwen3's), then the MLP: GELU keeps its input and
    output, 2·(f/h) each = 4·f/h (16 at f = 4h); SwiGLU keeps gate output, silu output, up output and their
    product, 8·f/h. The s×s attention scores: 5·a·s/h with dropout (softmax output 2, dropout mask 1, dropout
    output 2); without dropout the softmax output alone, 2·a·s/h, or 3·a·s/h with 16-bit compute (the float32
    softmax output and its 16-bit copy for the P·V matmul).
    For a GPT-2 layer with dropout (kv = a, f = 4h) this is exactly 10 + 24 + 5·a·s/h = 34 + 5·a·s/h; without
    dropout, in float32 (× 2), 4·(16 + a·s/h) bytes per s·b·h: what `ms-llm benchmark --memory` measures on CPU.
    Selective recompute (ms_llm recomputes the attention core and the MLP activation) keeps no scores and only
    the activation's input (GELU 2·f/h, SwiGLU's gate|up output 4·f/h).
    Flash attention stores no scores either (it keeps only per-row softmax statistics, O(s), ignored).

    A mixture-of-experts layer (`moe`) keeps, in place of the MLP's units, per (token, expert) assignment the
    expert's SwiGLU activations 8·f_e/h (4·f_e/h under selective recompute) plus its permuted input and output rows
    (2 + 2): k·c·(8·f_e/h + 4), c the capacity factor (1 dropless: the exact row count a grouped matmul computes);
    a shared expert adds its 8·f_s/h, and the float32 router logits, probabilities and gates 6·E/h (not split by t).
    """
    h, a, s = shape.hidden, shape.heads, shape.seq
    if recompute == "full":
        return (2 / t if seq_parallel else 2), "2" + ("/t" if seq_parallel else "")
    kv = shape.kv_heads / a
    dropout = shape.dropout > 0
    selective = recompute == "selective"
    wide = shape.attention_width / h  # q, k, v and the attention output are a·d wide: 1 unless head_dim is set apart
    mlp_units = (4 if shape.swiglu else 2) * (1 if selective else 2)
    mlp = mlp_units * shape.ffn / h
    mlp_txt = f"{mlp_units}·f/h"
    router = 0.0
    if moe:
        c = shape.capacity_factor or 1.0
        e_units = 4 * (1 if selective else 2)
        mlp = shape.top_k * c * (e_units * shape.expert_ffn / h + 4) + e_units * shape.shared_ffn / h
        mlp_txt = f"k·c·({e_units}·f_e/h + 4)" + (f" + {e_units}·f_s/h" if shape.shared_ffn else "")
        router = 6 * shape.experts / h
    split = (4 + 4 * kv) * wide + mlp
    no_scores = selective or flash
    score_units = 5 if dropout else 2 if compute_dtype == "float32" else 3
    scores = 0.0 if no_scores else score_units * a * s / h
    whole = 10 if dropout else 8
    attn_txt = "4 + 4·kv/a" if wide == 1 else "(4 + 4·kv/a)·a·d/h"
    scores_txt = "" if no_scores else f" + {score_units}·a·s/h"
    router_txt = " + 6·E/h" if moe else ""
    if seq_parallel:
        return (whole + split + scores) / t + router, f"({whole} + {attn_txt} + {mlp_txt}{scores_txt})/t{router_txt}"
    return whole + (split + scores) / t + router, f"{whole} + ({attn_txt} + {mlp_txt}{scores_txt})/t{router_txt}"


def layers_per_stage(shape, layout):
    """Layers on each pipeline stage: parallel_config.stage_layers when given, else ms_llm's own balanced
    split (ms_llm.parallel.shapes.balanced_stages: the remainder goes to the middle stages, since the first
    holds the embedding and the last the LM head and loss)."""
    if layout.stage_layers:
        return list(layout.stage_layers)
    stage_of_layer = balanced_stages(shape.num_layers, layout.pp)
    return [stage_of_layer.count(i) for i in range(layout.pp)]


def in_flight(stage, layout):
    """Micro-batches whose activations stage `stage` holds at its peak under 1F1B: pp − stage, capped by the
    number of micro-batches in a pipeline round."""
    if layout.pp == 1:
        return 1
    return max(1, min(layout.pp - stage, layout.micro_batch_num))


def fully_recomputed(stage, layers, layout):
    """How many of this stage's layers keep only their input."""
    if layout.full_recompute_layers:
        return min(layers, layout.full_recompute_layers[stage])
    return layers if layout.recompute == "full" else 0


# -- one device of one stage --------------------------------------------------------------------------

def stage_memory(shape, layout, stage):
    """The memory terms (list of `Term`) of one device in pipeline stage `stage`."""
    t, dp = layout.mp, layout.dp
    layers = layers_per_stage(shape, layout)[stage]
    first, last = stage == 0, stage == layout.pp - 1

    # Parameters on this device, grouped by how many devices hold an identical copy: a tensor-split matrix
    # is repeated over dp devices, a TP-replicated one over dp·t. MindSpore's optimizer sharding slices each
    # parameter over exactly those copies ("saves the parameters as minimal slices").
    split, expert, replicated = shape.params_of_layers(stage_layer_ids(shape, layout)[stage])
    replicated += shape.final_norm_params() if last else 0
    vocab = (shape.embedding_params() if first else 0) + (shape.head_params() if last else 0)
    if last and shape.tied and not first:
        vocab += shape.vocab * shape.hidden  # the last stage needs its own copy of a tied embedding
    if layout.vocab_emb_dp:  # embedding / head whole on every TP rank (MindFormers' vocab_emb_dp)
        replicated += vocab
    else:
        split += vocab
    split_dev = split / t
    params = split_dev + replicated
    shard_split, shard_rep = (dp, dp * t) if layout.optimizer_shard else (1, 1)
    sharded_params = split_dev / shard_split + replicated / shard_rep
    terms = runtime_terms(layers) if layout.target == "CPU" else []
    terms += weight_terms(layout, params, sharded_params, "",
                          f"÷ {dp} (÷ {dp * t} for TP-replicated ones)" if t > 1 else f"÷ {dp}")
    if shape.moe:
        # Routed experts: each expert-parallel rank holds E/ep whole experts (each split t ways inside), and an
        # expert's copies are the dp/ep ranks of its expert-data-parallel group: that is what sharding divides by.
        ep = layout.ep
        expert_dev = expert / (t * ep)
        kept = f"{shape.experts // ep} of {shape.experts} experts per MoE layer"
        expert_sharded = expert_dev / (dp // ep if layout.optimizer_shard else 1)
        terms += weight_terms(layout, expert_dev, expert_sharded, "experts' ", f"÷ {dp // ep} (dp/ep)", f" ({kept})")
        params, sharded_params = params + expert_dev, sharded_params + expert_sharded
    if layout.pp == 1 and layout.micro_batches_per_step > 1:  # TrainStep's fp32 buffers (a pipeline sums its own)
        held = sharded_params if layout.optimizer_shard else params
        terms.append(Term("gradient accumulation buffers, fp32", FP32_BYTES * held,
                          f"4 B × {held:,.0f} params ({layout.micro_batches_per_step} micro-batches per step)",
                          "gradients"))
    if layout.lora_rank:  # finetune.lora: gradients and moments of the adapters only
        from ms_llm.parallel.lora_memory import lora_terms

        terms = lora_terms(terms, shape, layout, layers, Term)
    return terms + activation_terms(shape, layout, stage, layers)


def weight_terms(layout, params, sharded_params, prefix, shard_txt, note=""):
    """Weights, gradients and AdamW states of `params` parameters on a device (`sharded_params` under optimizer
    sharding); `prefix` names a group kept apart ("experts' "; "" for the rest), `note` follows the count."""
    c = layout.compute_bytes
    p_txt = f"{params:,.0f} params{note}"
    terms = []
    if layout.optimizer_shard:
        terms.append(Term(f"{prefix}weights, fp32 master (sharded)", FP32_BYTES * sharded_params,
                          f"4 B × {p_txt} {shard_txt}", "weights"))
        terms.append(Term(f"{prefix}weights, {layout.compute_dtype} copy (all-gathered)", c * params,
                          f"{c} B × {p_txt}: gathered for forward and backward", "weights"))
        terms.append(Term(f"{prefix}gradients, fp32 (reduce-scattered)", FP32_BYTES * sharded_params,
                          f"4 B × {p_txt} {shard_txt.split(' (')[0]}", "gradients"))
        terms.append(Term(f"{prefix}optimizer states, AdamW (sharded)", ADAMW_STATE_BYTES * sharded_params,
                          f"8 B × {p_txt} {shard_txt.split(' (')[0]}", "optimizer states"))
    else:
        terms.append(Term(f"{prefix}weights, fp32 master", FP32_BYTES * params, f"4 B × {p_txt}", "weights"))
        if c < FP32_BYTES:
            terms.append(Term(f"{prefix}weights, {layout.compute_dtype} copy", c * params, f"{c} B × {p_txt}", "weights"))
        terms.append(Term(f"{prefix}gradients, fp32", FP32_BYTES * params, f"4 B × {p_txt}", "gradients"))
        terms.append(Term(f"{prefix}optimizer states, AdamW", ADAMW_STATE_BYTES * params, f"8 B × {p_txt}",
                          "optimizer states"))
    return terms


def stage_layer_ids(shape, layout):
    """[[layer indices of stage 0], ...]: parallel_config.stage_layers when given, else the balanced split."""
    return shapes_stage_layer_ids(shape.num_layers, layout.pp, layout.stage_layers or None)


def runtime_terms(layers):
    """CPU: the process and the compiled step, as measured (constants above)."""
    compiled = CPU_COMPILED_BYTES + layers * CPU_COMPILED_LAYER_BYTES
    return [Term("runtime baseline (MindSpore import, context, data pipeline)", CPU_RUNTIME_BYTES,
                 f"measured: {CPU_RUNTIME_BYTES / MIB:.0f} MiB", "runtime baseline"),
            Term("compiled training step (graphs, kernels)", compiled,
                 f"measured: {CPU_COMPILED_BYTES / MIB:.0f} MiB + {layers} layers × "
                 f"{CPU_COMPILED_LAYER_BYTES / MIB:.0f} MiB", "compiled graphs")]


def activation_terms(shape, layout, stage, layers):
    s, b, h, t = shape.seq, layout.micro_batch_size, shape.hidden, layout.mp
    sp = layout.seq_parallel and t > 1
    dt = layout.compute_dtype
    scale = 2 if layout.compute_dtype == "float32" else 1  # the paper's bytes are for 16-bit activations
    sbh = s * b * h
    n_full = fully_recomputed(stage, layers, layout)
    rest_mode = "none" if layout.recompute == "full" else layout.recompute
    flight = in_flight(stage, layout)
    terms = []
    fp32 = " × 2 (fp32 activations)" if scale == 2 else ""
    if n_full:
        units, txt = layer_activation_units(shape, t, sp, "full")
        terms.append(Term(f"activations, full recompute ({n_full} layers, {flight} in flight)",
                          n_full * flight * units * sbh * scale,
                          f"{n_full} layers × {flight} micro-batches × s·b·h × [{txt}] B{fp32}, s·b·h = {sbh:,}",
                          "activations"))
        work, _ = layer_activation_units(shape, t, sp, "none", layout.flash_attention, dt, shape.moe)
        terms.append(Term("recompute working set (one layer rebuilt)", work * sbh * scale,
                          f"one layer without recompute: s·b·h × {work:.2f} B{fp32}", "activations"))
    if layers - n_full:
        label = {"none": "no recompute", "selective": "selective recompute"}[rest_mode]
        if layout.flash_attention:
            label += ", flash attn"
        # the layers recomputed in full are the stage's first ones (MindSpore's per-stage count)
        moe_ids = set(shape.moe_layer_ids)
        rest = stage_layer_ids(shape, layout)[stage][n_full:]
        for moe, n in ((False, sum(i not in moe_ids for i in rest)), (True, sum(i in moe_ids for i in rest))):
            if not n:
                continue
            units, txt = layer_activation_units(shape, t, sp, rest_mode, layout.flash_attention, dt, moe)
            kind = "MoE " if moe else ("dense " if moe_ids else "")
            terms.append(Term(f"activations, {label} ({n} {kind}layers, {flight} in flight)",
                              n * flight * units * sbh * scale,
                              f"{n} layers × {flight} micro-batches × s·b·h × [{txt} = {units:.2f}] B{fp32}, "
                              f"s·b·h = {sbh:,}", "activations"))
    if stage == layout.pp - 1:
        terms.append(logits_term(shape, layout))
    return terms


def logits_term(shape, layout):
    """The LM head's logits and the loss's working memory for one micro-batch on the last stage.

    Chunked (train.loss_chunk_tokens, ms_llm.train.losses.chunked): one chunk of `rows` tokens at a time, forward and
    backward. CPU (measured): the float32 logits and their float32 gradient, rows·V·(4 + 4) B, plus their
    compute-dtype copies with 16-bit compute. Ascend (assumed, not measured here): MindSpore ops instead of the
    fused CPU kernel keep the compute-dtype logits, the float32 logits, their shifted exponentials and the
    scattered gradient and its 16-bit copy: rows·V·(3·4 + 2·c) B.
    Whole logits: CPU (measured) about 18 float32 copies of s·b·V at the peak of MindSpore's autodiff of
    ops.cross_entropy; Ascend (assumed) the compute-dtype logits and the float32 softmax, s·b·V·(c + 4) B."""
    s, b, c = shape.seq, layout.micro_batch_size, layout.compute_bytes
    tv = 1 if layout.vocab_emb_dp else layout.mp
    v, v_txt = shape.vocab / tv, "V" + ("/t" if tv > 1 else "")
    tokens, chunk = s * b, layout.loss_chunk
    if chunk:
        rows = min(chunk, tokens)
        if layout.target == "CPU":
            per = 8 + (2 * c if c < FP32_BYTES else 0)
            txt = f"(4 + 4{f' + 2·{c}' if c < FP32_BYTES else ''}) B"
        else:
            per, txt = 12 + 2 * c, f"(3·4 + 2·{c}) B (assumed)"
        return Term(f"logits and loss, chunks of {rows:,} tokens (last stage)", rows * v * per,
                    f"{rows:,} tokens × {v_txt} × {txt}", "logits")
    if layout.target == "CPU":
        return Term("logits and loss, whole (last stage, one micro-batch)", tokens * v * 4 * CPU_WHOLE_LOGITS_COPIES,
                    f"s·b·{v_txt} × 4 B × {CPU_WHOLE_LOGITS_COPIES} copies (measured)", "logits")
    return Term("logits and loss (last stage, one micro-batch)", tokens * v * (c + FP32_BYTES),
                f"s·b·{v_txt} × ({c} + 4) B", "logits")


def total_bytes(terms):
    return sum(term.bytes for term in terms)


def peak_stage(shape, layout):
    """(stage index, its terms) of the pipeline stage with the most memory per device."""
    stages = [stage_memory(shape, layout, i) for i in range(layout.pp)]
    best = max(range(layout.pp), key=lambda i: total_bytes(stages[i]))
    return best, stages
