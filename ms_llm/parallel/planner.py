"""Parallel-layout planner: validity, memory, communication, pipeline bubble and step time of a layout,
and a search over layouts for a cluster. Pure Python; every number is derived in docs/parallel_planning.md.

The estimate is deliberately simple: compute at an assumed fraction of peak, communication at link
bandwidth with NO overlap with compute, and a 1F1B pipeline bubble. It ranks layouts and explains their
costs; it does not replace a measured step (`ms-llm benchmark`).
"""
from dataclasses import dataclass, replace

from ms_llm.errors import UserError
from ms_llm.parallel.layout import (DEFAULT_DEVICES_PER_NODE, invalid_reasons,  # noqa: F401 (planner API)
                                    layout_from_config)
from ms_llm.parallel.lora_memory import trainable_device_params
from ms_llm.parallel.memory import GIB, FP32_BYTES, layers_per_stage, peak_stage, total_bytes
from ms_llm.parallel.shapes import ModelShape

# Defaults: an Atlas 800T A2 node (8 × Ascend 910B-class, 64 GB HBM each, HCCS inside the node, one
# 200 Gb/s RoCE port per device between nodes).
DEFAULT_DEVICE_MEMORY_GIB = 64.0
DEFAULT_DEVICE_TFLOPS = 280.0  # dense 16-bit peak, the same default monitor/throughput.py uses for MFU
DEFAULT_MFU = 0.5  # share of peak the matmuls sustain; see docs/parallel_planning.md
DEFAULT_INTRA_GBPS = 196.0  # GB/s per device over HCCS
DEFAULT_INTER_GBPS = 25.0  # GB/s per device: 200 Gb/s RoCE

COMM_FLAG = 0.20  # communication above 20% of the step: the practitioner's rule of thumb
BUBBLE_FLAG = 0.20
TIGHT_MEMORY = 0.90  # above 90% of device memory the runtime's own buffers (HCCL, workspace) may not fit


@dataclass(frozen=True)
class Cluster:
    devices: int
    device_memory_gib: float = DEFAULT_DEVICE_MEMORY_GIB
    device_tflops: float = DEFAULT_DEVICE_TFLOPS
    mfu: float = DEFAULT_MFU
    intra_gbps: float = DEFAULT_INTRA_GBPS
    inter_gbps: float = DEFAULT_INTER_GBPS
    devices_per_node: int = DEFAULT_DEVICES_PER_NODE

    @property
    def nodes(self):
        return -(-self.devices // self.devices_per_node)


# -- communication --------------------------------------------------------------------------------------

def placement_links(layout, cluster):
    """Which link each kind of traffic crosses. Ranks are laid out as MindSpore does: model parallel
    innermost, then data parallel, pipeline stages outermost; so a TP group is mp consecutive devices, a
    DP group spans dp·mp devices, and stage neighbours are devices/pp apart."""
    per_node = cluster.devices_per_node
    tp = "intra" if layout.mp <= per_node else "inter"
    dp = "intra" if layout.dp * layout.mp <= per_node else "inter"
    pp = "intra" if layout.devices <= per_node else "inter"
    # an expert-parallel group is ep data-parallel neighbours, mp apart: ep·mp consecutive devices
    ep = "intra" if layout.ep * layout.mp <= per_node else "inter"
    return {"data_parallel": dp, "tensor_parallel": tp, "pipeline": pp, "expert_parallel": ep}


def ring(n):
    """Bytes each device sends in a ring all-reduce, per byte of the buffer."""
    return 2 * (n - 1) / n


def communication(shape, layout, cluster):
    """Bytes each device sends per optimizer step, by kind, with the link used and the formula."""
    links = placement_links(layout, cluster)
    c = layout.compute_bytes
    s, b, h = shape.seq, layout.micro_batch_size, shape.hidden
    sbh = s * b * h
    micro = layout.micro_batches_per_step
    kinds = {}

    # Data parallel: gradients of the parameters one device holds (the largest stage). A routed expert's copies
    # are the dp/ep ranks of its expert-data-parallel group, so its gradients are reduced over those only.
    dense_params, expert_params = max((device_params(shape, layout, i, split=True) for i in range(layout.pp)),
                                      key=sum)
    if layout.lora_rank:  # LoRA: only the adapters have gradients to reduce
        dense_params = trainable_device_params(shape, layout, dense_params, max(layers_per_stage(shape, layout)))
    dp = layout.dp
    for group, n, params in (("data_parallel", dp, dense_params), ("expert_data_parallel", dp // layout.ep,
                                                                   expert_params)):
        if n <= 1 or not params:
            continue
        if layout.optimizer_shard:
            # The weight all-gather happens after the cast to the compute dtype and its backward is the
            # gradient reduce-scatter, so both move 16-bit data (MindSpore's parallel optimizer).
            vol = 2 * (n - 1) / n * c * params
            formula = (f"reduce-scatter + all-gather: 2 × (n−1)/n × {c} B × {params:,.0f} params "
                       f"(n = {'dp' if group == 'data_parallel' else 'dp/ep'} = {n})")
            op = "reduce-scatter + all-gather"
        else:
            vol = ring(n) * FP32_BYTES * params
            formula = (f"all-reduce: 2(n−1)/n × 4 B × {params:,.0f} params (fp32 gradients, "
                       f"n = {'dp' if group == 'data_parallel' else 'dp/ep'} = {n})")
            op = "all-reduce"
        if group == "data_parallel" and not shape.moe:  # the dense model's formula as it always read
            formula = formula.replace("(n−1)/n", "(dp−1)/dp").replace(f"n = dp = {n}", f"dp = {n}")
        kinds[group] = dict(op=op, bytes=vol, link=links["data_parallel"], formula=formula)

    # Expert parallel: every MoE layer sends each token's k copies to the ranks holding its experts (dispatch) and
    # back (combine), forward and backward: 4 all-to-alls of s·b·k·c·h per MoE layer and micro-batch, of which
    # (ep−1)/ep leaves the device (c: capacity factor, 1 dropless; ÷ t: tensor-parallel peers split the tokens).
    if layout.ep > 1 and shape.moe:
        ep, t = layout.ep, layout.mp
        moe_per_stage = max(len([i for i in ids if i in set(shape.moe_layer_ids)])
                            for ids in stage_ids(shape, layout))
        per_layer = 4 + (2 if layout.recompute == "full" or layout.full_recompute_layers else 0)
        cap = shape.capacity_factor or 1.0
        vol = per_layer * (ep - 1) / ep * sbh * shape.top_k * cap * c / t * moe_per_stage * micro
        kinds["expert_parallel"] = dict(
            op="all-to-all (dispatch + combine)", bytes=vol, link=links["expert_parallel"],
            formula=f"{per_layer} × (ep−1)/ep × s·b·h × k {shape.top_k} × c {cap:g} × {c} B{' ÷ t' if t > 1 else ''}"
                    f" × {moe_per_stage} MoE layers × {micro} micro-batches (ep = {ep})")

    # Tensor parallel: 2 all-reduces of s·b·h in forward, 2 in backward, per layer and micro-batch; full
    # recompute re-runs the forward and its 2 all-reduces. Sequence parallelism turns each all-reduce into
    # an all-gather + reduce-scatter of the same total volume.
    t = layout.mp
    if t > 1:
        layers = max(layers_per_stage(shape, layout))
        per_layer = 4 + (2 if layout.recompute == "full" or layout.full_recompute_layers else 0)
        vol = per_layer * ring(t) * sbh * c * layers * micro
        op = "all-gather + reduce-scatter" if layout.seq_parallel else "all-reduce"
        kinds["tensor_parallel"] = dict(op=op, bytes=vol, link=links["tensor_parallel"],
                                        formula=f"{per_layer} × 2(t−1)/t × s·b·h × {c} B × {layers} layers × "
                                                f"{micro} micro-batches (t = {t})")

    # Pipeline: activations forward and their gradients backward cross each stage boundary.
    if layout.pp > 1:
        sends = 2 if layout.pp > 2 else 1  # a middle stage sends both ways; an end stage one way each pass
        vol = 2 * sends * sbh * c * micro
        kinds["pipeline"] = dict(op="send/recv", bytes=vol, link=links["pipeline"],
                                 formula=f"2 (fwd + bwd) × {sends} neighbour(s) × s·b·h × {c} B × {micro} "
                                         f"micro-batches")
    for k in kinds.values():
        gbps = cluster.intra_gbps if k["link"] == "intra" else cluster.inter_gbps
        k["gbps"] = gbps
        k["seconds"] = k["bytes"] / (gbps * 1e9)
    return kinds


def stage_ids(shape, layout):
    from ms_llm.parallel.memory import stage_layer_ids

    return stage_layer_ids(shape, layout)


def device_params(shape, layout, stage, split=False):
    """Parameters one device of `stage` holds (its TP shard, whole embedding if vocab_emb_dp, E/ep of the routed
    experts); `split=True`: (the rest, the routed experts' share) apart."""
    t = layout.mp
    split_n, expert, replicated = shape.params_of_layers(stage_ids(shape, layout)[stage])
    n = split_n / t + replicated
    last = stage == layout.pp - 1
    vocab = (shape.embedding_params() if stage == 0 else 0) + (shape.head_params() if last else 0)
    if last and shape.tied and stage != 0:
        vocab += shape.vocab * shape.hidden
    n += vocab if layout.vocab_emb_dp else vocab / t
    n += shape.final_norm_params() if last else 0
    experts = expert / (t * layout.ep)
    return (n, experts) if split else n + experts


# -- time -----------------------------------------------------------------------------------------------

def bubble_fraction(layout):
    """Idle share of a 1F1B pipeline round: (pp − 1) / (m + pp − 1)."""
    return (layout.pp - 1) / (layout.micro_batch_num + layout.pp - 1) if layout.pp > 1 else 0.0


def recompute_share(shape, layout):
    """(share of layers fully recomputed, share selectively recomputed)."""
    if layout.full_recompute_layers:
        per_stage = layers_per_stage(shape, layout)
        full = sum(min(n, k) for n, k in zip(per_stage, layout.full_recompute_layers)) / shape.num_layers
    else:
        full = 1.0 if layout.recompute == "full" else 0.0
    selective = (1 - full) if layout.recompute == "selective" else 0.0
    return full, selective


def flops_per_token(shape, layout):
    """Training FLOPs per token a device executes, with the formula: 6·N + 12·L·h·s (PaLM appendix B),
    × 4/3 on the layers fully recomputed (one more forward), + 4·L·h·s per selectively recomputed layer
    (QKᵀ and attention·V forward again). With causal flash attention the kernel skips the masked half of
    the s×s blocks, so attention costs 6·L·h·s, plus 1·L·h·s for the QKᵀ its backward recomputes, plus
    2·L·h·s per selectively recomputed layer (its causal forward again). (The MLP activation that selective
    recompute also rebuilds is element-wise: no matmul FLOPs.)"""
    n = shape.matmul_params()
    L, h, s = shape.num_layers, shape.attention_width, shape.seq  # h: heads × head_dim (= hidden unless set apart)
    full, selective = recompute_share(shape, layout)
    flash = layout.flash_attention
    attention = (6 if flash else 12) * L * h * s
    extra = (1 + 2 * selective) * L * h * s if flash else 4 * selective * L * h * s
    total = (6 * n + attention) * (1 + full / 3) + extra
    txt = f"6·{n:,} + {6 if flash else 12}·{L}·{h}·{s}"
    if full:
        txt = f"({txt}) × (1 + {full:g}/3)"
    if flash:
        txt += f" + {L}·{h}·{s} (flash attention: causal half, QKᵀ recomputed)"
        if selective:
            txt += f" + 2·{selective:g}·{L}·{h}·{s} (recomputed forward)"
    elif selective:
        txt += f" + 4·{selective:g}·{L}·{h}·{s}"
    return total, txt


def estimate(shape, layout, cluster):
    """All numbers of one valid layout: memory per stage, communication, bubble, step time, flags."""
    peak_index, stages = peak_stage(shape, layout)
    peak = total_bytes(stages[peak_index])
    comm = communication(shape, layout, cluster)
    per_token, flops_txt = flops_per_token(shape, layout)
    tokens_step = layout.global_batch * shape.seq
    flops_device = per_token * tokens_step / layout.devices
    compute_s = flops_device / (cluster.device_tflops * 1e12 * cluster.mfu)
    bubble = bubble_fraction(layout)
    pipeline_s = compute_s / (1 - bubble)  # a round takes (m + pp − 1) slots for m slots of work
    comm_s = sum(k["seconds"] for k in comm.values())
    step_s = pipeline_s + comm_s  # no overlap of communication with compute
    tokens_per_s = tokens_step / step_s
    result = dict(
        layout=layout_dict(layout),
        memory=dict(peak_stage=peak_index, peak_bytes=int(peak), peak_gib=round(peak / GIB, 3),
                    device_gib=cluster.device_memory_gib,
                    stages=[dict(stage=i, total_gib=round(total_bytes(t) / GIB, 3),
                                 terms=[term.as_dict() for term in t]) for i, t in enumerate(stages)]),
        communication={k: dict(op=v["op"], gb=round(v["bytes"] / 1e9, 3), link=v["link"], gbps=v["gbps"],
                               seconds=round(v["seconds"], 4), formula=v["formula"]) for k, v in comm.items()},
        flops_per_token=per_token, flops_formula=flops_txt, flops_per_device_step=flops_device,
        compute_s=compute_s, bubble_fraction=bubble, pipeline_s=pipeline_s, comm_s=comm_s, step_s=step_s,
        comm_fraction=comm_s / step_s, tokens_per_s_device=tokens_per_s / layout.devices,
        tokens_per_s_total=tokens_per_s,
        mfu_assumed=cluster.mfu, device_tflops=cluster.device_tflops,
    )
    result["fits"] = peak <= cluster.device_memory_gib * GIB
    result["flags"] = flags(result, layout, cluster)
    return result


def flags(r, layout, cluster):
    out = []
    mem = r["memory"]
    if not r["fits"]:
        out.append(f"memory: stage {mem['peak_stage']} needs {mem['peak_gib']:.1f} GiB per device, more than the "
                   f"{cluster.device_memory_gib:g} GiB available: shard the optimizer, recompute, or raise "
                   f"model/pipeline parallelism")
    elif mem["peak_gib"] > TIGHT_MEMORY * cluster.device_memory_gib:
        out.append(f"memory: {mem['peak_gib']:.1f} GiB is above {TIGHT_MEMORY:.0%} of {cluster.device_memory_gib:g}"
                   f" GiB; the runtime's own buffers may not fit (MindFormers caps max_device_memory at 58GB)")
    if r["comm_fraction"] > COMM_FLAG:
        worst = max(r["communication"].items(), key=lambda kv: kv[1]["seconds"])[0]
        out.append(f"communication: {r['comm_fraction']:.0%} of the step (> {COMM_FLAG:.0%}), mostly "
                   f"{worst.replace('_', ' ')}")
    if r["bubble_fraction"] > BUBBLE_FLAG:
        out.append(f"pipeline bubble: {r['bubble_fraction']:.0%} of the step (> {BUBBLE_FLAG:.0%}); raise "
                   f"micro_batch_num (bubble = (pp−1)/(m+pp−1))")
    if layout.mp > cluster.devices_per_node:
        out.append(f"tensor parallelism across nodes: mp = {layout.mp} > {cluster.devices_per_node} devices per "
                   f"node puts per-layer all-reduces on the inter-node link")
    return out


def layout_dict(layout):
    d = {k: getattr(layout, k) for k in ("dp", "mp", "pp", "ep", "micro_batch_size", "micro_batch_num", "global_batch",
                                          "seq_parallel", "optimizer_shard", "recompute", "vocab_emb_dp",
                                          "compute_dtype", "flash_attention")}
    d["full_recompute_layers"] = list(layout.full_recompute_layers)
    d["stage_layers"] = list(layout.stage_layers)
    return d


# -- from a config ---------------------------------------------------------------------------------------

def plan(cfg, cluster, layout):
    """Estimate for the config's own layout; raises UserError listing every reason it is invalid."""
    shape = ModelShape.from_config(cfg.model)
    reasons = invalid_reasons(shape, layout, cluster.devices)
    if reasons:
        raise UserError(f"the layout {layout.describe()} cannot run on {cluster.devices} devices: "
                        + "; ".join(reasons) + ". Fix the config or run with --search to list layouts that fit.")
    return shape, estimate(shape, layout, cluster)


# -- search ---------------------------------------------------------------------------------------------

def powers_of_two_dividing(n, limit):
    out, k = [], 1
    while k <= min(n, limit):
        if n % k == 0:
            out.append(k)
        k *= 2
    return out


def candidate_layouts(shape, base, cluster):
    """Every (dp, mp, pp, ep, recompute, optimizer_shard) for the cluster: mp and pp powers of two dividing the
    device count, mp within a node, ep (MoE) a power of two dividing dp and the experts; each pipeline runs all
    of a replica's micro-batches in one round
    (micro_batch_num = global / (dp · micro)), the smallest bubble the batch allows."""
    n = cluster.devices
    for mp in powers_of_two_dividing(n, cluster.devices_per_node):
        for pp in powers_of_two_dividing(n // mp, n):
            dp = n // (mp * pp)
            per_replica = base.global_batch // (dp * base.micro_batch_size) if dp * base.micro_batch_size else 0
            # with flash attention, selective recompute saves nothing more (no scores are stored anyway)
            modes = ("none", "full") if base.flash_attention else ("none", "selective", "full")
            # expert parallelism: every power of two dividing both dp and the experts (1 for a dense model)
            eps = [e for e in powers_of_two_dividing(dp, dp) if shape.moe and shape.experts % e == 0] or [1]
            for ep in eps:
                for recompute in modes:
                    for shard in ((False, True) if dp > 1 else (False,)):
                        yield replace(base, dp=dp, mp=mp, pp=pp, ep=ep,
                                      micro_batch_num=max(1, per_replica) if pp > 1 else 1,
                                      recompute=recompute, optimizer_shard=shard, full_recompute_layers=(),
                                      stage_layers=(), seq_parallel=base.seq_parallel and mp > 1)


def search(shape, base, cluster):
    """Valid layouts that fit device memory, fastest first; each with a one-line reason."""
    results = []
    for layout in candidate_layouts(shape, base, cluster):
        if invalid_reasons(shape, layout, cluster.devices):
            continue
        r = estimate(shape, layout, cluster)
        if not r["fits"]:
            continue
        r["reason"] = reason_line(r, layout, cluster)
        results.append(r)
    results.sort(key=lambda r: -r["tokens_per_s_device"])
    return results


def reason_line(r, layout, cluster):
    rc = {"none": "without recompute", "selective": "with selective recompute",
          "full": "only with full recompute"}[layout.recompute]
    tight = ", tight" if r["memory"]["peak_gib"] > TIGHT_MEMORY * cluster.device_memory_gib else ""
    parts = [f"fits {rc} ({r['memory']['peak_gib']:.1f} of {cluster.device_memory_gib:g} GiB{tight})",
             f"comm {r['comm_fraction']:.0%}"]
    if layout.pp > 1:
        parts.append(f"bubble {r['bubble_fraction']:.0%}")
    if r["communication"]:
        worst_kind, worst = max(r["communication"].items(), key=lambda kv: kv[1]["seconds"])
        parts.append(f"largest: {worst_kind.replace('_', ' ')} {worst['seconds']:.2f} s over {worst['link']}-node")
    return "; ".join(parts)
