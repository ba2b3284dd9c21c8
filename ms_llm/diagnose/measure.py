"""`ms-llm diagnose RUN --measure`: what the run's step costs under the other settings of the same computation,
measured here and now. Each setting is a short `ms-llm benchmark` of the run's own config (its compile cache
makes a repeat cheap) in a process of its own (MindSpore's CPU threads are set once per process):

    as run            the run's config
    accumulation      the same global batch in fewer, larger micro-batches (accumulation 1 where memory allows)
    threads           context.num_threads at the host's cores (when the run set fewer), or null
    cpu kernels       context.cpu_kernels = true on CPU (when the run turned them off)
    graph mode        context.mode = graph, jit_level null (when the run ran pynative or O0)
    monitors off      monitor.tensor_stats = null (when on: the benchmark runs its probe), checkpoint.save_interval
                      = 0 (when the run saved often)
    readers           data.num_workers doubled (when the run waited for data)
    together          every faster setting at once (when there are two or more)

Every setting is measured in each of ROUNDS rounds (one after the other: a slow spell of the host hits every
setting, not one), about TIMED_S of steps each. A measurement's tokens/s is that of its 10th-percentile step (other
processes only ever slow a step, so the fastest steps are the least disturbed; the median is kept beside it). Each
round compares every setting with the run's own settings measured in the same round; a setting is faster when it
beats them by MARGIN in every round (the host's drift between rounds cancels in the comparison). A measurement
that compiled its graphs (the compile cache had no entry for them yet) is taken again at once, loading them, so
that every setting is timed as the others are. Other processes' CPU during each measurement is recorded (host
busy time less the measuring process's own), and a measurement under contention says so. Progress and an ETA are
printed while it measures; the result is RUN/measure.json, which `ms-llm diagnose RUN` reads afterwards
(rules/measured.py).
"""
import json
import os
import resource
import subprocess
import sys
import time

from ms_llm.diagnose.common import quoted
from ms_llm.errors import UserError

MEASURE_FILE = "measure.json"
FORMAT = "ms_llm.diagnose.measure/1"
STEPS, MAX_STEPS, WARMUP = 20, 400, 3   # timed steps of each benchmark (at least, at most), untimed ones
TIMED_S = 2.0               # ... about this many seconds of them at the run's step time
ROUNDS = 2                  # every setting measured once per round, the rounds one after the other
MARGIN = 0.10               # a setting counts as faster when it beats "as run" by 10% in every round
TIMEOUT_S = 600


def variants(run):
    """[(name, [--set overrides], what it changes)] for the settings worth measuring against the run's: those below,
    and the fixes of the run's cost suspects."""
    cores = (run.info.get("device") or {}).get("cpu_count") or os.cpu_count() or 1
    cpu = ((run.info.get("device") or {}).get("target") or run.cfg("context.device_target")) == "CPU"
    out = []
    glob, micro, dp = run.cfg("train.global_batch_size"), run.cfg("train.micro_batch_size"), run.data_parallel
    accum = run.accumulation
    if glob and micro and accum > 1:
        full = glob // dp
        out.append((f"micro-batch {full} (accumulation 1)", [f"train.micro_batch_size={full}"],
                    f"micro {micro} x accumulation {accum} → micro {full} x accumulation 1, the same global batch "
                    f"{glob}"))
        if accum >= 4 and full // 2 > micro:
            half = full // 2
            out.append((f"micro-batch {half} (accumulation 2)", [f"train.micro_batch_size={half}"],
                        f"micro {micro} x accumulation {accum} → micro {half} x accumulation 2"))
    elif glob and micro and micro >= 2 and micro % 2 == 0:  # what accumulation would cost this run
        out.append((f"micro-batch {micro // 2} (accumulation {2 * accum})", [f"train.micro_batch_size={micro // 2}"],
                    f"micro {micro} x accumulation {accum} → micro {micro // 2} x accumulation {2 * accum}, the same "
                    f"global batch {glob}"))
    threads = run.cfg("context.num_threads")
    if cpu and isinstance(threads, int) and threads < cores:
        out.append((f"threads {cores}", [f"context.num_threads={cores}"], f"context.num_threads {threads} → {cores} "
                                                                          f"(the host's cores)"))
    elif cpu and threads is None and cores >= 2:
        out.append((f"threads {cores // 2}", [f"context.num_threads={cores // 2}"],
                    f"context.num_threads null → {cores // 2} (half the cores: fewer threads contend less)"))
    if cpu and run.cfg("context.cpu_kernels") is False:
        out.append(("cpu kernels on", ["context.cpu_kernels=true"], "context.cpu_kernels false → true"))
    if run.cfg("context.mode") == "pynative" or run.cfg("context.jit_level") == "O0":
        out.append(("graph mode", ["context.mode=graph", "context.jit_level=null"],
                    f"context.mode {run.cfg('context.mode')}, jit_level {run.cfg('context.jit_level')} → graph, null"))
    if run.cfg("monitor.tensor_stats") is not None:
        out.append(("tensor statistics off", ["monitor.tensor_stats=null"], "monitor.tensor_stats on → null"))
    every = run.cfg("checkpoint.save_interval") or 0
    if every and every <= 50:
        out.append(("checkpoints off", ["checkpoint.save_interval=0"], f"checkpoint.save_interval {every} → 0 "
                                                                        f"(what a save costs the loop)"))
    waits = [r.get("data_wait_frac") for r in run.train[1:] if isinstance(r.get("data_wait_frac"), (int, float))]
    if waits and sorted(waits)[len(waits) // 2] > 0.05:
        n = run.cfg("data.num_workers") or 1
        out.append((f"readers {2 * n}", [f"data.num_workers={2 * n}"], f"data.num_workers {n} → {2 * n}"))
    keys = {x.split("=")[0] for _, sets, _ in out for x in sets}
    return out + [v for v in suspect_variants(run) if not {x.split("=")[0] for x in v[1]} & keys]


def suspect_variants(run, strong_only=False):
    """[(name, sets, what)] of the cost suspects' fixes (rules/published.py: a head width, an MLP width, a speed
    setting far from every published or default value), each measured as a setting of its own."""
    from ms_llm.diagnose.rules.schedule import suspects
    from ms_llm.diagnose.rules.suspect import COST

    def what(s):  # model.num_heads 128 → 2, model.num_kv_heads 128 → 2
        return ", ".join(f"{k} {run.cfg(k)} → {v}" for k, v in (x.split("=", 1) for x in s.sets))

    return [(", ".join(s.sets), list(s.sets), what(s)) for s in suspects(run)
            if COST in s.effects and s.sets and (s.strong or not strong_only)]


def unmeasured(run, wanted):
    """The settings of `wanted` that RUN/measure.json has not measured (by their --set overrides)."""
    doc = load_measure(run) or {}
    done = {tuple(r.get("sets") or ()) for r in doc.get("results") or [] if r.get("tokens_per_s")}
    return [w for w in wanted if tuple(w[1]) not in done]


def on_run_host(run):
    """Whether this process runs where the run ran (a measurement elsewhere says nothing about the run's step)."""
    import socket

    host = run.info.get("host")
    return host is None or host == socket.gethostname()


def workdir(run):
    """Where the benchmark runs, so that the config's relative dataset path (part of the compile cache's key) reads
    as it did in training: here, or the folder above runs/<name>."""
    d = run.cfg("data.dataset_dir")
    if not isinstance(d, str) or os.path.isabs(d):
        return os.getcwd()
    for base in (os.getcwd(), os.path.dirname(os.path.dirname(os.path.abspath(run.path)))):
        if os.path.isfile(os.path.join(base, d, "manifest.json")):
            return base
    return os.getcwd()


class HostMeter:
    """Other processes' CPU while a child process runs (or, with `own=resource.RUSAGE_SELF`, while this process
    runs a measurement itself): the host's busy time less the measured processes' own."""

    def __init__(self, own=resource.RUSAGE_CHILDREN):
        self.own = own
        try:
            import psutil
        except ImportError:
            psutil = None
        self.psutil = psutil

    def __enter__(self):
        if self.psutil:
            self.psutil.cpu_percent(interval=None)
        ru = resource.getrusage(self.own)
        self.child0, self.t0 = ru.ru_utime + ru.ru_stime, time.perf_counter()
        self.other = None
        return self

    def __exit__(self, *exc):
        wall = time.perf_counter() - self.t0
        ru = resource.getrusage(self.own)
        child = ru.ru_utime + ru.ru_stime - self.child0
        if self.psutil and wall > 0:
            busy = self.psutil.cpu_percent(interval=None) / 100 * (self.psutil.cpu_count() or 1)
            self.other = max(0.0, busy - child / wall)


def bench(config, sets, cwd, steps, warmup):
    """(result dict or None, error text or None, seconds, other processes' cores)."""
    cmd = [sys.executable, "-m", "ms_llm.cli", "benchmark", "--config", config, "--steps", str(steps), "--warmup",
           str(warmup), "--json"] + [x for s in sets for x in ("--set", s)]
    t0 = time.perf_counter()
    with HostMeter() as host:
        try:
            proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S,
                                  env=dict(os.environ, GLOG_v=os.environ.get("GLOG_v", "3")))
        except subprocess.TimeoutExpired:
            return None, f"no answer within {TIMEOUT_S} s", time.perf_counter() - t0, None
    seconds = time.perf_counter() - t0
    for line in reversed(proc.stdout.strip().splitlines()):
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if isinstance(r, dict) and "tokens_per_s" in r:
            return r, None, seconds, host.other
    tail = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or ["(no output)"])[-1]
    return None, f"exit {proc.returncode}: {tail[:300]}", seconds, host.other


def timed_steps(run):
    """Timed steps of each benchmark: about TIMED_S of steps at the run's own step time (a short window is all
    scheduling noise on a shared host), within STEPS and MAX_STEPS."""
    import statistics

    ms = [r["ms_per_step"] for r in run.train[1:] if isinstance(r.get("ms_per_step"), (int, float))
          and r["ms_per_step"] > 0]
    if not ms:
        return STEPS
    return max(STEPS, min(MAX_STEPS, int(TIMED_S * 1000 / statistics.median(ms)) + 1))


def measure(run, echo=print, steps=None, warmup=WARMUP, rounds=ROUNDS, chosen=None):
    """Measure the variants of the run's config (`chosen`: only these [(name, sets, what)]); write and return
    RUN/measure.json's content (it replaces an earlier one: rounds compare settings measured side by side)."""
    from ms_llm.fileio import atomic_write_bytes
    from ms_llm.rundir.names import run_config_path

    config = run_config_path(run.path)
    if not os.path.isfile(config):
        raise UserError(f"--measure needs the config the run ran with ({config}), and '{run.path}' has none. Measure a "
                        f"config directly with 'ms-llm benchmark --config C'.")
    steps = steps or timed_steps(run)
    settings = [("as run", [], "the run's own settings")] + (variants(run) if chosen is None else list(chosen))
    cwd = workdir(run)
    total = [rounds * len(settings)]  # (+ the rounds of "together", when two settings turn out faster)
    echo(f"measure: {len(settings)} settings x {rounds} rounds of a short benchmark of {quoted(config)} ({steps} "
         f"timed steps each; the compile cache makes repeats quick): " + ", ".join(n for n, _, _ in settings))
    t_start, results, again, count = time.perf_counter(), [], [], [0]

    def one(rnd, name, sets, what, first=True):
        r, err, seconds, other = bench(config, sets, cwd, steps, warmup)
        count[0] += 1
        row = {"name": name, "sets": sets, "what": what, "round": rnd, "seconds": round(seconds, 2),
               "other_cores": None if other is None else round(other, 2)}
        if r:
            # judged on the 10th-percentile step: other processes only ever slow a step, so the fastest steps of a
            # measurement are the least disturbed (the median is kept beside it)
            fast = r.get("ms_per_step_p10") or r["ms_per_step"]
            row.update(tokens_per_s=r["tokens_per_step"] * 1000 / fast, tokens_per_s_median=r["tokens_per_s"],
                       ms_per_step=fast, ms_per_step_median=r["ms_per_step"], peak_mem_gib=r.get("peak_mem_gib"),
                       compile_s=r.get("compile_s"), graphs=r.get("graphs"))
        else:
            row["error"] = err
        done = count[0]
        left = (time.perf_counter() - t_start) / done * max(0, total[0] - done)
        echo(f"measure [{done}/{total[0]}] round {rnd}, {name}: " + (f"{row['tokens_per_s']:,.0f} tokens/s" if r else
             f"failed ({err})") + f" ({seconds:.1f} s" + (f"; other processes on {other:.1f} cores" if other and
                                                           other >= 0.5 else "") + f"); ETA {fmt_s(left)}")
        if row.get("graphs") == "filled" and first:
            # Compiled in this measurement, into the compile cache: measured again, loading its graphs from the cache
            # as the other measurements do. A step timed in the process that compiled it ran up to 30% slower here
            # (micro-batch 8 at 0.98x in round 1 against 1.36-1.41x in round 2 on two clean CI runs, 1.18x against
            # 1.74x in a third run, every other setting cached).
            total[0] += 1
            echo(f"measure: {name} compiled its graphs in that measurement; measuring it again from the compile cache")
            again.append({k: row.get(k) for k in ("name", "round", "tokens_per_s", "seconds")})
            return one(rnd, name, sets, what, first=False)
        results.append(row)
        return row

    for rnd in range(1, rounds + 1):  # rounds, not repeats in a row: a slow spell of the host hits every setting
        for name, sets, what in settings:
            one(rnd, name, sets, what)
    best = together(results)
    if len(best) >= 2:
        total[0] += rounds
        for rnd in range(1, rounds + 1):
            one(rnd, "together: " + ", ".join(r["name"] for r in best), [s for r in best for s in r["sets"]],
                "every faster setting at once")
    doc = {"format": FORMAT, "config": config, "steps": steps, "warmup": warmup, "rounds": rounds,
           "time": round(time.time(), 3), "duration_s": round(time.perf_counter() - t_start, 1),
           "cpu_count": os.cpu_count(), "results": results, "measured_again": again}
    atomic_write_bytes(os.path.join(run.path, MEASURE_FILE), json.dumps(doc, indent=1).encode("utf-8"))
    echo(f"measure: done in {fmt_s(doc['duration_s'])}; {os.path.join(run.path, MEASURE_FILE)}")
    return doc


def by_setting(rows):
    """{name: (its fastest measurement's row, {round: tokens/s})} (several measurements in a round: their median)."""
    import statistics

    out, seen = {}, {}
    for r in rows:
        if r.get("tokens_per_s"):
            seen.setdefault(r["name"], {}).setdefault(r.get("round", 1), []).append(r["tokens_per_s"])
            best = out.get(r["name"])
            out[r["name"]] = r if best is None or r["tokens_per_s"] > best["tokens_per_s"] else best
    return {name: (out[name], {k: statistics.median(v) for k, v in seen[name].items()}) for name in out}


def faster_than(rows, extra=0.0):
    """(the run's own tokens/s (its best round), the margin, [(row, factor, [per-round factors])] of the settings
    faster than the run's in every round by the margin, fastest first). Each round compares a setting with the
    run's own settings measured in the same round (the host's drift between rounds cancels); the margin is MARGIN,
    or `extra` when larger."""
    import math

    settings = by_setting(rows)
    own = next(((row, rounds) for row, rounds in settings.values() if not row["sets"]), None)
    if own is None:
        return None, None, []
    base, need, out = max(own[1].values()), max(MARGIN, extra), []
    for row, rounds in settings.values():
        ratios = [v / own[1][k] for k, v in sorted(rounds.items()) if k in own[1]]
        if row["sets"] and ratios and min(ratios) >= 1 + need:
            out.append((row, math.exp(sum(map(math.log, ratios)) / len(ratios)), ratios))
    return base, need, sorted(out, key=lambda x: -x[1])


def together(rows):
    """The fastest faster setting per key (micro-batch 8 and micro-batch 4 are one key), for one combined run."""
    _, _, fast = faster_than(rows)
    best = {}
    for r, _, _ in fast:
        key = tuple(sorted(s.split("=")[0] for s in r["sets"]))
        best.setdefault(key, r)
    return list(best.values())


NUMBER = (int, float)
# What the rules read of measure.json, by type (measure() writes them so); a result row of another shape is left out.
DOC_TYPES = {"steps": int, "warmup": int, "rounds": int, "duration_s": NUMBER, "cpu_count": int, "time": NUMBER,
             "config": str}
ROW_TYPES = {"name": str, "what": str, "round": int, "tokens_per_s": NUMBER, "tokens_per_s_median": NUMBER,
             "ms_per_step": NUMBER, "ms_per_step_median": NUMBER, "other_cores": NUMBER, "peak_mem_gib": NUMBER,
             "compile_s": NUMBER, "graphs": str, "error": str}


def load_measure(run):
    """RUN/measure.json's content, or None; rows that are not what measure() writes (a damaged or edited file) are
    left out, so that the rule reads what is sound in it."""
    from ms_llm.fileio import LEFT_OUT, read_versioned_json, typed

    doc = read_versioned_json(os.path.join(run.path, MEASURE_FILE), FORMAT)
    if doc is None:
        return None
    rows = doc.get("results") if isinstance(doc.get("results"), list) else []
    kept = []
    for row in rows:
        clean = typed(row, ROW_TYPES)
        if clean is LEFT_OUT or not all(isinstance(clean.get(k), str) for k in ("name", "what")) \
                or not isinstance(clean.get("sets"), list) or not all(isinstance(x, str) for x in clean["sets"]):
            continue
        if clean.get("round") is None:
            clean.pop("round", None)  # one round, as by_setting reads a row without one
        for key in ("tokens_per_s", "tokens_per_s_median"):
            if key in clean and not (clean[key] is None or 0 < clean[key] < float("inf")):
                clean.pop(key)  # a speed is positive and finite: the rule divides by it and takes its log
        kept.append(clean)
    return dict(typed(doc, DOC_TYPES), results=kept)


def fmt_s(s):
    m, s = divmod(int(round(s)), 60)
    return f"{m}:{s:02d}"
