"""Device and host rules of `ms-llm diagnose`: device temperature and throttling, host contention (both from
telemetry.jsonl), operators the device does not support and out-of-memory errors (MindSpore's and CANN's messages
in the run's logs/), and multi-card speedup against a single-rank sibling run."""
import glob
import os
import re
import statistics

from ms_llm.diagnose.common import Finding, cause
from ms_llm.diagnose.evidence import median_speed
from ms_llm.diagnose.registry import EVAL, OFFLINE, rule

HOT_C = 85.0            # sustained device temperature at or above this (Ascend/GPU throttle in the 85-95 C range)
HOT_SHARE, HOT_MIN = 0.5, 3  # ... in half of the samples (at least 3)
THROTTLE_DELTA_C = 5.0  # slow records this much hotter than the others: throttling coincides with slow steps
LOAD_EXCESS = 1.5       # 1-minute load average above 1.5 x the host's cores: other processes compete for the CPU
OTHER_CORES = 0.5       # ... or other processes busy on half a core or more (host busy time less this process's)
SPEEDUP_MIN = 0.7       # tokens/s per device below 70% of a single-rank sibling's: poor multi-card scaling
LOG_BYTES = 4 << 20     # the last 4 MiB of each log file are searched


# --- telemetry.jsonl -------------------------------------------------------------------------------------

def telemetry(run):
    from ms_llm.rundir.reader import read_jsonl

    recs, _ = read_jsonl(os.path.join(run.path, "telemetry.jsonl"))
    return [r for r in recs if "event" not in r and isinstance(r.get("time"), (int, float))]


def host_cores(run):
    n = (run.info.get("device") or {}).get("cpu_count")
    return n if isinstance(n, int) and n > 0 else None


def record_windows(run):
    """(step, start time, end time) of each log record, from its wall-clock `time` and `ms_per_step`."""
    interval = run.cfg("train.log_interval")
    out, prev = [], None
    for r in run.train:
        t, ms = r.get("time"), r.get("ms_per_step")
        if isinstance(t, (int, float)):
            start = prev if prev is not None else t - (ms or 0) * interval / 1000
            out.append((r["step"], start, t))
            prev = t
    return out


def samples_during(samples, start, end, slack=30.0):
    """Telemetry samples taken within [start - slack, end + slack] (the load average is a 1-minute mean)."""
    return [s for s in samples if start - slack <= s["time"] <= end + slack]


def other_cores(sample, cores=None):
    """Cores other processes kept busy at a telemetry sample: the host's busy share (cpu_util_pct, of all cores)
    less this process's own (proc_cpu_pct, of one core); None for samples without both."""
    host, own = sample.get("cpu_util_pct"), sample.get("proc_cpu_pct")
    n = sample.get("cpu_count") or cores
    if not all(isinstance(x, (int, float)) for x in (host, own, n)):
        return None
    return max(0.0, host / 100 * n - own / 100)


def cpu_samples(run):
    """Telemetry samples with host figures; the first is left out when there are others (psutil measures from
    the previous call, and the sampler's first call comes right after its reference point)."""
    samples = [s for s in telemetry(run) if isinstance(s.get("load1"), (int, float)) or "cpu_util_pct" in s]
    return samples[1:] if len(samples) > 1 else samples


def loaded(sample, cores):
    """(other processes' cores or None, load average or None, whether they compete for the CPU)."""
    other, load = other_cores(sample, cores), sample.get("load1")
    busy = (other is not None and other >= OTHER_CORES) or (isinstance(load, (int, float)) and
                                                            load > LOAD_EXCESS * cores)
    return other, load, busy


def host_contention(run, steps):
    """(loaded steps, max load, cores, max cores other processes took) when telemetry shows other processes taking
    CPU (OTHER_CORES and more, or a load average above LOAD_EXCESS x cores) around the given record steps, else
    None."""
    samples = cpu_samples(run)
    cores = host_cores(run)
    if not samples or not cores:
        return None
    windows = {s: (a, b) for s, a, b in record_windows(run)}
    hit, top, top_other = [], 0.0, 0.0
    for step in steps:
        if step not in windows:
            continue
        near = samples_during(samples, *windows[step])
        if not near:  # a short run has a sample at its start and end only: the nearest one stands for it
            t = windows[step][1]
            near = [min(samples, key=lambda s: abs(s["time"] - t))]
        judged = [loaded(s, cores) for s in near]
        top = max([top] + [ld for _, ld, _ in judged if isinstance(ld, (int, float))])
        top_other = max([top_other] + [o for o, _, _ in judged if o is not None])
        if any(busy for *_, busy in judged):
            hit.append(step)
    return (hit, top, cores, top_other) if hit else None


def run_contention(run):
    """(median cores other processes took, the most they took, cores, share of samples contended) over the whole
    run when other processes took CPU for at least half of it, else None."""
    samples, cores = cpu_samples(run), host_cores(run)
    if not samples or not cores:
        return None
    judged = [loaded(s, cores) for s in samples]
    busy = sum(b for *_, b in judged) / len(judged)
    others = [o for o, _, _ in judged if o is not None]
    if busy < 0.5:
        return None
    return (statistics.median(others) if others else None, max(others) if others else None, cores, busy)


def run_contention_text(c):
    med, top, cores, share = c
    if med is None:
        return (f"telemetry: the host's load average stayed above {LOAD_EXCESS:g} x its {cores} cores in "
                f"{100 * share:.0f}% of the samples: other processes competed for the CPU through the run")
    return (f"telemetry: other processes kept {med:.1f} of the host's {cores} cores busy (median over the samples, "
            f"up to {top:.1f}; host busy time less this process's own), contended in {100 * share:.0f}% of the "
            f"samples")


@rule(finds=('device_temperature',), reads=('throughput_uneven',), live=EVAL)
def rule_temperature(run, found, _):
    samples = [s for s in telemetry(run) if s.get("devices")]
    if not samples:
        return None
    temps = [(s, max((d.get("temp_c") for d in s["devices"] if isinstance(d.get("temp_c"), (int, float))),
                     default=None)) for s in samples]
    temps = [(s, t) for s, t in temps if t is not None]
    if not temps:
        return None
    hot = [(s, t) for s, t in temps if t >= HOT_C]
    slow = set(found["throughput_uneven"].steps) if "throughput_uneven" in found else set()
    hot_slow = []
    if slow:
        windows = [(a, b) for st, a, b in record_windows(run) if st in slow]  # at most 10 (the finding's steps)
        near = [any(a - 30 <= s["time"] <= b + 30 for a, b in windows) for s, _ in temps]
        slow_t = [t for (_, t), n in zip(temps, near) if n]
        rest_t = [t for (_, t), n in zip(temps, near) if not n]
        if slow_t and rest_t and statistics.median(slow_t) - statistics.median(rest_t) >= THROTTLE_DELTA_C:
            hot_slow = [statistics.median(slow_t), statistics.median(rest_t)]
    sustained = len(hot) >= HOT_MIN and len(hot) >= HOT_SHARE * len(temps)
    if not sustained and not hot_slow:
        return None
    peak = max(temps, key=lambda p: p[1])
    power = [d.get("power_w") for s, _ in temps for d in s["devices"] if isinstance(d.get("power_w"), (int, float))]
    ev = [f"device temperature ≥ {HOT_C:.0f} C in {len(hot)} of {len(temps)} telemetry samples; peak {peak[1]:.0f} C"
          + (f"; power {min(power):.0f}-{max(power):.0f} W" if power else "")]
    if hot_slow:
        ev.append(f"during the slow records (steps {', '.join(map(str, sorted(slow)[:8]))}) the devices ran at "
                  f"{hot_slow[0]:.0f} C, {hot_slow[0] - hot_slow[1]:.0f} C hotter than during the others: throttling "
                  f"coincides with the slow steps")
    causes = [cause("cooling: fans, airflow or the machine room's temperature (check the heat sink and the "
                    "room)", "high" if sustained else "medium"),
              cause("power capping or throttling by the driver under sustained load", "medium")]
    actions = ["npu-smi info (or nvidia-smi -q -d TEMPERATURE,PERFORMANCE) for throttle reasons and fan state",
               "check the cooling system; lower the load (fewer concurrent jobs) until it is fixed",
               "keep monitor.telemetry_interval_s on to compare with a healthy node"]
    return [Finding("device_temperature", "warning", f"device temperature high: {peak[1]:.0f} C"
                    + (" and throttling coincides with slow steps" if hot_slow else ""), ev, causes, actions,
                    sorted(slow)[:10] if hot_slow else [])]


# --- logs/*.log --------------------------------------------------------------------------------------------

UNSUPPORTED = [  # (pattern, what it names) from MindSpore's and CANN's error texts
    (re.compile(r"Unsupported op \[(?P<op>[^\]]+)\] on (?P<dev>\w+)"), "MindSpore kernel select"),
    (re.compile(r"Can not select a valid kernel info for \[(?P<op>[^\]]+)\] in (?P<dev>AI CORE or AI CPU)"),
     "MindSpore Ascend kernel select"),
    (re.compile(r"No supported Ops kernel and engine are found for \[(?P<node>[^\]]*)\], optype \[(?P<op>[^\]]*)\]"),
     "CANN EZ3003/E13003"),
    (re.compile(r"Optype \[(?P<op>[^\]]*)\] of Ops kernel \[(?P<node>[^\]]*)\] is unsupported"), "CANN EZ3002"),
]
OOM = [
    re.compile(r"Out of Memory!!!.*|(?:Device\(id:\d+\)|device) memory isn't enough.*", re.I),
    re.compile(r"Memory not enough:.*"),
    re.compile(r"Allocate (?:continuous )?memory failed.*", re.I),
    re.compile(r"EL0004:.*"),
    re.compile(r"^\s*MemoryError\b.*|Error: .*\bout of memory\b.*", re.I),
]


def log_dirs(run, extra=None):
    """Where a run's logs are: <run>/logs (console and per-rank logs), <run> itself, msrun's --log_dir when it is
    <run>_logs (the README's convention; msrun cannot write into the run directory, which must start empty), and
    `extra` (ms-llm diagnose --logs DIR)."""
    dirs = [os.path.join(run.path, "logs"), run.path, os.path.normpath(run.path) + "_logs"]
    return dirs + ([extra] if extra else [])


def log_files(run, extra=None):
    files = []
    for d in log_dirs(run, extra):
        files += sorted(glob.glob(os.path.join(d, "*.log")))
    return [f for f in dict.fromkeys(files) if os.path.isfile(f)]


def scan_logs(run, extra=None):
    """{"unsupported": [(file, line no, op, device, text)], "oom": [(file, line no, text)]} over the run's logs."""
    hits = {"unsupported": [], "oom": []}
    for path in log_files(run, extra):
        try:
            with open(path, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - LOG_BYTES))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            continue
        name = os.path.relpath(path, os.path.dirname(os.path.normpath(run.path)))
        for no, line in enumerate(text.splitlines(), 1):
            for pat, _ in UNSUPPORTED:
                m = pat.search(line)
                if m:
                    d = m.groupdict()
                    hits["unsupported"].append((name, no, d.get("op") or "?", d.get("dev") or "", line.strip()[:300]))
                    break
            else:
                for pat in OOM:
                    m = pat.search(line)
                    if m:
                        hits["oom"].append((name, no, line.strip()[:300]))
                        break
    return hits


@rule(finds=('unsupported_op', 'out_of_memory'), live=OFFLINE)
def rule_logs(run, found, _):
    hits = scan_logs(run, getattr(run, "extra_logs", None))
    out = []
    if hits["unsupported"]:
        ops = sorted({h[2] for h in hits["unsupported"]})
        devs = sorted({h[3] for h in hits["unsupported"] if h[3]})
        ev = [f"{f}:{no}: {text}" for f, no, _, _, text in hits["unsupported"][:5]]
        wrong_target = any(d in ("CPU", "GPU") for d in devs) and any(
            k in op for op in ops for k in ("FlashAttention", "PromptFlash", "IncreFlash", "Rope", "RmsNorm",
                                            "MatmulAllReduce", "GroupedMatmul"))
        used = (run.info.get("device") or {}).get("target")
        ev.append(f"context.device_target = {run.cfg('context.device_target')}"
                  + (f" (this run: {used})" if used and used != run.cfg("context.device_target") else ""))
        causes = []
        if wrong_target:
            causes.append(cause(f"an Ascend-only operator ({', '.join(ops)}) on {', '.join(devs)}: the device target "
                                f"is not the one the model was written for", "high"))
        causes.append(cause(f"the model uses an operator without a kernel for this device or dtype ({', '.join(ops)}): "
                            f"a custom operator, or one this device/CANN version does not cover",
                            "medium" if wrong_target else "high"))
        causes.append(cause("a CANN/MindSpore version mismatch (the operator library lacks it: check the OPP "
                            "component and `ms-llm doctor`)", "low"))
        actions = [f"replace {', '.join(ops)} with native MindSpore ops or a composition of them (mindspore.ops "
                   f"lists each operator's devices), or write a custom operator (ops.Custom)",
                   "--set context.device_target=Ascend if the model needs Ascend operators" if wrong_target else
                   "cast the operator's inputs to a dtype its kernel supports (the error lists the supported ones)",
                   "ms-llm doctor (MindSpore, CANN and driver versions)"]
        out.append(Finding("unsupported_op", "error", f"operator not supported on this device: {', '.join(ops)}", ev,
                           causes, actions))
    if hits["oom"]:
        ev = [f"{f}:{no}: {text}" for f, no, text in hits["oom"][:5]]
        recompute = run.cfg("recompute_config.recompute") or run.cfg("recompute_config.select_recompute")
        sharded = run.cfg("parallel_config.optimizer_shard")
        micro = run.cfg("train.micro_batch_size")
        causes = [cause("activations of the micro batch"
                        + (" (recompute is already on)" if recompute else " (no recompute)"), "high"),
                  cause("weights, gradients and AdamW states (16 bytes per parameter)"
                        + (", already sharded" if sharded else ", replicated on every data-parallel rank"), "medium"),
                  cause("memory fragmentation near the limit, or a leak (see memory_growth)", "low")]
        actions = ([] if recompute else ["--set recompute_config.recompute=true (or select_recompute=true)"]) + \
                  ([] if sharded else ["--set parallel_config.optimizer_shard=true"]) + \
                  [f"--set train.micro_batch_size={max(1, micro // 2)} (global batch kept: more accumulation)",
                   "ms-llm plan --config <config> (per-device memory, term by term)"]
        out.append(Finding("out_of_memory", "error", "out of memory", ev, causes, actions))
    return out


# --- multi-card speedup ----------------------------------------------------------------------------------

@rule(finds=('poor_speedup',), live=EVAL)
def rule_speedup(run, found, _):
    """Tokens/s per device against a single-rank run of the same model and micro batch under the same folder (the
    only evidence there is: nothing records the communication share during training). Not judged on CPU, where
    the ranks share the host's cores."""
    world = (run.info.get("parallel") or {}).get("world_size") or 1
    target = (run.info.get("device") or {}).get("target") or run.cfg("context.device_target")
    if world <= 1 or target == "CPU":
        return None
    mine = median_speed(run)
    single = single_rank_sibling(run)
    if mine is None or single is None:
        return None
    base, sib = single
    eff = mine / world / base
    if eff >= SPEEDUP_MIN:
        return None
    ev = [f"{mine:,.0f} tokens/s on {world} devices = {mine / world:,.0f} per device; {base:,.0f} tokens/s on one "
          f"device in {sib.name} (same model and micro batch): scaling efficiency {100 * eff:.0f}%"]
    causes = [cause("communication: gradient all-reduce not overlapped with compute, or low HCCL bandwidth", "medium"),
              cause("a small model on many devices: communication is a large share of a short step", "medium"
                    if (run.cfg("model.hidden_size") or 0) < 2048 else "low"),
              cause("a straggler device or uneven load (see logs/rank_<r>.log)", "low")]
    actions = ["profile a window: --set monitor.profile.start_step=20 --set monitor.profile.stop_step=30 (the "
               "top-10 table shows the communication operators' share)",
               f"--set train.micro_batch_size={2 * (run.cfg('train.micro_batch_size') or 1)} (more compute per "
               f"all-reduce, if memory allows)", "check HCCL bandwidth between the devices (hccl_test)",
               "ms-llm plan --config <config> --devices N --search (layouts with less communication)"]
    return [Finding("poor_speedup", "warning", f"multi-device speedup {eff * world:.1f}x on {world} devices "
                    f"({100 * eff:.0f}% efficiency)", ev, causes, actions)]


def single_rank_sibling(run):
    from ms_llm.rundir.reader import is_run_dir, load_run

    parent = os.path.dirname(os.path.abspath(run.path))
    keys = ("model", "train.micro_batch_size", "precision.compute_dtype")
    for name in sorted(os.listdir(parent))[:200]:
        p = os.path.join(parent, name)
        if p == os.path.abspath(run.path) or not is_run_dir(p):
            continue
        try:
            other = load_run(p)
        except Exception:  # noqa: BLE001
            continue
        if ((other.info.get("parallel") or {}).get("world_size") or 1) != 1:
            continue
        if all((other.config.get(k) if "." not in k else other.cfg(k)) == (run.config.get(k) if "." not in k else
                                                                          run.cfg(k)) for k in keys):
            base = median_speed(other)
            if base:
                return base, other
    return None


def contention_text(c):
    hit, top, cores, other = c
    what = (f"other processes kept up to {other:.1f} of {cores} cores busy" if other >= OTHER_CORES else
            f"host load average up to {top:.1f} on {cores} cores (> {LOAD_EXCESS:g} x cores)")
    return f"telemetry: {what} around steps {', '.join(map(str, hit[:8]))}: other processes compete for the CPU"

