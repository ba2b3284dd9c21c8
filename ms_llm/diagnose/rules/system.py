"""`ms-llm diagnose` rules on the run as a system: throughput, loss scaling, memory (near the limit, growing), clipping, tensor
statistics flags and events."""
import statistics

from ms_llm.diagnose.common import (CLIP_RATIO, CLIP_SHARE, DATA_WAIT_FRAC, Finding, LOW_MFU,
    LOW_MFU_MIN_HIDDEN, MEMORY_FRAC, MIN_RECORDS, OVERFLOW_MIN, OVERFLOW_SHARE, SCALE_DROPS_MIN, SCALE_DROPS_SHARE,
    SLOW_FRAC, SLOW_MIN_RECORDS, SLOW_SHARE, cause, finite, g, lr_actions, points, quoted, steps_text)
from ms_llm.diagnose.rules.device import contention_text, host_contention, run_contention, run_contention_text
from ms_llm.diagnose.evidence import before_cut, profiled, record_seconds, step_seconds, step_speed, steady
from ms_llm.diagnose.registry import CHEAP, EVAL, rule

CONTENDED_SHARE = 0.75   # slow records that coincide with host load: host contention, a note
MEM_GROWTH_ABS, MEM_GROWTH_REL = 0.05, 0.10  # memory growing by 50 MiB and 10% (first third → last third) ...
MEM_STEP_GIB, MEM_RISING = 0.5 / 1024, 0.5   # ... rising by > 0.5 MiB in half of the intervals ...
MEM_ONE_JUMP, MEM_LATE = 0.5, 0.2            # ... no interval holding half the growth, 20% of it in the last third
DATA_WAIT_CONTENDED = 0.3   # under host contention a data wait below 30% is a note (a stalling pipeline waits more)
DATA_WAIT_MIN_S = 0.5      # a data wait is a finding when the steady records waited >= 0.5 s in all (a few ms of a
                            # tiny run's short steps is a high fraction of nothing)
UNEVEN_MIN_LOST_S = 2.0     # uneven throughput is a warning when its slow records lost >= 2 s against the median
UNEVEN_MIN_LOST_SHARE = 0.05  # speed and >= 5% of the training time; less is a note (a few hiccups of a tiny run)

# --- throughput -------------------------------------------------------------------------------------

@rule(finds=('data_wait',), live=EVAL)
def rule_data_wait(run, found, _):
    pts = steady(run, "data_wait_frac")
    if len(pts) < MIN_RECORDS or statistics.median(v for _, v in pts) <= DATA_WAIT_FRAC:
        # a median of fewer records is one stall (the live diagnosis checks from the second record on)
        return None
    waited = waited_s(run, pts)
    if waited is not None and waited < DATA_WAIT_MIN_S:
        return None
    med = statistics.median(v for _, v in pts)
    high = [s for s, v in pts if v > DATA_WAIT_FRAC]
    workers = run.cfg("data.num_workers")
    ev = [f"median data wait {100 * med:.0f}% of step time (max {100 * max(v for _, v in pts):.0f}%); above "
          f"{100 * DATA_WAIT_FRAC:.0f}% in {len(high)} of {len(pts)} records (steps {steps_text(high)})",
          f"data.num_workers = {workers}"]
    shared = run_contention(run)
    causes = [cause(f"too few reader threads (data.num_workers = {workers})", "medium"),
              cause("the dataset on slow or network storage (OBS/NFS mount): reads stall each step", "medium"),
              cause("tokenizing on the fly instead of reading preprocessed MindRecord", "low"),
              cause("CPU contention on the host (other jobs, too many ranks per host)", "medium" if shared else "low")]
    actions = [f"--set data.num_workers={max(2, 2 * workers)}", "copy the dataset to local disk (or cache it)",
               "ms-llm preprocess --config <config> (packed MindRecord once, read fast afterwards)"]
    if shared and med < DATA_WAIT_CONTENDED:
        # the readers share the starved cores: a moderate wait is the host's until an idle run shows it
        ev.append(run_contention_text(shared) + ": the readers waited for the CPU too; a note (a pipeline that "
                  f"stalls on its own waits more than {100 * DATA_WAIT_CONTENDED:.0f}%, or as much on an idle host)")
        causes.insert(0, causes.pop())
        return [Finding("data_wait", "info", f"note: {100 * med:.0f}% of step time waiting for data while other "
                        f"processes took the host's CPU", ev, causes,
                        ["rerun on an idle host: a wait that stays is the pipeline's"] + actions, high[:10])]
    return [Finding("data_wait", "warning", f"input pipeline stalls: {100 * med:.0f}% of step time waiting for data",
                    ev, causes, actions, high[:10])]


def waited_s(run, pts):
    """Seconds the records of `pts` (step, data_wait_frac) waited for data, from each record's interval_s; None when
    a record has none (older runs)."""
    seconds = record_seconds(run)
    if any(s not in seconds for s, _ in pts):
        return None
    return sum(v * seconds[s] for s, v in pts)


@rule(finds=('throughput_uneven', 'host_contention'), live=EVAL)
def rule_uneven(run, found, _):
    pts = step_speed(run)
    if len(pts) < SLOW_MIN_RECORDS:
        return None
    med = statistics.median(v for _, v in pts)
    slow = [(s, v) for s, v in pts if v < SLOW_FRAC * med]
    if len(slow) < 2 or len(slow) < SLOW_SHARE * len(pts):
        return None
    if not telemetry_covers(run, [s for s, _ in slow]):
        return None  # telemetry is on but has not sampled the slow records yet (a run still running): the host's
        # share cannot be told from the run's own, so it waits for the next sample (the sampler's last is at the end)
    waits = dict(points(run.train, "data_wait_frac"))
    slow_wait = statistics.median(waits.get(s, 0.0) for s, _ in slow)
    cost = lost_time(run, pts, med)
    if cost and (cost[0] < UNEVEN_MIN_LOST_S or cost[0] < UNEVEN_MIN_LOST_SHARE * cost[1]):
        return [Finding("throughput_uneven", "info", "note: a few slow log intervals that cost little time",
                        [f"median {med:,.0f} tokens/s; {len(slow)} of {len(pts)} records below "
                         f"{100 * SLOW_FRAC:.0f}% of it: " + ", ".join(f"step {s}: {v:,.0f}" for s, v in slow[:8]),
                         f"they lost {cost[0]:.1f} s against the median speed, {100 * cost[0] / cost[1]:.0f}% of "
                         f"{cost[1]:.1f} s of training (a warning from {UNEVEN_MIN_LOST_S:g} s and "
                         f"{100 * UNEVEN_MIN_LOST_SHARE:.0f}%)"],
                        [cause("short stalls (garbage collection, another process, a monitor's sync): too little "
                               "time to be worth a cause", "low")],
                        ["--set train.log_interval=1 for a while if the steps' speed matters"], [s for s, _ in slow][:10])]
    ev = [f"median {med:,.0f} tokens/s; {len(slow)} of {len(pts)} records below {100 * SLOW_FRAC:.0f}% of it: "
          + ", ".join(f"step {s}: {v:,.0f}" for s, v in slow[:8]),
          f"median data wait in the slow records: {100 * slow_wait:.0f}%"]
    prof = profiled(run)
    if prof:
        ev.append(f"records of the profiled window left out (steps {steps_text(sorted(prof))})")
    steps = [s for s, _ in slow]
    busy = host_contention(run, steps)
    shared = run_contention(run)
    stall = slow_wait > DATA_WAIT_FRAC
    if busy:
        ev.append(contention_text(busy))
    if shared:
        ev.append(run_contention_text(shared))
    elif any(True for _ in _telemetry_loads(run)) and not any("time" in r for r in run.train):
        ev.append("telemetry has host loads, but the records carry no time to match them with (a run from before "
                  "metrics.jsonl had a time field): host contention cannot be checked")
    elif any(True for _ in _telemetry_loads(run)):
        ev.append("telemetry: other processes took less than half a core and the host load stayed within 1.5x its "
                  "cores while the steps were slow: not other processes")
    else:
        ev.append("no host load in telemetry.jsonl (monitor.telemetry_interval_s off?): host contention cannot be "
                  "checked")
    actions = ["profile a slow window: --set monitor.profile.start_step=<step> --set monitor.profile.stop_step="
               "<step+10>", "check the host: top / npu-smi info for other jobs"]
    coincide = bool(busy) and len(busy[0]) >= CONTENDED_SHARE * len(slow)
    if not stall and (coincide or shared):
        # the host's, not the run's: a note, so that the run's own findings (if any) come first
        causes = [cause("host contention: other processes on this machine took CPU time from the run ("
                        + ("they were busy while the steps were slow" if coincide else
                           "they were busy through most of the run") + ")", "high" if coincide else "medium"),
                  cause("a stall inside the run (recompilation, garbage collection, a straggler rank) would look the "
                        "same; rerun on an idle host to rule it out", "low")]
        ev.append("this is the host's unevenness, not the run's: a note, which leaves the first place to the run's own "
                  "findings")
        return [Finding("host_contention", "info", "throughput uneven while the host was shared with other processes",
                        ev, causes, ["run on an idle host (or fewer jobs per host) when throughput matters"] + actions,
                        steps[:10])]
    multi = ((run.info.get("parallel") or {}).get("world_size") or 1) > 1
    inside = cause("a stall inside the run: recompilation (changing shapes), garbage collection, a monitor that "
                   "syncs the device", "medium")
    straggler = cause("a straggler rank or a shared network (all ranks wait for the slowest)",
                      "medium" if multi else "low")
    host = cause("host contention: other processes, CPU frequency scaling, swapping",
                 "medium" if busy else "low")
    if stall:
        causes = [cause("data stalls: the slow records wait for data", "high"), host, inside, straggler]
    elif busy:
        causes = [host, inside, straggler]
    else:
        causes = [inside, straggler, host]
    actions.insert(0, f"--set data.num_workers={2 * (run.cfg('data.num_workers') or 1)}" if stall else
                   "--set train.log_interval=1 for a while (which steps are slow, and how regularly)")
    return [Finding("throughput_uneven", "warning", "uneven (saw-toothed) throughput", ev, causes, actions,
                    steps[:10])]


def lost_time(run, pts, med):
    """(seconds the records of `pts` lost against the median speed `med`, their seconds in all), from each record's
    interval_s (the trainer's, pauses out; the hooks' time out, as in step_speed) or else its tokens (steps × global batch × sequence); None if unknown."""
    seconds = step_seconds(run)
    per_step = (run.cfg("train.global_batch_size") or 0) * (run.cfg("model.seq_length") or 0)
    steps = [r["step"] for r in run.train]
    previous = dict(zip(steps, [0] + steps[:-1]))
    lost = total = 0.0
    for step, v in pts:
        t = seconds.get(step)
        if t is None:
            if not per_step or v <= 0:
                return None
            t = (step - previous.get(step, step)) * per_step / v
        total += t
        lost += max(0.0, t * (1 - v / med))
    return (lost, total) if total > 0 else None


def telemetry_covers(run, steps):
    """False when a run still running samples telemetry but no sample is as late as the last of these records (then
    whether other processes took the CPU meanwhile is not known yet); True otherwise (telemetry off or no sample at
    all: nothing to wait for; the sampler's first sample is at the start)."""
    from ms_llm.diagnose.rules.device import record_windows, telemetry

    if not getattr(run, "running", False) or not run.cfg("monitor.telemetry_interval_s"):
        return True  # a finished run's samples are all there is (the live diagnosis marks a run still running)
    ends = [b for s, a, b in record_windows(run) if s in set(steps)]
    samples = [x["time"] for x in telemetry(run)]
    return not ends or not samples or max(samples) >= max(ends)  # no sample at all: none is coming to wait for


def _telemetry_loads(run):
    from ms_llm.diagnose.rules.device import telemetry

    return (s for s in telemetry(run) if isinstance(s.get("load1"), (int, float)) or "cpu_util_pct" in s)


@rule(finds=('low_mfu',), reads=('data_wait',), live=EVAL)
def rule_low_mfu(run, found, _):
    pts = steady(run, "mfu")
    hidden = run.cfg("model.hidden_size")
    if not pts or hidden is None or hidden < LOW_MFU_MIN_HIDDEN:
        return None  # small models cannot fill a device: low MFU is expected, not actionable
    med = statistics.median(v for _, v in pts)
    if med <= 0 or med >= LOW_MFU:
        return None
    ev = [f"median MFU {100 * med:.1f}% (hidden {hidden}, micro batch {run.cfg('train.micro_batch_size')}, "
          f"mode {run.cfg('context.mode')})"]
    for op in (run.final.get("profile_top_ops") or [])[:3]:
        ev.append(f"profile: {op.get('op')} {g(op.get('ms_per_step'))} ms/step ({100 * (op.get('share') or 0):.0f}%)")
    pynative = run.cfg("context.mode") == "pynative" or run.cfg("context.jit_level") == "O0"
    causes = [cause("pynative mode or jit_level O0 (no graph fusion)", "high"),
              cause("micro batch too small to keep the device busy", "medium")] if pynative else [
        cause("micro batch too small to keep the device busy", "medium")]
    causes += [cause("full recompute where select_recompute would do",
                     "medium" if run.cfg("recompute_config.recompute") else "low"),
               cause("data waits or communication (see those findings)",
                     "medium" if "data_wait" in found else "low")]
    actions = [f"--set train.micro_batch_size={2 * run.cfg('train.micro_batch_size')} (if memory allows)"
               if run.cfg("train.micro_batch_size") else "a micro-batch twice the run's (if memory allows)",
               "--set context.mode=graph", "--set recompute_config.select_recompute=true instead of full recompute",
               "ms-llm benchmark --config <config> and a profile window (monitor.profile) for the top ops"]
    return [Finding("low_mfu", "warning", f"low MFU: {100 * med:.1f}%", ev, causes, actions)]


# --- loss-scale overflows ---------------------------------------------------------------------------

@rule(finds=('loss_scale',), live=CHEAP)
def rule_loss_scale(run, found, _):
    recs = run.train
    if len(recs) < 2:
        return None
    # the first interval holds the dynamic scale's initial calibration (a few overflows by design)
    skipped = sum(r.get("skipped_interval") or 0 for r in recs[1:])
    span = recs[-1]["step"] - recs[0]["step"]
    scales = [v for _, v in points(recs, "loss_scale")]
    drops = [recs[i]["step"] for i in range(1, len(recs)) if finite(recs[i].get("loss_scale")) and
             finite(recs[i - 1].get("loss_scale")) and recs[i]["loss_scale"] < recs[i - 1]["loss_scale"]]
    frequent = skipped >= OVERFLOW_MIN and span and skipped >= OVERFLOW_SHARE * span
    collapsed = bool(scales) and min(scales) <= 1 and run.cfg("precision.loss_scale") == "dynamic"
    oscillating = len(drops) >= SCALE_DROPS_MIN and len(drops) >= SCALE_DROPS_SHARE * (len(recs) - 1)
    if not (frequent or collapsed or oscillating):
        return None
    ev = [f"{skipped} of {span} steps after the first log interval overflowed and were skipped "
          f"({100 * skipped / max(span, 1):.1f}%)",
          f"loss scale {scales[0]:,.0f} → {scales[-1]:,.0f} (min {min(scales):,.0f}); it dropped at {len(drops)} of "
          f"{len(recs) - 1} records (steps {steps_text(drops)})"]
    fp16 = run.cfg("precision.compute_dtype") == "float16"
    causes = ([cause("float16 range: gradients or activations exceed 65504 or underflow", "high")] if fp16 else
              [cause("non-finite gradients outside float16: a NaN source in the graph, not a range problem", "high")])
    if run.cfg("precision.compute_dtype") is None:  # another framework's log without its config: both fit
        causes = [cause("float16 range, if it trained in float16 (the log does not say the dtype)", "medium"),
                  cause("non-finite gradients: a NaN source in the graph", "medium")]
    causes += [cause(f"LR too high: weights and activations grow (train.lr = {g(run.cfg('train.lr'))})", "medium"),
               cause(f"loss-scale settings: init_scale {g(run.cfg('precision.init_scale'))}, scale_window "
                     f"{run.cfg('precision.scale_window')}", "low")]
    actions = (["--set precision.compute_dtype=bfloat16 (no loss scale needed)"] if fp16 else []) + [
        lr_actions(run)[0], f"ms-llm debug nan --run-dir {quoted(run.path)}",
        f"--set precision.scale_window={2 * run.cfg('precision.scale_window')} (fewer growth attempts)"
        if run.cfg("precision.scale_window") else "a loss-scale window twice the run's (fewer growth attempts)"]
    return [Finding("loss_scale", "warning", "frequent loss-scale overflows", ev, causes, actions, drops[:10])]


# --- memory -----------------------------------------------------------------------------------------

@rule(finds=('memory',), live=EVAL)
def rule_memory(run, found, limit):
    mems = points(run.train, "mem_gib")
    peak = max([v for _, v in mems] + ([run.final["peak_mem_gib"]] if finite(run.final.get("peak_mem_gib")) else []),
               default=None)
    if peak is None or not limit or peak < MEMORY_FRAC * limit:
        return None
    at = max(mems, key=lambda p: p[1])[0] if mems else None
    micro = run.cfg("train.micro_batch_size")
    ev = [f"peak memory {peak:.2f} GiB" + (f" (step {at})" if at else "") + f" = {100 * peak / limit:.0f}% of the "
          f"{limit:.1f} GiB limit"]
    recompute = run.cfg("recompute_config.recompute") or run.cfg("recompute_config.select_recompute")
    sharded = run.cfg("parallel_config.optimizer_shard")
    causes = [cause("activations of the micro batch (grow with micro_batch_size x seq_length x hidden x layers)"
                    + (" — recompute is already on" if recompute else ""), "medium" if recompute else "high"),
              cause("weights, gradients and AdamW states (16 bytes per parameter in float32)"
                    + (", already sharded" if sharded else ", replicated on every data-parallel rank"), "medium"),
              cause("memory fragmentation close to the limit", "low")]
    actions = ([] if recompute else
               ["recompute_config.recompute: true (or select_recompute: true for a cheaper partial recompute)"])
    actions += [] if sharded else ["parallel_config.optimizer_shard: true (AdamW states split over data-parallel "
                                   "ranks)"]
    actions.append(f"--set train.micro_batch_size={max(1, micro // 2)} (global batch kept: more accumulation)")
    return [Finding("memory", "warning", f"memory near the limit: {100 * peak / limit:.0f}%", ev, causes, actions,
                    [at] if at else [])]


# --- gradients always clipped ----------------------------------------------------------------------

@rule(finds=('always_clipped',), reads=('slow_progress', 'loss_not_falling', 'loss_plateau'), live=EVAL)
def rule_always_clipped(run, found, _):
    clip = run.cfg("train.clip_grad")
    # only the stretch before a divergence or NaN: norms that grow with it are that finding's evidence
    gn = [v for _, v in before_cut(run, points(run.train, "grad_norm"))]
    if not clip or len(gn) < MIN_RECORDS:
        return None
    share = sum(v > clip for v in gn) / len(gn)
    med = statistics.median(gn)
    if share < CLIP_SHARE or med < CLIP_RATIO * clip:
        return None
    accum = run.accumulation
    cv = statistics.pstdev(gn) / statistics.fmean(gn)
    ev = [f"grad_norm above train.clip_grad = {g(clip)} in {100 * share:.0f}% of {len(gn)} records; median "
          f"{g(med)} = {med / clip:.1f}x the clip; variation (std/mean) {cv:.2f}",
          f"accumulation steps = global {run.cfg('train.global_batch_size')} / (micro "
          f"{run.cfg('train.micro_batch_size')} x data-parallel {run.data_parallel}) = {accum}"]
    if accum > 1:
        causes = [cause(f"gradient accumulation without dividing the loss by the accumulation steps: norms come out "
                        f"{accum}x too large (accumulation = {accum})", "medium"),
                  cause("large gradients of a model that is still far from a minimum (early, or LR too low)", "low")]
        actions = [f"compare with accumulation 1: --set train.global_batch_size="
                   f"{run.cfg('train.global_batch_size') // accum} for a few steps; a grad_norm about {accum}x smaller "
                   f"means the loss is not divided by the accumulation steps",
                   "--set monitor.tensor_stats.every=5 (its grad_scale_mismatch flag measures the ratio directly)"]
        return [Finding("always_clipped", "warning", "gradients always clipped, far above the clip", ev, causes,
                        actions)]
    if any(k in found for k in ("slow_progress", "loss_not_falling", "loss_plateau")):
        return None  # the progress finding weighs the clipping evidence among its causes
    # AdamW divides each update by the RMS of recent gradients: a steady clip factor cancels out
    ev.append("AdamW normalises the update by the running RMS of the gradient, so a gradient scaled down by a steady "
              "factor gives the same update; the loss is falling as it should")
    causes = [cause(f"large gradients relative to train.clip_grad = {g(clip)}; harmless while the loss falls",
                    "medium"),
              cause("clip_grad too small: only matters when the clip factor swings (variation above 0.5) and the "
                    "loss falls slowly", "low")]
    return [Finding("always_clipped", "info", "note: gradients clipped at almost every step (by a steady factor)", ev,
                    causes, [f"--set train.clip_grad={med:.2g} (about the typical norm) to see the raw norms; not "
                             f"needed while the loss falls"])]


@rule(finds=('memory_growth',), live=CHEAP)
def rule_memory_growth(run, found, limit):
    """Memory that keeps growing over the run: a leak (host RSS on CPU, device memory on accelerators)."""
    resume = max((e["step"] for e in run.events if e.get("event") == "resume"), default=None)
    mems = [p for p in steady(run, "mem_gib") if resume is None or p[0] > resume]
    if len(mems) < 6:
        return None
    third = len(mems) // 3
    a, b = statistics.median(v for _, v in mems[:third]), statistics.median(v for _, v in mems[-third:])
    steps = [y - x for (_, x), (_, y) in zip(mems, mems[1:])]
    ups = sum(d > MEM_STEP_GIB for d in steps) / len(steps)
    (s0, v0), (s1, v1) = mems[0], mems[-1]
    total = v1 - v0
    # a leak grows all along: not one jump (a graph compiled at the first evaluation or probe, a buffer allocated
    # once), and still in the last third of the run
    if (b - a < max(MEM_GROWTH_ABS, MEM_GROWTH_REL * a) or ups < MEM_RISING or max(steps) > MEM_ONE_JUMP * total
            or v1 - mems[-third][1] < MEM_LATE * total):
        return None
    rate = (v1 - v0) / max(1, s1 - s0)
    ev = [f"mem_gib {g(v0)} at step {s0} → {g(v1)} at step {s1} (+{1024 * (v1 - v0):.0f} MiB, "
          f"{1024 * 100 * rate:.1f} MiB per 100 steps); it rose in {100 * ups:.0f}% of the intervals"]
    if limit and rate > 0:
        reach = s1 + (limit - v1) / rate
        ev.append(f"at this rate the {limit:.1f} GiB limit is reached around step {reach:,.0f}"
                  + (f" (the run has {run.max_steps:,})" if run.max_steps else ""))
    cpu = ((run.info.get("device") or {}).get("target") or run.cfg("context.device_target")) == "CPU"
    causes = [cause("a leak: something keeps a reference per step (a hook or callback appending tensors, batches or "
                    "metrics to a list; a cache without a bound)", "high"),
              cause("recompilation: graphs compiled again for changing shapes or Python values, each kept in memory",
                    "medium"),
              cause("the memory pool growing by fragmentation" + ("" if cpu else " (device memory)"), "low")]
    actions = ["compare a run with the monitors off (--set monitor.tensor_stats=null --set monitor.nan_check=false): "
               "if the growth stops, a monitor or hook holds the references",
               "python -X tracemalloc, or tracemalloc snapshots in a hook, to see which line allocates"
               + ("" if cpu else "; MindSpore's memory profiler (monitor.profile) for device memory"),
               f"--set checkpoint.save_interval={max(50, (run.max_steps or 1000) // 10)} (a crash at the limit then "
               f"loses little)"]
    return [Finding("memory_growth", "warning", f"memory keeps growing: +{1024 * (v1 - v0):.0f} MiB over "
                    f"{s1 - s0} steps", ev, causes, actions, [s0, s1])]


# --- stats.jsonl -----------------------------------------------------------------------------------

def branch(name):
    """The residual branch a parameter belongs to: layers.1.mlp.up.weight and layers.1.mlp_norm.weight are both
    layers.1.mlp; layers.0.attention.qkv.weight and layers.0.attn_norm.weight are layers.0.attention."""
    parts = name.split(".")
    if parts[0] != "layers" or len(parts) < 3:
        return parts[0]
    part = {"attn_norm": "attention", "mlp_norm": "mlp"}.get(parts[2], parts[2])
    return f"layers.{parts[1]}.{part}"


def vanishing_text(run, names, recs):
    """(symptom, causes, actions) for vanishing-gradient flags, from the gradient records of the flagged parameters:
    exact zeros confined to one block are a dead branch; tiny but non-zero gradients are a scale problem."""
    grads = [r for r in run.stats if r.get("kind") == "gradient" and r.get("name") in names]
    exact = bool(grads) and all((r.get("zero_frac") or 0) >= 0.999 or (r.get("norm") or 0) == 0 for r in grads
                                if r.get("step", 0) >= min(x.get("step", 0) for x in recs) - 1)
    blocks = sorted({branch(n) for n in names})
    rd = quoted(run.path)
    dump = (f"ms-llm debug dump --run-dir {rd} --output {rd}/dumps/now, then read the per-module outputs of "
            f"{blocks[0]}: an activation output that is all zeros is a dead activation, a non-zero activation with a "
            f"zero block output is an output multiplied by zero")
    if exact and len(blocks) <= 2:
        causes = [cause(f"a dead branch in {', '.join(blocks)}: its gradients are exactly zero while the rest of the "
                        f"model trains — an activation that is always 0 (dead ReLU-style units: every pre-activation "
                        f"below zero) or an output multiplied by zero", "high"),
                  cause("a weight or gate initialised to zero, or frozen by a mask", "medium"),
                  cause("LR far too low", "low")]
        actions = [dump, "check that block's activation (a shift or bias that pushes it below zero, ReLU after a "
                         "large negative init) and any scale/gate on its output",
                   "--set monitor.tensor_stats.every=50 (watch whether it revives)"]
        return f"dead branch: zero gradients in {', '.join(blocks)}", causes, actions
    causes = [cause("too small init or post-norm without residual scaling: gradients shrink layer by layer",
                    "medium"),
              cause("dead activations (zero_frac high in the gradient records)", "medium" if exact else "low"),
              cause("LR far too low", "low")]
    return (f"vanishing gradients/activations in {len(names)} layer(s): {', '.join(names[:5])}"
            + (" ..." if len(names) > 5 else ""), causes,
            [f"check model.init_std = {g(run.cfg('model.init_std'))} and the layers named", dump,
             "--set monitor.tensor_stats.every=50 to follow them"])


def dtype_text(run, names, recs):
    detail = recs[0].get("detail", "")
    low = "float16" in detail.lower() or "bfloat16" in detail.lower()
    causes = [cause("the optimizer's state was created in another dtype than the float32 master weights "
                    + ("(a half-precision Adam moment: small second moments underflow to 0 and the steps blow up; "
                       "small first moments lose their updates)" if low else ""), "high"),
              cause("a parameter cast to the compute dtype after the optimizer was built (master weights not float32)",
                    "medium")]
    actions = ["build AdamW from the float32 master weights and keep its moments float32 (ms_llm.train.optimizer "
               "clones them from the parameters; look for a patched or custom optimizer, or a cast of the parameters)",
               "ms-llm debug dump and compare with a run without the change, layer by layer"]
    return f"dtype mismatch between master weights and optimizer state in {len(names)} parameter(s)", causes, actions


def exploding_text(run, names, recs):
    clip = run.cfg("train.clip_grad")
    causes = [cause(f"LR too high (train.lr = {g(run.cfg('train.lr'))})", "medium"),
              cause("no gradient clipping (train.clip_grad = 0)", "high" if not clip else "low"),
              cause("float16 range", "medium" if run.cfg("precision.compute_dtype") == "float16" else "low")]
    causes.sort(key=lambda c: 0 if c.endswith("[confidence: high]") else 1)
    return ("exploding gradients/activations", causes,
            ["--set train.clip_grad=1.0" if not clip else lr_actions(run)[0],
             "--set train.anomaly=true to skip spikes"])


def scale_text(run, names, recs):
    accum = run.accumulation
    says = any("accumulation" in str(r.get("detail", "")) for r in recs)
    causes = [cause(f"the loss is not divided by the accumulation steps ({accum}): gradient norm = accumulation x "
                    f"the mean loss's", "high" if says else "medium"),
              cause("a custom loss that is not the mean over tokens", "low" if says else "medium")]
    return "gradient scale mismatch", causes, [
        "divide the loss by train.global_batch_size / (micro_batch_size x data_parallel)",
        f"compare with a run at accumulation 1: --set train.global_batch_size="
        f"{run.cfg('train.global_batch_size') // max(1, accum)}"]


FLAGS = {"vanishing": vanishing_text, "exploding": exploding_text, "dtype_mismatch": dtype_text,
         "grad_scale_mismatch": scale_text}


EXPLODE_BACK = 1.5   # a grad norm back within 1.5x its level before the flag by the next record: recovered
EXPLODE_PERSIST = 2  # exploding flags at this many distinct steps (or a norm that stays up): an explosion
WARMUP_END = 0.1     # a flag within 10% of the warmup (at least 5 steps) of its end: where the LR reaches its peak


def one_off_explosion(run, recs):
    """(evidence lines) when every exploding flag is a single record the run recovered from (the grad norm in
    metrics.jsonl back near its level before it by the next record), else None."""
    steps = sorted({r.get("step") for r in recs if isinstance(r.get("step"), int)})
    if not steps or len(steps) >= EXPLODE_PERSIST:
        return None
    s = steps[0]
    gn = points(run.train, "grad_norm")
    before = [v for st, v in gn if st < s][-5:]
    after = [(st, v) for st, v in gn if st >= s][:2]
    if not before or not after:
        return None
    level = statistics.median(before)
    late = after[-1]
    if late[1] > EXPLODE_BACK * level:
        return None
    lines = [f"{recs[0].get('name')} at step {s}: {recs[0].get('detail', '')}",
             f"grad_norm in metrics.jsonl: {g(level)} before step {s} (median of {len(before)} records), "
             f"{g(late[1])} at step {late[0]}: back at its level; one record the run recovers from is not an "
             f"explosion (that needs the norm to stay up, or flags at {EXPLODE_PERSIST}+ steps)"]
    warm = run.cfg("train.warmup_steps") or 0
    if warm and abs(s - warm) <= max(5, WARMUP_END * warm):
        lines.append(f"step {s} is where the warmup reaches the peak LR (train.warmup_steps = {warm}): the gradient "
                     f"norm commonly peaks there")
    return lines


@rule(finds=('stats_*',), live=CHEAP)
def rule_stats(run, found, _):
    out = []
    for flag, text in FLAGS.items():
        recs = [r for r in run.stats if r.get("kind") == "flag" and r.get("flag") == flag]
        once = one_off_explosion(run, recs) if flag == "exploding" and recs else None
        if once:
            out.append(Finding("stats_exploding", "info", "note: one gradient-norm record above its history, and the "
                               "run recovered at once", once,
                               [cause("a single large batch gradient (or the peak of the warmup), not an instability",
                                      "medium")],
                               ["nothing to do unless it repeats; then --set train.clip_grad=1.0 or a longer warmup"],
                               [recs[0].get("step")]))
            continue
        if recs:
            names = sorted({r.get("name", "?") for r in recs})
            ev = [f"{r.get('name')} at step {r.get('step')}: {r.get('detail', '')}".rstrip(": ") for r in recs[:10]]
            symptom, causes, actions = text(run, names, recs)
            out.append(Finding(f"stats_{flag}", "warning", symptom, ev, causes, actions,
                               sorted({r.get("step") for r in recs if isinstance(r.get("step"), int)})[:10]))
    bad = [r for r in run.stats if r.get("kind") != "flag" and finite(r.get("nonfinite")) and r["nonfinite"] > 0]
    if bad:
        first = min(bad, key=lambda r: r.get("step", 0))
        out.append(Finding("stats_nonfinite", "error", f"non-finite values first in {first.get('name')} "
                           f"({first.get('kind')}) at step {first.get('step')}",
                           [f"{r.get('name')} ({r.get('kind')}) step {r.get('step')}: {g(r['nonfinite'])} non-finite"
                            for r in bad[:10]],
                           [cause("the first layer listed is where NaN/Inf enter", "high")],
                           [f"ms-llm debug nan --run-dir {quoted(run.path)}"], [first.get("step")]))
    return out


# --- events ----------------------------------------------------------------------------------------

@rule(finds=('preemptions', 'stopped_by_diagnosis', 'anomalies', 'unfinished', 'unreadable_lines'), live=EVAL)
def rule_events(run, found, _):
    out = []
    stops = [e for e in run.events if e.get("event") in ("preempted", "stop_at_step")]
    if stops:
        out.append(Finding("preemptions", "info", f"{len(stops)} stop(s): preemption or train.stop_at_step",
                           [f"step {e['step']}: {e['event']}" + (f" (signal {e.get('signal')})" if e.get("signal")
                                                                 else "") for e in stops],
                           [cause("a SIGTERM/SIGINT from the scheduler, or a planned time-boxed stop", "high")],
                           ["resume with --resume (or checkpoint.auto_resume: true)"], [e["step"] for e in stops]))
    stopped = [e for e in run.events if e.get("event") == "stop_on"]
    if stopped:
        e = stopped[-1]
        out.append(Finding("stopped_by_diagnosis", "info", f"the live diagnosis stopped the run at step {e['step']} "
                           f"(train.stop_on)", [f"step {e['step']}: {e.get('reason', '')}"],
                           [cause("the finding named in the reason (it is among the findings above)", "high")],
                           ["fix it, then start again (or resume with --resume --set train.stop_on=null to go on "
                            "as it was)"], [e["step"]]))
    guard = [e for e in run.events if e.get("event") in ("anomaly_skip", "rollback")]
    if guard:
        out.append(Finding("anomalies", "warning", f"the anomaly guard acted {len(guard)} time(s)",
                           [f"step {e['step']}: {e['event']}" + (f" ({e.get('reason')})" if e.get("reason") else "")
                            for e in guard[:10]],
                           [cause("non-finite or spiking losses the guard skipped or rolled back (see the reasons)",
                                  "high")],
                           [f"ms-llm debug nan --run-dir {quoted(run.path)}",
                            "inspect the batches at those steps"], [e["step"] for e in guard]))
    if not run.final:
        last = run.steps_done
        out.append(Finding("unfinished", "info", f"no final summary: still running, or crashed after step {last}",
                           [f"run_info.json has no 'final'; last logged step {last} of {run.max_steps}"],
                           [cause("the process is still running, or a crash or kill -9 (look at logs/)",
                                  "medium")],
                           ["resume with --resume once you know why it stopped"], [last]))
    if run.bad_lines:
        out.append(Finding("unreadable_lines", "info", f"{run.bad_lines} unreadable line(s) in metrics/stats",
                           ["a truncated last line is normal after a crash"],
                           [cause("the process was killed mid-write", "medium")],
                           ["nothing to do unless many lines are affected"]))
    return out
