"""Reading a running trial's metrics.jsonl: has it diverged (the rule `ms-llm diagnose` applies), and where does
it stand at the successive-halving rungs.

Divergence is `diagnose`'s own verdict (ms_llm/rundir/divergence.py, on which its rules build their findings),
applied to the records written so far, so a trial the sweep stops is one `ms-llm diagnose` calls diverged, and the
thresholds stay documented in one place (docs/debugging.md).
"""
import os
import statistics

from ms_llm.rundir.divergence import finite, verdict
from ms_llm.rundir.reader import load_run
from ms_llm.rundir import names

# Successive halving: rungs at these fractions of the trial's steps. A trial is stopped at a rung when it is in
# the worse half of the trials that reached it AND its training loss is more than MARGIN above the best one's:
# trials of one sweep see the same batches in the same order (same seed), so a gap of a few percent is the
# hyperparameters, not noise (a 3x LR moves the quickstart's loss by 3% at step 10, 12% at step 40).
RUNGS = (0.25, 0.5)
ETA = 2
MARGIN = 0.03
RUNG_RECORDS = 3  # the rung value is the median of the last 3 log records up to the rung (one noisy interval
                  # must not decide)


class MetricsView:
    """A run directory's records, re-read only when metrics.jsonl grew."""

    def __init__(self, run_dir):
        self.run_dir, self.size, self.run = run_dir, -1, None

    def refresh(self):
        path = os.path.join(self.run_dir, names.METRICS)
        try:
            size = os.path.getsize(path)
        except OSError:
            return None
        if size != self.size:
            self.size, self.run = size, load_run(self.run_dir)
        return self.run


def divergence(run):
    """The verdict (id, symptom, step) that says this run diverged (NaN/Inf loss or a divergent curve), or None."""
    return verdict(run) if run.train else None


def last_step(run):
    steps = [r["step"] for r in run.train]
    return max(steps) if steps else 0


def rung_steps(max_steps):
    return [max(1, int(max_steps * f)) for f in RUNGS]


def rung_value(run, rung):
    """Median training loss of the last RUNG_RECORDS log records at or before `rung` (None until the run has
    logged past the rung, so a value never changes once it exists)."""
    if last_step(run) < rung:
        return None
    before = [r["loss"] for r in sorted(run.train, key=lambda r: r["step"]) if r["step"] <= rung]
    vals = [v for v in before[-RUNG_RECORDS:] if finite(v)]
    if not vals:
        return float("inf")  # non-finite at the rung: as far behind as a trial can be
    return statistics.median(vals)


def behind(value, others):
    """Successive halving's verdict at one rung: `value` (this trial) against the values of the other trials that
    reached the rung. Returns a sentence when the trial should stop, else None."""
    if value is None or not others:
        return None
    everyone = sorted(others + [value])
    keep = max(1, -(-len(everyone) // ETA))  # the better 1/ETA continue
    best = everyone[0]
    if everyone.index(value) >= keep and value > best * (1 + MARGIN):
        return (f"training loss {value:.4g} is {100 * (value / best - 1):.1f}% above the best trial's {best:.4g} at "
                f"the same step, in the worse {ETA - 1}/{ETA} of the {len(everyone)} trials that got there")
    return None
