"""Where the wall time went (`ms-llm diagnose`), from the accounting of ms_llm.rundir.walltime: a run that spends a
large share of its time on something other than training steps (evaluation, checkpoint writes, report refreshes,
per-step monitors) names it, with its share and the key that controls it; and a run much slower per step than this
machine runs the same config (a 20-step `ms-llm benchmark`, the reference) names the settings that differ.

Shares are judged on the recurring cost of each phase (its typical occurrence x how often it happened), against the
steps' own time: one-off costs (each process's first evaluation and first statistics probe compile their graphs) do
not grow with the run and are left out of the typical cost.
"""
import json
import os
import statistics

from ms_llm.diagnose.common import Finding, cause, finite, g, quoted
from ms_llm.rundir.walltime import HOOK_KEYS, HOOK_NAMES, account, describe, duration, segments
from ms_llm.diagnose.evidence import steady
from ms_llm.diagnose.registry import EVAL, rule

PHASE_SHARE = 0.30      # a recurring phase taking 30% of the recurring time (training steps + data wait + phases)
TARGET_SHARE = 0.05     # the suggested settings bring it to about this
MIN_LOOP_S = 5.0        # runs whose recurring time (steps + evaluations + ...) is shorter are not judged
MIN_TIMES = 3           # ... nor a phase that happened fewer times (its cost is then mostly a one-off)
ONE_OFF_SHARE, ONE_OFF_MIN_S = 0.25, 60.0   # startup or compile above 25% of the wall and a minute: a note
SLOWER = 2.0            # the run's median step time at least 2x the benchmark's: slower than this machine
BENCHMARK_FILE = "benchmark.json"
SMALL_MICRO_TOKENS = 4096  # accumulating micro-batches this small costs launch overhead per micro-batch (a note)
NOTE_ONLY_HOOKS = ("ProfileWindow",)  # a profiled window is slow by design and bounded: a note
# settings that change how fast a step runs, not what it computes: (key, the schema default the benchmark uses)
SPEED_KEYS = (("context.mode", "graph"), ("context.jit_level", None), ("context.num_threads", None),
              ("context.cpu_kernels", True), ("data.num_workers", 1), ("monitor.nan_check", False),
              ("monitor.tensor_stats", None), ("monitor.profile", None), ("train.anomaly", None),
              ("checkpoint.save_interval", 0))


def recurring(run, acc):
    """{phase label: (recurring seconds, occurrences, typical seconds, config key[, hook])} for evaluation,
    checkpoints, report refreshes and each hook. The costliest occurrence in each process compiles what it runs (the
    evaluation graph, the statistics probe; usually the first, but a hook's trivial call that a loaded host made
    measurable can come before it): the typical cost is the median of the others (of the costliest ones when there
    are no others), and the recurring cost that times the occurrences."""
    found = {}  # label -> (key, hook, [(the one-off of its process?, seconds)])
    for seg in segments(run):
        here = {}  # label -> (key, hook, [seconds]) of this process
        for r in sorted(seg, key=lambda r: (r.get("step", 0), r.get("elapsed_s") or 0)):
            items = []
            if "val_loss" in r:
                items.append(("evaluation", "train.eval_interval / train.eval_steps", "", r.get("duration_s")))
            elif "tasks" in r:
                items.append(("task evaluation", "eval.interval / eval.limit / eval.tasks", "", r.get("duration_s")))
            elif r.get("event") == "checkpoint":
                items.append(("checkpoints", "checkpoint.save_interval / checkpoint.async_save", "",
                              r.get("duration_s")))
            elif r.get("event") == "report":
                items.append(("report", "monitor.report", "", r.get("duration_s")))
            elif r.get("event") == "diagnose":
                items.append((HOOK_NAMES["LiveDiagnosis"], HOOK_KEYS["LiveDiagnosis"], "LiveDiagnosis",
                              r.get("duration_s")))
            elif "loss" in r and r.get("hooks_s"):
                items += [(HOOK_NAMES.get(h, h), HOOK_KEYS.get(h, ""), h, v) for h, v in r["hooks_s"].items()]
            for label, key, hook, v in items:
                if finite(v):
                    here.setdefault(label, (key, hook, []))[2].append(v)
        for label, (key, hook, values) in here.items():
            top = values.index(max(values))
            found.setdefault(label, (key, hook, []))[2].extend((i == top, v) for i, v in enumerate(values))
    out = {}
    for label, (key, hook, values) in found.items():
        later = [v for first, v in values if not first]
        typical = statistics.median(later or [v for _, v in values])
        out[label] = (typical * len(values), len(values), typical, key) + ((hook,) if hook else ())
    return out


@rule(finds=('wall_time*',), live=EVAL)
def rule_wall_time(run, found, _):
    acc = account(run)
    if acc is None:
        return None
    base = acc["phases"]["training"] + acc["phases"]["data wait"]
    phases = recurring(run, acc)
    total = base + sum(p[0] for p in phases.values())
    if total < MIN_LOOP_S or base <= 0:
        return None
    heavy = [(label, p) for label, p in phases.items() if p[0] / total >= PHASE_SHARE]
    out = []
    notes = [(label, p) for label, p in heavy if len(p) > 4 and p[4] in NOTE_ONLY_HOOKS]
    warn = [(label, p) for label, p in heavy if (label, p) not in notes and p[1] >= MIN_TIMES]
    step_s = acc["phases"]["training"] / max(1, trained_steps(run))
    if warn:
        label, p = max(warn, key=lambda x: x[1][0])
        ev = [f"wall-time accounting (metrics.jsonl): {describe(acc)}" + ("" if acc["measured"] else
              " (some records predate the timing fields: their time is in 'the rest')")]
        for lab, q in sorted(warn, key=lambda x: -x[1][0]):
            calls = calls_per_value(run, q)
            times = f"{q[1]} time(s), {g(q[2])} s each (median)" if calls == 1 else \
                f"{q[1] * calls} time(s) in {q[1]} log records, {g(q[2])} s per record (median; {g(q[2] / calls)} s " \
                "each)"
            ev.append(f"{lab}: {times} = {100 * q[0] / total:.0f}% of the recurring time (steps "
                      f"{duration(base)}); controlled by {q[3]}")
        ev.append(f"a training step takes {1000 * step_s:.0f} ms: one {label} costs as much as "
                  f"{q_steps(p[2] / calls_per_value(run, p), step_s)} steps")
        causes, actions = [], []
        for lab, q in sorted(warn, key=lambda x: -x[1][0]):
            c, a = phase_advice(run, lab, q, step_s)
            causes.append(cause(c, "high"))
            actions += a
        measured = acc["phases"].get(label, acc["hooks"].get(p[4] if len(p) > 4 else "", 0.0))
        out.append(Finding("wall_time", "warning", f"{label} takes {100 * p[0] / total:.0f}% of the time the run "
                           f"spends training ({100 * measured / acc['wall_s']:.0f}% of its wall time), not the "
                           f"training steps: {p[3]}", ev, causes, actions))
    for label, p in notes:
        out.append(Finding("wall_time_profile", "info", f"note: the {label} took {100 * p[0] / total:.0f}% of the "
                           f"run's time ({p[3]})", [describe(acc)], [cause("profiling slows the steps it records, "
                                                                            "by design", "high")],
                           [f"profile fewer steps ({p[3]}.stop_step - start_step) once the table is read"]))
    wall = acc["wall_s"]
    for phase, key in (("startup", "data.source / the dataset's first checksum pass"),
                       ("compile", "context.compile_cache")):
        sec = acc["phases"][phase]
        if sec >= ONE_OFF_MIN_S and sec / wall >= ONE_OFF_SHARE:
            why = ("the graphs are compiled again by every process: context.compile_cache = "
                   f"{run.cfg('context.compile_cache')}" if phase == "compile" else
                   "preprocessing (data.source without a dataset), checksumming a new dataset, building the model")
            out.append(Finding(f"wall_time_{phase}", "info", f"note: {phase} took {duration(sec)} = "
                               f"{100 * sec / wall:.0f}% of the wall time", [describe(acc)], [cause(why, "medium")],
                               [f"{key}: a one-off cost; it matters for short or often-restarted runs"]))
    return out


def trained_steps(run):
    steps = [r["step"] for r in run.train]
    return (max(steps) - (min(steps) - (run.cfg("train.log_interval") or 1))) if steps else 1


def calls_per_value(run, p):
    """How many calls of a phase one of its values holds: a log record's hooks_s sums the calls of its interval
    (every step's NaN check; a tensor-statistics probe every monitor.tensor_stats.every steps); other phases are
    timed once per call."""
    hook = p[4] if len(p) > 4 else ""
    interval = run.cfg("train.log_interval") or 1
    if hook == "TensorStats":
        return max(1, interval // (run.cfg("monitor.tensor_stats.every") or 1))
    return interval if hook == "NanWatch" else 1


def q_steps(seconds, step_s):
    if step_s <= 0:
        return "?"
    n = seconds / step_s
    return f"{n:,.0f}" if n >= 10 else f"{n:.2g}"


def phase_advice(run, label, p, step_s):
    """(cause sentence, actions) for one heavy phase."""
    sec_each = p[2]
    per = sec_each / step_s if step_s > 0 else 0
    if label == "evaluation":
        every, batches = run.cfg("train.eval_interval"), run.cfg("train.eval_steps")
        per_batch = (run.cfg("train.global_batch_size") or 0) * (run.cfg("model.seq_length") or 0)
        tokens = next((r.get("val_tokens") for r in run.evals if finite(r.get("val_tokens"))), None)
        if per_batch and tokens:  # eval_steps is capped at the split's size: the batches actually evaluated
            batches = max(1, round(tokens / per_batch))
        # the share of one evaluation per `interval` steps: per / (interval + per); TARGET_SHARE at interval:
        interval = int(per * (1 - TARGET_SHARE) / TARGET_SHARE) + 1
        interval = max(interval, every or 0)
        return (f"evaluation too often or too long: train.eval_interval = {every} steps, {batches} validation "
                f"batches each (train.eval_steps = {run.cfg('train.eval_steps')}, capped at the split's size); each "
                f"evaluation costs about {per:,.0f} training steps",
                [f"--set train.eval_interval={round_up(interval)} (evaluation about {100 * TARGET_SHARE:.0f}% of the "
                 f"time)", f"or --set train.eval_steps="
                           f"{max(1, int(batches * every * TARGET_SHARE / max(per, 1e-9)))} (fewer validation batches "
                           f"at the same interval; now {batches})"])
    if label == "checkpoints":
        every, asynchronous = run.cfg("checkpoint.save_interval"), run.cfg("checkpoint.async_save")
        interval = max(round_up(int(per * (1 - TARGET_SHARE) / TARGET_SHARE) + 1), every or 0)
        return (f"checkpoints too often for what one costs: checkpoint.save_interval = {every}, each save stops "
                f"training for {g(sec_each)} s" + ("" if asynchronous else " (checkpoint.async_save = false: the "
                                                                          "whole write happens in the loop)"),
                ([] if asynchronous else ["--set checkpoint.async_save=true (write in the background)"])
                + [f"--set checkpoint.save_interval={interval}"])
    if label == "task evaluation":
        every, limit = run.cfg("eval.interval"), run.cfg("eval.limit")
        interval = max(round_up(int(per * (1 - TARGET_SHARE) / TARGET_SHARE) + 1), every or 0)
        return (f"task evaluation (lm-eval) too often or too long: eval.interval = {every}, eval.limit = {limit} "
                f"documents per task; each evaluation costs about {per:,.0f} training steps",
                [f"--set eval.interval={interval} (a multiple of train.eval_interval)",
                 "or a smaller --set eval.limit=N (documents per task per evaluation)"])
    if label == "report":
        return ("report.html refreshes (monitor.report = true) take a large share of a short run",
                ["--set monitor.report=false (write it afterwards: ms-llm report RUN)"])
    key = p[3]
    hook = p[4] if len(p) > 4 else ""
    if hook == "TensorStats":
        every = run.cfg("monitor.tensor_stats.every") or 1
        one = per / calls_per_value(run, p)  # a log record's hooks_s holds every probe of its interval
        return (f"tensor statistics too often: monitor.tensor_stats.every = {every}, each probe costs about "
                f"{one:,.2g} steps", [f"--set monitor.tensor_stats.every={round_up(max(every, int(one / TARGET_SHARE)))}"
                                      f" (statistics about {100 * TARGET_SHARE:.0f}% of the time)"])
    if hook == "NanWatch":
        return ("the NaN check syncs every step with the host (monitor.nan_check = true)",
                ["--set monitor.nan_check=false (token ids are still checked; turn it on when hunting a NaN)"])
    return (f"the {label} ({key}) takes a large share of the run", [f"turn it off or run it less often ({key})"])


def round_up(n):
    """A round interval at least n: 1, 2, 5 x 10^k."""
    n = max(1, int(n))
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale >= n:
                return m * scale
        scale *= 10


# --- slower than this machine runs the config -------------------------------------------------------------------

def load_benchmark(run):
    """(result dict, path) of a benchmark of this run's config: --benchmark FILE, else RUN/benchmark.json (the last
    JSON object in the file: `ms-llm benchmark --json > FILE` output works too), or (None, None)."""
    path = getattr(run, "benchmark_path", None) or os.path.join(run.path, BENCHMARK_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return None, None
    for line in reversed(text.strip().splitlines() or [""]):
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and finite(obj.get("ms_per_step")):
            return obj, path
    try:
        obj = json.loads(text)
        return (obj, path) if isinstance(obj, dict) and finite(obj.get("ms_per_step")) else (None, None)
    except ValueError:
        return None, None


def speed_settings(run):
    """[(key, run's value, default)] of the settings that change a step's speed and differ from the default."""
    out = []
    for key, default in SPEED_KEYS:
        value = run.cfg(key)
        if value is None and default is None:
            continue
        if value != default and not (key == "context.num_threads" and value is None):
            out.append((key, value, default))
    return out


def benchmark_command(run):
    from ms_llm.rundir.names import run_config_path

    sets = " ".join(f"--set {k}={'null' if d is None else str(d).lower() if isinstance(d, bool) else d}"
                    for k, _, d in speed_settings(run))
    return (f"ms-llm benchmark --config {quoted(run_config_path(run.path))} --steps 20 {sets} --output "
            f"{quoted(os.path.join(run.path, BENCHMARK_FILE))}").replace("  ", " ")


def limiting(run):
    """The speed settings that limit a step on their own (a note even without a benchmark)."""
    cores = (run.info.get("device") or {}).get("cpu_count")
    out = []
    threads = run.cfg("context.num_threads")
    if isinstance(threads, int) and isinstance(cores, int) and threads < cores:
        out.append(f"context.num_threads = {threads} of the host's {cores} cores")
    if run.cfg("context.mode") == "pynative":
        out.append("context.mode = pynative (eager: no graph compilation or fusion)")
    if run.cfg("context.jit_level") == "O0":
        out.append("context.jit_level = O0 (no graph fusion)")
    if run.cfg("context.cpu_kernels") is False and ((run.info.get("device") or {}).get("target") == "CPU"):
        out.append("context.cpu_kernels = false (the fused CPU kernels off)")
    micro, accum = run.cfg("train.micro_batch_size"), run.accumulation
    if accum > 1 and micro and micro * (run.cfg("model.seq_length") or 0) < SMALL_MICRO_TOKENS:
        out.append(f"train.micro_batch_size = {micro} x accumulation {accum}: micro-batches of "
                   f"{micro * run.cfg('model.seq_length'):,} tokens, each a full pass of kernel launches, where the "
                   f"global batch {run.cfg('train.global_batch_size')} would take fewer, larger ones")
    return out


def run_step_ms(run):
    """Median ms/step over the steady records (the first, warm-up record and a profiled window left out)."""
    pts = steady(run, "ms_per_step")
    return statistics.median(v for _, v in pts) if pts else None


@rule(finds=('speed_settings', 'slower_than_machine'), live=EVAL)
def rule_machine_speed(run, found, _):
    bench, path = load_benchmark(run)
    ms = run_step_ms(run)
    if ms is None:
        return None
    limits = limiting(run)
    if bench is None:
        from ms_llm.diagnose.measure import load_measure

        if not limits or load_measure(run):  # measured (--measure): rule_measured says what the settings cost
            return None
        return [Finding("speed_settings", "info", f"note: settings that limit the step's speed: {'; '.join(limits)}",
                        [f"median {ms:,.0f} ms/step; no benchmark of this config on this machine to compare with "
                         f"({os.path.join(run.path, BENCHMARK_FILE)})"],
                        [cause("these settings make each step slower than this machine can run it", "low")],
                        [f"measure what this machine does with the same config: {benchmark_command(run)}, then "
                         f"ms-llm diagnose {quoted(run.path)} again",
                         f"or measure these settings against the others of the same computation: ms-llm diagnose "
                         f"{quoted(run.path)} --measure"])]
    ratio = ms / bench["ms_per_step"]
    if ratio < SLOWER:
        return None
    differs = speed_settings(run)
    ev = [f"median {ms:,.0f} ms/step in this run vs {bench['ms_per_step']:,.0f} ms/step for a {bench.get('steps', '?')}-"
          f"step benchmark of its config on this machine ({path}): {ratio:.1f}x slower",
          "settings the benchmark ran at their defaults: " + (", ".join(f"{k} = {v} (default {d})" for k, v, d in
                                                                      differs) or "none")]
    if (bench.get("host") and run.info.get("host") and bench["host"] != run.info["host"]):
        ev.append(f"the benchmark ran on host {bench['host']}, the run on {run.info['host']}")
    acc = account(run)
    hooks_share = 0.0
    if acc:
        ev.append(f"wall-time accounting: {describe(acc)}")
        step_time = acc["phases"]["training"] + acc["phases"]["data wait"] + sum(acc["hooks"].values())
        hooks_share = sum(acc["hooks"].values()) / step_time if step_time else 0.0
    causes = []
    named = {k for k, _, _ in differs}
    for text in limits:
        causes.append(cause(text, "high" if len(limits) == 1 else "medium"))
    for key, value, default in differs:
        if key in ("monitor.nan_check", "monitor.tensor_stats", "monitor.profile", "train.anomaly",
                   "checkpoint.save_interval"):
            causes.append(cause(f"{key} = {value}: the monitor's per-step work ({100 * hooks_share:.0f}% of the step "
                                f"time in hooks)", "medium" if hooks_share > 0.3 else "low"))
        elif key == "data.num_workers":
            causes.append(cause(f"data.num_workers = {value} (default {default})", "medium"))
        elif not any(key in c for c in causes):
            causes.append(cause(f"{key} = {value} (default {default})", "medium"))
    from ms_llm.diagnose.rules.device import host_contention, run_contention, run_contention_text

    busy = host_contention(run, [r["step"] for r in run.train])
    shared = run_contention(run)
    causes.append(cause("other processes on the host while the run trained" + (
        f" ({run_contention_text(shared)})" if shared else f" (load average up to {busy[1]:.1f} on {busy[2]} cores)"
        if busy else ""), "high" if shared and not named else "medium" if busy or shared else "low" if named
        else "medium"))
    if not named:
        causes.append(cause("the environment: thread limits from variables (OMP_NUM_THREADS), CPU pinning (taskset, "
                            "cgroups) or another machine", "medium"))
    order = {"high": 0, "medium": 1, "low": 2}
    causes.sort(key=lambda c: order[c.rsplit("[confidence: ", 1)[1].rstrip("]")])
    actions = [f"--set {k}={'null' if d is None else str(d).lower() if isinstance(d, bool) else d}"
               for k, _, d in differs] or ["check OMP_NUM_THREADS, taskset/cgroup CPU limits and the host's load"]
    actions.append(f"confirm: {benchmark_command(run)} (a 20-step benchmark of the same config with those settings "
                   f"at their defaults)")
    return [Finding("slower_than_machine", "warning", f"{ratio:.1f}x slower per step than this machine runs the same "
                    f"config ({ms:,.0f} vs {bench['ms_per_step']:,.0f} ms/step)", ev, causes, actions)]
