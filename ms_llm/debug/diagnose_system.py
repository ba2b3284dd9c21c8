"""Rules 6-12 of `ms-llm diagnose`: throughput, loss scaling, communication, memory, clipping, tensor
statistics flags and events."""
import statistics

from ms_llm.debug.diagnose_common import (CLIP_RATIO, CLIP_SHARE, DATA_WAIT_FRAC, Finding, LOW_MFU,
    LOW_MFU_MIN_HIDDEN, MEMORY_FRAC, MIN_RECORDS, OVERFLOW_MIN, OVERFLOW_SHARE, SCALE_DROPS_MIN, SCALE_DROPS_SHARE,
    SLOW_FRAC, SLOW_MIN_RECORDS, SLOW_SHARE, finite, g, lr_actions, points, quoted, steps_text)

# --- 6. throughput -------------------------------------------------------------------------------------

def steady(run, key):
    """(step, value) of `key` without the first log record, which carries the warm-up."""
    pts = points(run.train, key)
    return pts[1:] if len(pts) > 1 else pts


def rule_data_wait(run, found, _):
    pts = steady(run, "data_wait_frac")
    if not pts or statistics.median(v for _, v in pts) <= DATA_WAIT_FRAC:
        return None
    med = statistics.median(v for _, v in pts)
    high = [s for s, v in pts if v > DATA_WAIT_FRAC]
    workers = run.cfg("data.num_workers", 1)
    ev = [f"median data wait {100 * med:.0f}% of step time (max {100 * max(v for _, v in pts):.0f}%); above "
          f"{100 * DATA_WAIT_FRAC:.0f}% in {len(high)} of {len(pts)} records (steps {steps_text(high)})",
          f"data.num_workers = {workers}"]
    causes = [f"too few reader threads (data.num_workers = {workers})",
              "the dataset on slow or network storage (OBS/NFS mount): reads stall each step",
              "tokenizing on the fly instead of reading preprocessed MindRecord",
              "CPU contention on the host (other jobs, too many ranks per host)"]
    actions = [f"--set data.num_workers={max(2, 2 * workers)}", "copy the dataset to local disk (or cache it)",
               "ms-llm preprocess --config <config> (packed MindRecord once, read fast afterwards)"]
    return [Finding("data_wait", "warning", f"input pipeline stalls: {100 * med:.0f}% of step time waiting for data",
                    ev, causes, actions, high[:10])]


def rule_uneven(run, found, _):
    pts = steady(run, "tokens_per_s")
    if len(pts) < SLOW_MIN_RECORDS:
        return None
    med = statistics.median(v for _, v in pts)
    slow = [(s, v) for s, v in pts if v < SLOW_FRAC * med]
    if len(slow) < 2 or len(slow) < SLOW_SHARE * len(pts):
        return None
    waits = dict(points(run.train, "data_wait_frac"))
    slow_wait = statistics.median(waits.get(s, 0.0) for s, _ in slow)
    ev = [f"median {med:,.0f} tokens/s; {len(slow)} of {len(pts)} records below {100 * SLOW_FRAC:.0f}% of it: "
          + ", ".join(f"step {s}: {v:,.0f}" for s, v in slow[:8]),
          f"median data wait in the slow records: {100 * slow_wait:.0f}%"]
    causes = (["data stalls (the slow records wait for data)"] if slow_wait > DATA_WAIT_FRAC else []) + [
        "host contention: other processes, CPU frequency scaling, swapping",
        "a straggler rank or shared network in multi-card runs",
        "recompilation (changing shapes) or synchronous checkpoint writes"]
    actions = ["--set checkpoint.async_save=true", "profile a slow window: --set monitor.profile.start_step=<step> "
               "--set monitor.profile.stop_step=<step+10>", "check the host: top / npu-smi info for other jobs"]
    return [Finding("throughput_uneven", "warning", "uneven (saw-toothed) throughput", ev, causes, actions,
                    [s for s, _ in slow[:10]])]


def rule_low_mfu(run, found, _):
    pts = steady(run, "mfu")
    hidden = run.cfg("model.hidden_size", 0)
    if not pts or hidden < LOW_MFU_MIN_HIDDEN:
        return None  # small models cannot fill a device: low MFU is expected, not actionable
    med = statistics.median(v for _, v in pts)
    if med <= 0 or med >= LOW_MFU:
        return None
    ev = [f"median MFU {100 * med:.1f}% (hidden {hidden}, micro batch {run.cfg('train.micro_batch_size')}, "
          f"mode {run.cfg('context.mode')})"]
    for op in (run.final.get("profile_top_ops") or [])[:3]:
        ev.append(f"profile: {op.get('op')} {g(op.get('ms_per_step'))} ms/step ({100 * (op.get('share') or 0):.0f}%)")
    causes = ["micro batch too small to keep the device busy", "pynative mode or jit_level O0 (no graph fusion)",
              "full recompute where select_recompute would do", "data waits or communication (see those findings)"]
    actions = [f"--set train.micro_batch_size={2 * run.cfg('train.micro_batch_size', 1)} (if memory allows)",
               "--set context.mode=graph", "--set recompute_config.select_recompute=true instead of full recompute",
               "ms-llm benchmark --config <config> and a profile window (monitor.profile) for the top ops"]
    return [Finding("low_mfu", "warning", f"low MFU: {100 * med:.1f}%", ev, causes, actions)]


# --- 7. loss-scale overflows ---------------------------------------------------------------------------

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
    causes = (["float16 range: gradients or activations exceed 65504 or underflow"] if fp16 else
              ["non-finite gradients outside float16: a NaN source in the graph, not a range problem"])
    causes += [f"LR too high: weights and activations grow (train.lr = {g(run.cfg('train.lr'))})",
               f"loss-scale settings: init_scale {g(run.cfg('precision.init_scale'))}, scale_window "
               f"{run.cfg('precision.scale_window')}"]
    actions = (["--set precision.compute_dtype=bfloat16 (no loss scale needed)"] if fp16 else []) + [
        lr_actions(run)[0], f"ms-llm debug nan --run-dir {quoted(run.path)}",
        f"--set precision.scale_window={2 * run.cfg('precision.scale_window', 1000)} (fewer growth attempts)"]
    return [Finding("loss_scale", "warning", "frequent loss-scale overflows", ev, causes, actions, drops[:10])]


# --- 9. memory -----------------------------------------------------------------------------------------

def rule_memory(run, found, limit):
    mems = points(run.train, "mem_gib")
    peak = max([v for _, v in mems] + ([run.final["peak_mem_gib"]] if finite(run.final.get("peak_mem_gib")) else []),
               default=None)
    if peak is None or not limit or peak < MEMORY_FRAC * limit:
        return None
    at = max(mems, key=lambda p: p[1])[0] if mems else None
    micro = run.cfg("train.micro_batch_size", 1)
    ev = [f"peak memory {peak:.2f} GiB" + (f" (step {at})" if at else "") + f" = {100 * peak / limit:.0f}% of the "
          f"{limit:.1f} GiB limit"]
    recompute = run.cfg("recompute_config.recompute") or run.cfg("recompute_config.select_recompute")
    sharded = run.cfg("parallel_config.optimizer_shard")
    causes = ["activations of the micro batch (grow with micro_batch_size x seq_length x hidden x layers)"
              + (" — recompute is already on" if recompute else ""),
              "weights, gradients and AdamW states (16 bytes per parameter in float32)"
              + (", already sharded" if sharded else ", replicated on every data-parallel rank"),
              "memory fragmentation close to the limit"]
    actions = ([] if recompute else
               ["recompute_config.recompute: true (or select_recompute: true for a cheaper partial recompute)"])
    actions += [] if sharded else ["parallel_config.optimizer_shard: true (AdamW states split over data-parallel "
                                   "ranks)"]
    actions.append(f"--set train.micro_batch_size={max(1, micro // 2)} (global batch kept: more accumulation)")
    return [Finding("memory", "warning", f"memory near the limit: {100 * peak / limit:.0f}%", ev, causes, actions,
                    [at] if at else [])]


# --- 10. gradients always clipped ----------------------------------------------------------------------

def rule_always_clipped(run, found, _):
    clip = run.cfg("train.clip_grad", 0)
    # only the stretch before a divergence or NaN: norms that grow with it are that finding's evidence
    stops = [found[k].steps[0] for k in ("divergence", "loss_nonfinite") if k in found and found[k].steps]
    gn = [v for s, v in points(run.train, "grad_norm") if not stops or s < min(stops)]
    if not clip or len(gn) < MIN_RECORDS:
        return None
    share = sum(v > clip for v in gn) / len(gn)
    med = statistics.median(gn)
    if share < CLIP_SHARE or med < CLIP_RATIO * clip:
        return None
    accum = run.accumulation
    ev = [f"grad_norm above train.clip_grad = {g(clip)} in {100 * share:.0f}% of {len(gn)} records; median "
          f"{g(med)} = {med / clip:.1f}x the clip",
          f"accumulation steps = global {run.cfg('train.global_batch_size')} / (micro "
          f"{run.cfg('train.micro_batch_size')} x data-parallel {run.data_parallel}) = {accum}"]
    causes = [f"clip_grad too small for this model: every update is rescaled (norms are routinely {g(med)})",
              "LR too high keeps the gradients large"]
    actions = [f"--set train.clip_grad={med:.2g} (about the typical norm) if the run is otherwise healthy"]
    if accum > 1:
        causes.insert(0, f"gradient accumulation without dividing the loss by the accumulation steps: norms come out "
                         f"{accum}x too large (accumulation = {accum})")
        actions.insert(0, f"compare with accumulation 1: --set train.global_batch_size="
                          f"{run.cfg('train.global_batch_size') // accum} for a few steps; a grad_norm about "
                          f"{accum}x smaller means the loss is not divided by the accumulation steps")
    return [Finding("always_clipped", "warning", "gradients always clipped", ev, causes, actions)]


# --- 11. stats.jsonl -----------------------------------------------------------------------------------

FLAG_TEXT = {
    "vanishing": ("vanishing gradients/activations", ["too small init or post-norm without residual scaling",
                                                      "dead activations (zero_frac high)", "LR far too low"],
                  ["check model.init_std and the layers named", "--set monitor.tensor_stats.every=50 to follow them"]),
    "exploding": ("exploding gradients/activations", ["LR too high", "no clipping", "float16 range"],
                  ["--set train.clip_grad=1.0", "lower train.lr", "--set train.anomaly=true to skip spikes"]),
    "dtype_mismatch": ("dtype mismatch", ["a parameter, gradient or optimizer state in an unexpected dtype "
                                          "(float16 master weights lose small updates)"],
                       ["keep master weights and optimizer states float32; check precision.compute_dtype casts"]),
    "grad_scale_mismatch": ("gradient scale mismatch", ["the loss is not divided by the accumulation steps "
                                                        "(gradient norm = accumulation x the mean loss's)",
                                                        "a custom loss that is not the mean over tokens"],
                            ["divide the loss by train.global_batch_size / (micro_batch_size x data_parallel)",
                             "compare with a run at accumulation 1"]),
}


def rule_stats(run, found, _):
    out = []
    for flag, (what, causes, actions) in FLAG_TEXT.items():
        recs = [r for r in run.stats if r.get("kind") == "flag" and r.get("flag") == flag]
        if recs:
            names = sorted({r.get("name", "?") for r in recs})
            ev = [f"{r.get('name')} at step {r.get('step')}: {r.get('detail', '')}".rstrip(": ") for r in recs[:10]]
            out.append(Finding(f"stats_{flag}", "warning", f"{what} in {len(names)} layer(s): "
                               f"{', '.join(names[:5])}" + (" ..." if len(names) > 5 else ""), ev, causes,
                               actions, sorted({r.get("step") for r in recs if isinstance(r.get("step"), int)})[:10]))
    bad = [r for r in run.stats if r.get("kind") != "flag" and finite(r.get("nonfinite")) and r["nonfinite"] > 0]
    if bad:
        first = min(bad, key=lambda r: r.get("step", 0))
        out.append(Finding("stats_nonfinite", "error", f"non-finite values first in {first.get('name')} "
                           f"({first.get('kind')}) at step {first.get('step')}",
                           [f"{r.get('name')} ({r.get('kind')}) step {r.get('step')}: {g(r['nonfinite'])} non-finite"
                            for r in bad[:10]], ["the first layer listed is where NaN/Inf enter"],
                           [f"ms-llm debug nan --run-dir {quoted(run.path)}"], [first.get("step")]))
    return out


# --- 12. events ----------------------------------------------------------------------------------------

def rule_events(run, found, _):
    out = []
    stops = [e for e in run.events if e.get("event") in ("preempted", "stop_at_step")]
    if stops:
        out.append(Finding("preemptions", "info", f"{len(stops)} stop(s): preemption or train.stop_at_step",
                           [f"step {e['step']}: {e['event']}" + (f" (signal {e.get('signal')})" if e.get("signal")
                                                                 else "") for e in stops],
                           ["a SIGTERM/SIGINT from the scheduler, or a planned time-boxed stop"],
                           ["resume with --resume (or checkpoint.auto_resume: true)"], [e["step"] for e in stops]))
    guard = [e for e in run.events if e.get("event") in ("anomaly_skip", "rollback")]
    if guard:
        out.append(Finding("anomalies", "warning", f"the anomaly guard acted {len(guard)} time(s)",
                           [f"step {e['step']}: {e['event']}" + (f" ({e.get('reason')})" if e.get("reason") else "")
                            for e in guard[:10]],
                           ["non-finite or spiking losses the guard skipped or rolled back (see the reasons)"],
                           [f"ms-llm debug nan --run-dir {quoted(run.path)}",
                            "inspect the batches at those steps"], [e["step"] for e in guard]))
    if not run.final:
        last = run.steps_done
        out.append(Finding("unfinished", "info", f"no final summary: still running, or crashed after step {last}",
                           [f"run_info.json has no 'final'; last logged step {last} of {run.max_steps}"],
                           ["the process is still running", "a crash or kill -9 (look at logs/)"],
                           ["resume with --resume once you know why it stopped"], [last]))
    if run.bad_lines:
        out.append(Finding("unreadable_lines", "info", f"{run.bad_lines} unreadable line(s) in metrics/stats",
                           ["a truncated last line is normal after a crash"], ["the process was killed mid-write"],
                           ["nothing to do unless many lines are affected"]))
    return out
