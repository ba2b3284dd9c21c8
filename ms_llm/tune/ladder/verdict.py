"""The ladder's verdicts, on curves as plain data ({step: value}): the seed-to-seed band, and each rung against
the rung before it.

The band. The plain config trained at two seeds (train.seed and train.seed + 1) gives two loss curves that are
equally valid runs of one recipe: other initial weights, another data order. Their gap g(t) = loss_seed1(t) -
loss_seed2(t) gives two envelopes:

    step(t)  = max over s <= t of |g(s)|                         the per-step envelope
    trend(t) = max over s <= t of |mean of g over the TREND logged steps up to s|   the trend envelope

Running maxima rather than the gap at t: two seeds' curves cross each other, and at a crossing the gap is ~0 by
chance, which says nothing about how far apart two valid runs can be by then. Past the seed rung's last step each
envelope keeps its last value.

Why two. The seeds draw other batches at every step, and with small batches which batch a step drew dominates its
loss: on the tiny model (8 x 32 tokens a step) the per-step envelope reaches 0.27 by step 100 while the 10-step
mean of the gap stays under 0.09. Two rungs draw the same batches (same seed), so that batch-to-batch noise cancels
between them; judged by the per-step envelope alone, a rung could drift by a third of the per-step seed gap and
still pass. Averaging the signed gap over TREND steps removes most of the batch noise (the batches are independent)
and keeps what reseeding really moves (the initial weights' effect); the rung's difference is averaged the same
way. The per-step envelope stays for what a mean would dilute: a one-step excursion.

The verdicts, rung B (one option more) against rung A (the rung before), over the steps both logged:

- exact: every logged loss and grad norm bit-identical (NaN matches NaN), the same steps logged;
- within noise: for an option expected to move the numbers, at every step t, with d = loss_B - loss_A,
  |d(t)| <= step(t) + rtol x |loss_A(t)| and |mean of d over the TREND steps up to t| <= trend(t) + rtol x
  |loss_A(t)| (rtol, --rtol, default 0: the envelopes alone), and no loss non-finite in one rung and finite in the
  other;
- PARTS: otherwise, and for an option that must not change a single number whenever it changed one. The first
  differing step (any bit), the first parting step (the first beyond a tolerance above; an exact-expected
  option can part with none, inside the band), the largest absolute and relative loss differences are reported.

Within noise is judged on the loss alone: the grad norm of two equally valid runs can differ by more than their
losses do, and a seed band of grad norms would be a second noisy estimate. It counts for exactness, and its
largest difference is reported.
"""
import math
from dataclasses import asdict, dataclass, field
from typing import Optional

from ms_llm.tune.ladder.plan import EXACT

PARTS = "PARTS"


@dataclass
class Curves:
    """One rung's logged values by step (a resumed run's later record wins, as in the run-dir reader)."""
    loss: dict = field(default_factory=dict)
    grad_norm: dict = field(default_factory=dict)
    skipped: dict = field(default_factory=dict)  # step -> updates skipped so far

    @classmethod
    def from_records(cls, records):
        c = cls()
        for r in records:
            if "loss" in r and isinstance(r.get("step"), int):
                c.loss[r["step"]] = as_float(r.get("loss"))
                c.grad_norm[r["step"]] = as_float(r.get("grad_norm"))
                if isinstance(r.get("skipped"), (int, float)):
                    c.skipped[r["step"]] = int(r["skipped"])
        return c

    @property
    def last_step(self):
        return max(self.loss) if self.loss else 0

    def skipped_total(self):
        return self.skipped[max(self.skipped)] if self.skipped else 0

    def first_skip(self):
        before = 0
        for s in sorted(self.skipped):
            if self.skipped[s] > before:
                return s
            before = self.skipped[s]
        return None


def as_float(v):
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


def same(a, b):
    return a == b or (math.isnan(a) and math.isnan(b))


TREND = 10  # logged steps in the trailing mean of the trend envelope


@dataclass
class Band:
    step: dict  # step -> per-step envelope
    trend: dict  # step -> trend envelope

    def __bool__(self):
        return bool(self.step)


def gaps(a, b):
    """[(step, a - b)] over the steps both curves logged, in order (inf where one is non-finite, 0 where both NaN)."""
    out = []
    for s in sorted(set(a) & set(b)):
        if math.isfinite(a[s]) and math.isfinite(b[s]):
            out.append((s, a[s] - b[s]))
        else:
            out.append((s, 0.0 if same(a[s], b[s]) else math.inf))
    return out


def trailing_means(pairs, window=TREND):
    """[(step, mean of the values of the last `window` pairs up to it)] (fewer at the start)."""
    out = []
    for i, (s, _) in enumerate(pairs):
        vals = [v for _, v in pairs[max(0, i - window + 1):i + 1]]
        out.append((s, math.inf if any(math.isinf(v) for v in vals) else sum(vals) / len(vals)))
    return out


def running_max(pairs):
    out, widest = {}, 0.0
    for s, v in pairs:
        widest = max(widest, abs(v))
        out[s] = widest
    return out


def seed_band(a, b):
    """The two envelopes of the seed gap a - b (see the module docstring); a non-finite gap makes them inf."""
    g = gaps(a, b)
    return Band(running_max(g), running_max(trailing_means(g)))


def band_at(band, step):
    if not band:
        return None
    if step in band:
        return band[step]
    earlier = [s for s in band if s <= step]
    return band[max(earlier)] if earlier else band[min(band)]


@dataclass
class Verdict:
    verdict: str  # "exact" | "within noise" | "PARTS" | "unverified"
    expected: str
    steps: int = 0  # steps compared
    first_diff: Optional[int] = None
    first_part: Optional[int] = None
    max_abs: Optional[float] = None
    max_abs_step: Optional[int] = None
    max_rel: Optional[float] = None
    max_rel_step: Optional[int] = None
    max_grad_norm_abs: Optional[float] = None
    band_at_part: Optional[float] = None
    part_by: Optional[str] = None  # "step" or "trend": the envelope the rung left first
    skipped_before: int = 0
    skipped_now: int = 0
    first_skip: Optional[int] = None
    reason: str = ""

    @property
    def parts(self):
        return self.verdict == PARTS

    def to_dict(self):
        return {k: (v if not isinstance(v, float) or math.isfinite(v) else str(v)) for k, v in asdict(self).items()}


def judge(before, now, expected, band, rtol=0.0):
    """The verdict of rung `now` (Curves) against the rung `before` it. `band`: the Band of seed_band, or None
    when the seed rung did not finish (then only rtol x |loss| is tolerated, and a noise verdict says so).

    The loss arithmetic is compare-curves' (ms_llm.rundir.curves.compare, `before` the reference: differences,
    largest absolute and relative, the first step that differs, NaN parting from any number but not from NaN);
    the band is its absolute tolerance, one per step."""
    from ms_llm.rundir.curves import Curve, compare

    steps = sorted(set(before.loss) & set(now.loss))
    v = Verdict("unverified", expected, len(steps), skipped_before=before.skipped_total(),
                skipped_now=now.skipped_total(), first_skip=now.first_skip())
    if not steps:
        v.reason = "no step logged by both rungs"
        return v
    c = compare(Curve("now", "loss", now.loss), Curve("before", "loss", before.loss), 0.0, 0.0)
    only = sorted(c.only_a + c.only_b)
    v.max_abs, v.max_abs_step = abs(c.max_abs[0]), c.max_abs[1]
    v.max_rel, v.max_rel_step = c.max_rel
    grad_diff = [s for s in steps if not same(before.grad_norm.get(s, math.nan), now.grad_norm.get(s, math.nan))]
    v.first_diff = min([s for s in (c.first_diff, grad_diff[0] if grad_diff else None) if s is not None],
                       default=None)
    grad_gaps = [abs(now.grad_norm[s] - before.grad_norm[s]) for s in steps
                 if math.isfinite(now.grad_norm.get(s, math.nan)) and math.isfinite(before.grad_norm.get(s, math.nan))]
    v.max_grad_norm_abs = max(grad_gaps) if grad_gaps else None
    trend = dict(trailing_means(gaps(now.loss, before.loss)))
    for s, d in zip(c.steps, c.diffs):
        slack = rtol * abs(before.loss[s]) if math.isfinite(before.loss[s]) else 0.0
        tol = (band_at(band.step if band else None, s) or 0.0) + slack
        tol_trend = (band_at(band.trend if band else None, s) or 0.0) + slack
        if abs(d) > tol:  # a NaN against a number: d = inf
            v.first_part, v.band_at_part, v.part_by = s, tol, "step"
            break
        if abs(trend[s]) > tol_trend:
            v.first_part, v.band_at_part, v.part_by = s, tol_trend, "trend"
            break
    if v.first_diff is None and not only:
        v.verdict = EXACT
        v.reason = f"every loss and grad norm of {len(steps)} steps bit-identical"
        return v
    if v.first_diff is None:  # identical where both logged, but one rung logged steps the other did not
        v.first_diff = only[0]
    if expected == EXACT:
        v.verdict = PARTS
        v.reason = (f"this option must not change a single number, and it changed them from step {v.first_diff}"
                    + (f"; beyond the noise band from step {v.first_part}" if v.first_part else
                       " (inside the noise band throughout)"))
        return v
    if not band and rtol == 0:
        v.reason = "no seed-to-seed band (the seed rung did not finish) and --rtol 0: nothing to judge noise by"
        return v
    if v.first_part is None and not only:
        v.verdict = "within noise"
        if v.max_abs == 0:
            v.reason = (f"every loss bit-identical; the grad norm differs from step {v.first_diff} (largest |Δ| "
                        f"{v.max_grad_norm_abs or 0.0:.3g})")
        else:
            width = band_at(band.step if band else None, v.max_abs_step) or 0.0
            v.reason = (f"largest |Δloss| {v.max_abs:.3g} at step {v.max_abs_step}"
                        + (f" (the per-step band there: {width:.3g})" if width else f", inside rtol {rtol:g} x |loss|"))
        return v
    v.verdict = PARTS
    if v.first_part is None:
        v.first_part = only[0]
        v.reason = f"step {only[0]} is logged by one rung only (one stopped early)"
    elif v.part_by == "step":
        a, b = before.loss[v.first_part], now.loss[v.first_part]
        v.reason = (f"at step {v.first_part} loss {b:.6g} against {a:.6g} before: |Δ| {abs(b - a):.3g} > the "
                    f"per-step band {v.band_at_part:.3g}" + (f" (with rtol {rtol:g} x |loss|)" if rtol else ""))
    else:
        v.reason = (f"at step {v.first_part} the mean Δloss of the last {TREND} steps is "
                    f"{trend[v.first_part]:+.3g}, beyond the trend band {v.band_at_part:.3g}"
                    + (f" (with rtol {rtol:g} x |loss|)" if rtol else "")
                    + f"; per step it stays inside the band (largest |Δ| {v.max_abs:.3g} at step {v.max_abs_step})")
    return v


def skipped_note(v):
    """The skipped-update evidence of a parting rung (loss-scale overflows, anomaly skips), or ''."""
    if v.skipped_now > v.skipped_before:
        return (f"it skipped {v.skipped_now} update(s) where the rung before skipped {v.skipped_before}"
                + (f", the first at step {v.first_skip}" if v.first_skip else "")
                + ": non-finite gradients (a loss scale too large for the precision) or the anomaly guard")
    return ""
