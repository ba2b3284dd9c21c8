"""A trial's results, read back from its run directory (so they are the same whether the sweep ran the trial,
resumed it, or `--collect` found it after a cluster ran it), and the ranking of a sweep's trials."""
import math
import os
import statistics

from ms_llm.rundir.reader import load_run, read_jsonl, summarize
from ms_llm.tune.sweep import trial as tr
from ms_llm.tune.sweep.progress import divergence
from ms_llm.rundir import names


def trial_result(run_dir, values, metric):
    """The sweep.json record of one trial."""
    rec = {"values": dict(values), "run_dir": run_dir, "name": os.path.basename(run_dir), "status": tr.status(run_dir),
           "best_val_loss": None, "final_val_loss": None, "final_loss": None, "diverged": False,
           "stopped_at_step": None, "stop_reason": None, "steps": 0, "tokens_per_s": None, "wall_s": None,
           "metric": None}
    marker = tr.read_marker(run_dir)
    if rec["status"] == "new" or not os.path.isfile(os.path.join(run_dir, names.METRICS)):
        if marker.get("failed"):
            rec["stop_reason"] = marker["failed"].get("error")
        rec["wall_s"] = marker.get("wall_s")
        return rec
    run = load_run(run_dir)
    s = summarize(run)
    train = sorted(run.train, key=lambda r: r["step"])
    finite_losses = [r["loss"] for r in train if _finite(r.get("loss"))]
    finding = divergence(run)
    stop = marker.get("stop") or {}
    rec.update(best_val_loss=s["best_val_loss"], final_val_loss=s["final_val_loss"],
               final_loss=statistics.median(finite_losses[-3:]) if finite_losses else None,
               steps=s["steps"], tokens_per_s=s["tokens_per_s"],
               diverged=finding is not None or stop.get("reason") == "diverged",
               wall_s=marker.get("wall_s") or wall_from_metrics(run_dir))
    if rec["status"] == "stopped" or stop:
        rec["stopped_at_step"] = stop.get("step") or stopped_step(run)
        rec["stop_reason"] = stop.get("detail") or (finding.symptom if finding else "halted by the trainer")
    elif finding is not None:
        rec["stop_reason"] = finding.symptom
    if rec["status"] == "finished" and not rec["diverged"]:
        rec["metric"] = {"val_loss": rec["final_val_loss"], "best_val_loss": rec["best_val_loss"],
                         "loss": rec["final_loss"]}[metric]
    return rec


def stopped_step(run):
    """The step a stopped run ended at: its last preempted/halted event, else its last record."""
    ends = [e["step"] for e in run.events if e.get("event") in ("preempted", "halted", "stop_at_step")]
    return max(ends) if ends else run.steps_done


def wall_from_metrics(run_dir):
    """Wall time from the records' elapsed_s, for trials the sweep did not time itself (--collect). elapsed_s
    counts from each process's start of training, so a resumed run adds up its segments."""
    records, _ = read_jsonl(os.path.join(run_dir, names.METRICS))  # in the order written
    total, segment = 0.0, 0.0
    for r in records:
        if r.get("event") == "resume":
            total, segment = total + segment, 0.0
        elif _finite(r.get("elapsed_s")):
            segment = max(segment, r["elapsed_s"])
    return round(total + segment, 1) or None


def ranked(records):
    """Trials by metric (lower is better); then trials without one: stopped behind, diverged, failed, unfinished."""
    def key(r):
        if r["metric"] is not None:
            return (0, r["metric"])
        order = 1 if r["status"] == "stopped" and not r["diverged"] else 2 if r["diverged"] else 3
        return (order, r["final_loss"] if r["final_loss"] is not None else math.inf)
    return sorted(records, key=key)


def _finite(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
