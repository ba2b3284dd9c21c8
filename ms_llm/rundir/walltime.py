"""Where a run's wall time went, phase by phase, from what the trainer measured and wrote into metrics.jsonl (it is
not inferred): `ms-llm runs`, the report's stacked bar and `ms-llm diagnose` read it.

    startup     entering the trainer → the start of training (setup, model build, data checks, preprocessing)
                                                                           first record's startup_s
    compile     the first step of each process (graphs compiled or loaded)  first record's compile_s
    training    the steps themselves                                       Σ interval_s − data wait − hooks
    data wait   waiting for batches                                        Σ data_wait_frac × interval_s
    hooks       per-step extras, by hook (tensor statistics, NaN check,    Σ hooks_s (+ Σ duration_s of the
                profiler window, anomaly guard, live diagnosis)            live diagnosis' `diagnose` events)
    evaluation  validation passes                                          Σ duration_s of val records
    task evaluation  lm-eval tasks (the eval: section, ms_llm.eval.hook)    Σ duration_s of task records
    checkpoints the training loop's part of each save                      Σ duration_s of checkpoint events
    report      report.html refreshes                                      Σ duration_s of report events
    the rest    the wall time none of these measured                       wall − Σ of the above

The wall time of a process is its startup plus the largest `elapsed_s` it wrote; a resumed run is the sum of its
processes (elapsed_s restarts with each). Records without these fields (runs made before they were written) leave
their phases unmeasured: their time falls into "the rest", and `measured` says so.
"""
import math

TIMING_EVENTS = ("report", "diagnose")  # events that only carry a duration: not drawn or listed as things that happened
# phase -> the config keys that control it (what the diagnosis names)
KEYS = {
    "startup": "data.dataset_dir / data.source (preprocessing at start), the dataset's checksums on first use",
    "compile": "context.compile_cache (reuse compiled graphs across restarts)",
    "data wait": "data.num_workers",
    "evaluation": "train.eval_interval / train.eval_steps",
    "task evaluation": "eval.interval / eval.limit / eval.tasks",
    "checkpoints": "checkpoint.save_interval / checkpoint.async_save",
    "report": "monitor.report",
}
HOOK_KEYS = {"TensorStats": "monitor.tensor_stats", "NanWatch": "monitor.nan_check", "ProfileWindow": "monitor.profile",
             "AnomalyRollback": "train.anomaly", "Telemetry": "monitor.telemetry_interval_s",
             "ReportRefresh": "monitor.report", "TaskEval": "eval.tasks", "LiveDiagnosis": "monitor.diagnose"}
HOOK_NAMES = {"TensorStats": "tensor statistics", "NanWatch": "NaN check", "ProfileWindow": "profiler window",
              "AnomalyRollback": "anomaly guard", "Telemetry": "telemetry", "LiveDiagnosis": "live diagnosis",
              "TaskEval": "task evaluation hook"}  # its per-step check; the evaluations: 'task evaluation'
ORDER = ("startup", "compile", "training", "data wait", "evaluation", "task evaluation", "checkpoints", "report")


def _num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def segments(run):
    """The run's records grouped by process: every record carries `time` and `elapsed_s` since its process started
    training, so time - elapsed_s is the same for all records of one process (to the rounding of both) and differs
    between processes (a resumed run has one per restart). Records without both fields form one group only when no
    record has them."""
    groups, untimed = {}, []
    for r in run.train + run.evals + run.events + run.task_evals:
        t, e = r.get("time"), r.get("elapsed_s")
        if _num(t) and _num(e):
            groups.setdefault(round(t - e), []).append(r)
        else:
            untimed.append(r)
    if not groups:
        return [untimed] if untimed else []
    out, last = [], None
    for key in sorted(groups):  # keys a second apart are one process whose start straddles a rounding edge
        if last is not None and key - last <= 1:
            out[-1] += groups[key]
        else:
            out.append(groups[key])
        last = key
    return out


def account(run):
    """{"wall_s", "phases": {name: seconds}, "hooks": {hook: seconds}, "measured": bool, "processes": n} or None
    when the records carry no elapsed time. Remembered on the run (the table, the report and diagnose all ask)."""
    key = (len(run.train), len(run.evals), len(run.events))
    memo = getattr(run, "_walltime", None)
    if memo is None or memo[0] != key:
        memo = (key, _account(run))
        run._walltime = memo
    return memo[1]


def _account(run):
    phases = {p: 0.0 for p in ORDER}
    hooks, wall, measured, n = {}, 0.0, True, 0
    for seg in segments(run):
        ends = [r["elapsed_s"] for r in seg if _num(r.get("elapsed_s"))]
        if not ends:
            continue
        n += 1
        train = [r for r in seg if "loss" in r and "event" not in r and "val_loss" not in r]
        first = min(train, key=lambda r: r["step"]) if train else {}
        startup = first.get("startup_s")
        wall += max(ends) + (startup if _num(startup) else 0.0)
        phases["startup"] += startup if _num(startup) else 0.0
        phases["compile"] += first.get("compile_s") if _num(first.get("compile_s")) else 0.0
        waited = stepped = 0.0
        for r in train:
            span = r.get("interval_s")
            if not _num(span):
                measured = False
                continue
            wait = r.get("data_wait_frac")
            wait = span * wait if _num(wait) else 0.0
            spent = 0.0
            if r.get("hooks_s"):
                for k, v in r["hooks_s"].items():
                    if _num(v):
                        hooks[k] = hooks.get(k, 0.0) + v
                        spent += v
            waited += wait
            stepped += max(0.0, span - wait - spent)
        phases["data wait"] += waited
        phases["training"] += stepped
        for r in seg:
            d = r.get("duration_s")
            if "val_loss" in r:
                phases["evaluation"] += d if _num(d) else 0.0
                measured &= _num(d)
            elif "tasks" in r:
                phases["task evaluation"] += d if _num(d) else 0.0
            elif r.get("event") == "checkpoint":
                phases["checkpoints"] += d if _num(d) else 0.0
                measured &= _num(d)
            elif r.get("event") == "report" and _num(d):
                phases["report"] += d
            elif r.get("event") == "diagnose" and _num(d):  # the live diagnosis at an evaluation (outside the
                hooks["LiveDiagnosis"] = hooks.get("LiveDiagnosis", 0.0) + d  # log intervals' hooks_s)
        if not _num(startup):
            measured = False
    if n == 0 or wall <= 0:
        return None
    return {"wall_s": wall, "phases": phases, "hooks": hooks, "measured": measured, "processes": n,
            "rest_s": max(0.0, wall - sum(phases.values()) - sum(hooks.values()))}


def shares(acc):
    """[(label, seconds, share of the wall time, controlling key or "")] for every phase, hook and the rest, in the
    accounting's order (largest hooks first)."""
    wall = acc["wall_s"]
    rows = [(p, acc["phases"][p], KEYS.get(p, "")) for p in ORDER]
    rows += [(HOOK_NAMES.get(h, h), v, HOOK_KEYS.get(h, "")) for h, v in sorted(acc["hooks"].items(),
                                                                               key=lambda kv: -kv[1])]
    rows.append(("the rest", acc["rest_s"], ""))
    return [(label, s, s / wall, key) for label, s, key in rows]


def largest_other(acc):
    """(label, share) of the largest phase that is not training steps, startup or compile, or None."""
    rows = [(label, share) for label, _, share, _ in shares(acc)
            if label not in ("training", "startup", "compile", "the rest")]
    return max(rows, key=lambda r: r[1]) if rows else None


def describe(acc, limit=0.01):
    """'wall 5:12: training 61%, evaluation 30%, ...' (phases of at least `limit`)."""
    parts = [f"{label} {100 * share:.0f}%" for label, _, share, _ in shares(acc) if share >= limit]
    return f"wall {duration(acc['wall_s'])}: " + ", ".join(parts)


def duration(seconds):
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"
