"""`ms-llm plan`: memory, communication and step-time estimate of a parallel layout, or a search for the
best layouts on a cluster. `add_parser(subparsers)` registers the subcommand; `cmd_plan(args)` runs it."""
import json
import re

from ms_llm.errors import UserError
from ms_llm.parallel import planner
from ms_llm.parallel.shapes import ModelShape
from ms_llm.config.cli_args import add_config_arguments


def add_parsers(subparsers):
    p = subparsers.add_parser("plan", help="parallel layout: memory per device, communication, step time; "
                                           "--search ranks the layouts that fit")
    add_config_arguments(p, required=False, help="YAML config (optional when --set model.preset=... gives the model)",
                         set_help="override a config value (repeatable), e.g. --set parallel_config.model_parallel=2")
    p.add_argument("--devices", type=int, help="devices in the cluster (default: dp×mp×pp of the config; "
                                               "with data_parallel null, one node)")
    p.add_argument("--device-memory", default=f"{planner.DEFAULT_DEVICE_MEMORY_GIB:g}GB",
                   help="memory per device, e.g. 64GB (read as GiB; default: Atlas 800T A2, 64GB)")
    p.add_argument("--device-tflops", type=float, default=planner.DEFAULT_DEVICE_TFLOPS,
                   help="dense 16-bit peak TFLOP/s per device (default 280, 910B-class)")
    p.add_argument("--mfu", type=float, default=planner.DEFAULT_MFU,
                   help="share of peak the step's FLOPs run at (default 0.5; calibrate with ms-llm benchmark)")
    p.add_argument("--link-gbps", default=f"{planner.DEFAULT_INTRA_GBPS:g},{planner.DEFAULT_INTER_GBPS:g}",
                   metavar="INTRA[,INTER]", help="per-device link bandwidth in GB/s (gigaBYTES): inside a node "
                                                 "(HCCS, default 196) and between nodes (200 Gb/s RoCE = 25)")
    p.add_argument("--devices-per-node", type=int, default=planner.DEFAULT_DEVICES_PER_NODE,
                   help="devices sharing the intra-node link (default 8)")
    p.add_argument("--flash-attention", choices=("auto", "on", "off"), default="auto",
                   help="model Ascend's fused attention (no s×s scores kept). auto: as ms_llm decides — on for "
                        "16-bit compute, head size a multiple of 16 and no dropout")
    p.add_argument("--target", choices=("Ascend", "CPU"), default="Ascend",
                   help="the device kind the memory terms are for: Ascend (device memory; default) or CPU (host "
                        "memory: adds the measured MindSpore runtime and compiled-graph terms, float32 on CPU "
                        "without flash attention; compare with ms-llm benchmark --memory)")
    p.add_argument("--search", action="store_true", help="rank every valid layout that fits by tokens/s")
    p.add_argument("--top", type=int, default=5, help="with --search: how many layouts to print (default 5)")
    p.add_argument("--json", action="store_true", help="print one JSON object with all the numbers, last line")
    p.set_defaults(func=cmd_plan)
    return p


def cmd_plan(args):
    from ms_llm.config import load_config

    if not args.config and not any(o.strip().startswith("model.preset=") for o in args.overrides):
        raise UserError("plan needs a model: pass --config C, or a preset with --set model.preset=llama2-7b "
                        "(gpt2-124m, llama2-7b, llama3.1-8b, qwen2.5-7b, qwen3-8b, mistral-7b, ...; "
                        "docs/models.md).")
    cfg = load_config(args.config, args.overrides)
    cluster = cluster_from_args(args, cfg)
    flash = {"auto": None, "on": True, "off": False}[args.flash_attention]
    layout, _ = planner.layout_from_config(cfg, cluster.devices, cluster.devices_per_node, flash, args.target)
    shape = ModelShape.from_config(cfg.model)
    if args.devices is None and cfg.parallel_config.data_parallel is None and not args.json:
        print(f"note: --devices not given and parallel_config.data_parallel is null: planning {cluster.devices} "
              f"devices (one node); pass --devices N for another cluster")
    if args.search:
        if args.top <= 0:
            raise UserError(f"--top = {args.top} must be a positive number of layouts, e.g. --top 5.")
        results = planner.search(shape, layout, cluster)
        if not args.json:
            print(header(shape, cfg, cluster))
            print(format_search(results, args.top, cluster))
        else:
            print(json.dumps(dict(model=model_dict(shape, cfg), cluster=cluster_dict(cluster),
                                  search=[compact(r) for r in results[:args.top]], fitting=len(results))))
        return results
    shape, result = planner.plan(cfg, cluster, layout)
    if args.json:
        print(json.dumps(dict(model=model_dict(shape, cfg), cluster=cluster_dict(cluster), plan=result)))
    else:
        print(header(shape, cfg, cluster))
        print(format_plan(result, layout, cluster))
    return result


# -- arguments -----------------------------------------------------------------------------------------

def cluster_from_args(args, cfg):
    if args.devices_per_node <= 0:
        raise UserError(f"--devices-per-node = {args.devices_per_node} must be positive (8 on an Atlas 800T A2).")
    _, devices = planner.layout_from_config(cfg, args.devices, args.devices_per_node)
    if args.device_tflops <= 0:
        raise UserError(f"--device-tflops = {args.device_tflops} must be > 0 (dense 16-bit TFLOP/s, e.g. 280).")
    if not 0 < args.mfu <= 1:
        raise UserError(f"--mfu = {args.mfu} must be in (0, 1]: the share of peak FLOP/s the step sustains, "
                        f"e.g. 0.5.")
    intra, inter = parse_links(args.link_gbps)
    return planner.Cluster(devices=devices, device_memory_gib=parse_memory(args.device_memory),
                           device_tflops=args.device_tflops, mfu=args.mfu, intra_gbps=intra, inter_gbps=inter,
                           devices_per_node=args.devices_per_node)


def parse_memory(text):
    """'64GB', '64GiB', '64G', '64' → 64.0 (GiB); '512MB' → 0.5."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(gib|gb|g|mib|mb|m|tib|tb|t)?\s*", str(text), re.IGNORECASE)
    if not m or float(m.group(1)) <= 0:
        raise UserError(f"--device-memory = '{text}' is not a memory size: write it like 64GB (read as GiB, the "
                        f"unit device memory is sold in) or 512MB.")
    unit = (m.group(2) or "g").lower()[0]
    return float(m.group(1)) * {"m": 1 / 1024, "g": 1.0, "t": 1024.0}[unit]


def parse_links(text):
    parts = [p.strip() for p in str(text).split(",")]
    try:
        values = [float(p) for p in parts]
    except ValueError:
        values = []
    if not 1 <= len(values) <= 2 or any(v <= 0 for v in values):
        raise UserError(f"--link-gbps = '{text}' must be INTRA[,INTER] in GB/s, both > 0, e.g. 196,25 "
                        f"(HCCS inside a node, 200 Gb/s RoCE between nodes).")
    return values[0], values[-1] if len(values) == 2 else planner.DEFAULT_INTER_GBPS


# -- output --------------------------------------------------------------------------------------------

def model_dict(shape, cfg):
    d = dict(arch=shape.arch, params=shape.total_params(), matmul_params=shape.matmul_params(),
             num_layers=shape.num_layers, hidden_size=shape.hidden, num_heads=shape.heads,
             num_kv_heads=shape.kv_heads, head_dim=shape.head_dim, ffn_hidden_size=shape.ffn, seq_length=shape.seq,
             vocab_size=shape.vocab, tie_embeddings=shape.tied, compute_dtype=cfg.precision.compute_dtype)
    if shape.moe:
        d.update(active_params=shape.active_params(), moe_layers=len(shape.moe_layer_ids), num_experts=shape.experts,
                 top_k=shape.top_k, expert_ffn=shape.expert_ffn, expert_params=sum(
                     shape.layer_expert_params(True) for _ in shape.moe_layer_ids))
    return d


def cluster_dict(c):
    return dict(devices=c.devices, nodes=c.nodes, devices_per_node=c.devices_per_node,
                device_memory_gib=c.device_memory_gib, device_tflops=c.device_tflops, mfu=c.mfu,
                intra_gbps=c.intra_gbps, inter_gbps=c.inter_gbps)


def compact(r):
    """A search result without the per-term memory breakdown."""
    out = {k: v for k, v in r.items() if k != "memory"}
    out["memory"] = {k: v for k, v in r["memory"].items() if k != "stages"}
    out["memory"]["stages_gib"] = [s["total_gib"] for s in r["memory"]["stages"]]
    return out


def head_size(shape):
    """' of D' when the heads are not hidden / heads wide (model.head_dim set apart, as Qwen3's)."""
    return f" of {shape.head_dim}" if shape.attention_width != shape.hidden else ""


def moe_text(shape):
    """', 12,879,925,248 active; 32 MoE layers of 8 experts (ffn 14336), top-2' for an MoE model, else ''."""
    if not shape.moe:
        return ""
    return (f", {shape.active_params():,} active per token; {len(shape.moe_layer_ids)} MoE layers of "
            f"{shape.experts} experts (ffn {shape.expert_ffn}), top-{shape.top_k}")


def header(shape, cfg, c):
    return (f"model: {shape.arch}, {shape.total_params():,} parameters ({shape.num_layers} layers, hidden "
            f"{shape.hidden}, {shape.heads} heads / {shape.kv_heads} kv{head_size(shape)}, ffn {shape.ffn}, seq "
            f"{shape.seq}, vocab "
            f"{shape.vocab}{moe_text(shape)}); compute dtype {cfg.precision.compute_dtype}\n"
            f"cluster: {c.devices} devices ({c.nodes} node(s) × {c.devices_per_node}), {c.device_memory_gib:g} GiB "
            f"each, {c.device_tflops:g} TFLOP/s peak × {c.mfu:g} assumed utilisation, links {c.intra_gbps:g} GB/s "
            f"intra-node / {c.inter_gbps:g} GB/s inter-node")


def format_plan(r, layout, c):
    lines = [f"layout: {layout.describe()}",
             f"batch: global {layout.global_batch} = micro {layout.micro_batch_size} × {layout.micro_batches_per_step}"
             f" micro-batches × dp {layout.dp}" + (f"; {layout.micro_batch_num} micro-batches per pipeline round"
                                                   if layout.pp > 1 else ""), ""]
    mem = r["memory"]
    peak = mem["stages"][mem["peak_stage"]]
    lines.append(f"memory per device, stage {mem['peak_stage']} of {layout.pp} (the peak):")
    width = max(len(t["name"]) for t in peak["terms"])
    for t in peak["terms"]:
        lines.append(f"  {t['name']:<{width}}  {t['gib']:8.2f} GiB   {t['formula']}")
    status = "fits" if r["fits"] else "DOES NOT FIT"
    lines.append(f"  {'total':<{width}}  {mem['peak_gib']:8.2f} GiB   of {c.device_memory_gib:g} GiB: {status}")
    if layout.pp > 1:
        lines.append("  per stage: " + ", ".join(f"stage {s['stage']} {s['total_gib']:.2f} GiB" for s in mem["stages"]))
    lines += ["", "communication per step per device (ring algorithms):"]
    if not r["communication"]:
        lines.append("  none (a single device)")
    for kind, k in r["communication"].items():
        lines.append(f"  {kind.replace('_', ' '):<16} {k['op']:<28} {k['gb']:9.2f} GB  over {k['link']}-node "
                     f"{k['gbps']:g} GB/s = {k['seconds']:7.3f} s   {k['formula']}")
    tokens_per_device = r["flops_per_device_step"] / r["flops_per_token"]
    lines += ["", "time per step:",
              f"  compute        {r['flops_per_token']:.3e} FLOP/token × {tokens_per_device:,.0f} tokens/device "
              f"÷ ({c.device_tflops:g} TFLOP/s × {c.mfu:g}) = {r['compute_s']:.3f} s",
              f"                 FLOP/token = {r['flops_formula']}",
              f"  pipeline       bubble (pp−1)/(m+pp−1) = {r['bubble_fraction']:.1%} → {r['pipeline_s']:.3f} s",
              f"  communication  {r['comm_s']:.3f} s = {r['comm_fraction']:.1%} of the step (no overlap with compute "
              f"assumed)",
              f"  step           {r['step_s']:.3f} s → {r['tokens_per_s_device']:,.0f} tokens/s per device, "
              f"{r['tokens_per_s_total']:,.0f} tokens/s in all"]
    lines += ["", "flags:"] + ([f"  ! {f}" for f in r["flags"]] or ["  none"])
    return "\n".join(lines)


def format_search(results, top, c):
    if not results:
        return ("no valid layout fits in "
                f"{c.device_memory_gib:g} GiB per device: add devices, shorten the sequence or the micro batch.")
    ep = any(r["layout"]["ep"] > 1 for r in results)  # an MoE model: the expert-parallel column
    lines = [f"{len(results)} valid layouts fit; the best {min(top, len(results))} by estimated tokens/s:",
             f"  {'#':>2}  {'dp':>3} {'mp':>3} {'pp':>3}" + (f" {'ep':>3}" if ep else "")
             + f"  {'recompute':<9} {'opt shard':<9}  {'tok/s/dev':>9}  {'peak GiB':>8}  reason"]
    for i, r in enumerate(results[:top], 1):
        lay = r["layout"]
        lines.append(f"  {i:>2}  {lay['dp']:>3} {lay['mp']:>3} {lay['pp']:>3}" + (f" {lay['ep']:>3}" if ep else "")
                     + f"  {lay['recompute']:<9} {'on' if lay['optimizer_shard'] else 'off':<9}  "
                     f"{r['tokens_per_s_device']:>9,.0f}  {r['memory']['peak_gib']:>8.1f}  {r['reason']}")
    return "\n".join(lines)
