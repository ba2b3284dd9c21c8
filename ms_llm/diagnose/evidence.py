"""Evidence several rules read, computed once per diagnosis (common.memoised), in one place:

- the cut: the first step from which the curve no longer shows training (the first non-finite loss, or where a
  divergence begins: ms_llm/rundir/divergence.py); the rules that judge the curve's shape or the gradient norm
  read what comes before it;
- the steady records: without the first log record of each process (the warm-up and compile) and without a
  profiled window (whose steps the profiler slows by design);
- the steps' own speed: tokens/s of the steady records with the monitor hooks' time taken out (a tensor-statistics
  compile in one record is the wall-time rule's, not an uneven step), and its median.
"""
import statistics

from ms_llm.diagnose.common import _memo, finite, first_nonfinite_step, points
from ms_llm.rundir import divergence


def divergence_step(run):
    """The step a divergence begins at (the divergence finding's step), or None."""
    def compute():
        d = divergence.examine(run)
        return divergence.symptom(d)[0] if d.diverged else None
    return _memo(run.train, "divergence step", compute)


def cut(run):
    """The first step the curve no longer trains: a non-finite loss, or the start of a divergence; None if neither."""
    steps = [s for s in (first_nonfinite_step(run), divergence_step(run)) if s is not None]
    return min(steps) if steps else None


def before_cut(run, pts):
    """The (step, value) points before the cut."""
    stop = cut(run)
    return [p for p in pts if stop is None or p[0] < stop]


def steady(run, key):
    """(step, value) of `key` without the first log record of each process (the run's first, and the first after
    every resume, carry the warm-up), and without the records of a profiled window (profile_start/profile_stop
    events), whose steps the profiler slows by design."""
    pts = points(run.train, key)
    pts = pts[1:] if len(pts) > 1 else pts
    warm = {e["step"] for e in run.events if e.get("event") == "resume"}
    interval = run.cfg("train.log_interval") or 1
    prof = profiled(run)
    return [p for p in pts if p[0] not in prof and not any(0 < p[0] - s <= interval for s in warm)]


def profiled(run):
    """Steps of the log records whose interval overlaps a profiled window."""
    interval = run.cfg("train.log_interval") or 1
    windows, start = [], None
    for e in sorted(run.events, key=lambda e: e["step"]):
        if e.get("event") == "profile_start":
            start = e["step"]
        elif e.get("event") == "profile_stop" and start is not None:
            windows.append((start, e["step"]))
            start = None
    if start is not None:
        windows.append((start, float("inf")))
    return {r["step"] for r in run.train for a, b in windows if r["step"] > a and r["step"] - interval < b}


def record_seconds(run):
    """{step: interval_s} of the log records that carry the trainer's measured interval (pauses out)."""
    return {r["step"]: r["interval_s"] for r in run.train if finite(r.get("interval_s"))}


def hook_seconds(run):
    """{step: seconds} the monitor hooks took in each log record (hooks_s: a one-off compile of a probe's graph, a
    statistics pass), which the wall-time rule prices; they are not the steps' speed."""
    return {r["step"]: sum(v for v in r["hooks_s"].values() if finite(v)) for r in run.train
            if isinstance(r.get("hooks_s"), dict)}


def step_seconds(run):
    """{step: seconds} of each record's steps alone: its interval_s less its hooks' time (hook_seconds)."""
    hooks = hook_seconds(run)
    return {s: t - hooks.get(s, 0.0) if 0 < hooks.get(s, 0.0) < t else t for s, t in record_seconds(run).items()}


def step_speed(run):
    """(step, tokens/s) of the steady records with the hooks' time taken out where the record has its interval_s:
    the speed of the steps themselves (a tensor-statistics compile in one record is not an uneven step)."""
    whole, steps = record_seconds(run), step_seconds(run)
    return [(s, v * whole[s] / steps[s]) if s in whole and steps[s] > 0 else (s, v)
            for s, v in steady(run, "tokens_per_s")]


def median_speed(run):
    """The median of the steps' own tokens/s (step_speed), or None: the run's steady throughput."""
    pts = step_speed(run)
    return statistics.median(v for _, v in pts) if pts else None
