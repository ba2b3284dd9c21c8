"""Has a run diverged: the verdict `ms-llm diagnose` gives (rules/loss.py builds its finding's evidence and causes
on it), shared with the tools that act on it while runs go on: `ms-llm sweep` stops a trial that diverges and
`ms-llm lr-find` ends its range at the same line. One criterion, documented once (docs/debugging.md, rule 2).

A run diverges when, before its first non-finite loss, any of these holds:
- onset: the trailing median of SMOOTH records climbs above its best so far + max(DIVERGE_ABS, DIVERGE_REL x best)
  and stays there for DIVERGE_SUSTAIN records (a median's minimum is not noise, and one bad record is not a trend);
- above uniform: a fresh model's loss starts at about ln(vocab) (rundir/start.py); an interval mean above
  UNIFORM_MARGIN x ln(vocab) (or above where it started, for a start far above it) means the updates made it worse;
- blow-up: the median of the last 3 gradient norms over EXPLODE_FACTOR x their early median (records 2-4).
"""
import math
import statistics
from dataclasses import dataclass, field
from typing import Optional

from ms_llm.rundir.start import judge_start

DIVERGE_ABS, DIVERGE_REL, DIVERGE_SUSTAIN = 0.25, 0.15, 3  # above best + max(0.25, 15%) for 3 records
SMOOTH = 5               # divergence compares trailing medians of 5 records (noise-proof minimum)
UNIFORM_MARGIN = 1.05    # interval-mean loss above 1.05 x ln(vocab): worse than the uniform start
EXPLODE_FACTOR = 10.0    # grad norm > 10x its early median = exploding


def finite(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def nonfinite(v):
    """NaN/Inf (read back from the "nan"/"inf" strings); a missing or null value is not a NaN."""
    return isinstance(v, float) and not math.isfinite(v)


def early_median(vals):
    """Median of records 2-4: the first interval mixes in initialisation transients."""
    return statistics.median(vals[1:4] if len(vals) > 2 else vals)


def smoothed(pts):
    """Trailing median of SMOOTH records: the minimum of a noisy curve is itself noise, a median's is not."""
    return [(s, statistics.median(v for _, v in pts[max(0, i - SMOOTH + 1):i + 1])) for i, (s, _) in enumerate(pts)]


def line_above(best):
    return best + max(DIVERGE_ABS, DIVERGE_REL * best)


def onset(raw):
    """(first raw step above the line, (best step, best smoothed loss)) of the first sustained climb of the
    smoothed curve, or None."""
    pts = smoothed(raw)
    best = None
    for i in range(1, len(pts) - DIVERGE_SUSTAIN + 1):
        best = pts[i - 1] if best is None or pts[i - 1][1] < best[1] else best  # running minimum
        line = line_above(best[1])
        if all(v > line for _, v in pts[i:i + DIVERGE_SUSTAIN]):
            # the median lags the rise: the first raw record above the line
            return next((st for st, v in raw if st > best[0] and v > line), pts[i][0]), best
    return None


@dataclass
class Divergence:
    """What the criterion saw; `diverged` says whether any of its three signs holds."""
    raw: list                        # finite (step, loss) before the first non-finite loss
    onset: Optional[tuple] = None    # (step, (best step, best smoothed loss))
    above: list = field(default_factory=list)   # (step, loss) above the uniform line
    uniform: Optional[float] = None  # ln(vocab)
    start: object = None             # rundir.start.Start of the loss before any update
    grad_norms: list = field(default_factory=list)  # (step, grad norm) before the first non-finite loss
    blowup: bool = False

    @property
    def diverged(self):
        return self.onset is not None or self.blowup or bool(self.above)


def first_nonfinite_step(run):
    return next((r["step"] for r in run.train if nonfinite(r.get("loss"))), None)


def examine(run):
    """The criterion on a parsed run (ms_llm.rundir.reader.Run)."""
    stop = first_nonfinite_step(run)
    raw = [(r["step"], r["loss"]) for r in run.train if finite(r.get("loss")) and (stop is None or r["step"] < stop)]
    gn = [(r["step"], r["grad_norm"]) for r in run.train
          if finite(r.get("grad_norm")) and (stop is None or r["step"] < stop)]
    vals = [v for _, v in gn]
    blowup = len(gn) >= 6 and statistics.median(vals[-3:]) > EXPLODE_FACTOR * early_median(vals)
    vocab = run.cfg("model.vocab_size") if run.token_loss else None  # ln V is a level of cross-entropy only
    uniform = math.log(vocab) if isinstance(vocab, int) and vocab > 1 else None
    first = run.train[0] if run.train else {}
    start = judge_start(first.get("initial_loss"), vocab, fresh=not run.cfg("checkpoint.load_weights"))
    # a loss that started above the uniform level (a bad start) is above it from the start, not because of the
    # updates: only a climb above where it started says the updates overshoot
    line = max(UNIFORM_MARGIN * uniform, start.loss) if uniform and start and start.verdict == "above" else \
        UNIFORM_MARGIN * uniform if uniform else None
    above = [(st, v) for st, v in raw if line and v > line]
    return Divergence(raw, onset(raw), above, uniform, start, gn, blowup)


@dataclass
class Verdict:
    id: str        # diagnose's finding id: loss_nonfinite or divergence
    symptom: str   # its symptom line
    step: int


def verdict(run):
    """The Verdict of a run that diverged (a NaN/Inf loss, or the criterion above), or None. The ids and symptoms
    are diagnose's (rules/loss.py words its findings with symptom())."""
    bad = first_nonfinite_step(run)
    if bad is not None:
        return Verdict("loss_nonfinite", nonfinite_symptom(bad), bad)
    bad_val = next((r["step"] for r in run.evals if nonfinite(r.get("val_loss"))), None)
    if bad_val is not None:
        return Verdict("loss_nonfinite", nonfinite_val_symptom(bad_val), bad_val)
    d = examine(run)
    if not d.diverged:
        return None
    step, text = symptom(d)
    return Verdict("divergence", text, step)


def nonfinite_symptom(step):
    return f"loss became NaN/Inf at step {step}"


def nonfinite_val_symptom(step):
    return f"validation loss NaN/Inf at step {step} while the training loss is finite"


def symptom(d):
    """(step, symptom line) of a Divergence that diverged."""
    if d.onset is not None:
        return d.onset[0], f"training diverges from step {d.onset[0]}"
    if d.above:
        return d.above[0][0], (f"loss rose above the uniform-prediction loss at step {d.above[0][0]} (overshooting "
                               f"updates)")
    vals = [v for _, v in d.grad_norms]
    top = max(d.grad_norms, key=lambda p: p[1])
    return top[0], f"gradient norm exploding: {top[1] / early_median(vals):.0f}x its early value by step {top[0]}"
