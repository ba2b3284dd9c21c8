"""`ms-llm compare-curves A B`: does a run follow a baseline's curve? The regression gate that every
optimisation needs (a faster step must leave the loss curve where it was).

A and B are run directories or golden files (`--save-golden` writes one: step → value of one metric).
B is the reference: a step parts when |A − B| > atol + rtol·|B| (numpy.isclose's rule), and NaN parts from
any number but not from NaN.
"""
import datetime
import json
import math
import os
from dataclasses import dataclass, field

from ms_llm.rundir.reader import NONFINITE, load_run
from ms_llm.errors import UserError

GOLDEN_FORMAT = "ms_llm.golden_curve/1"
EVAL_METRICS = ("val_loss", "val_tokens")
# Defaults: a rerun of the quickstart with the same seed is bit-identical on CPU, and float16 compute moves
# its loss by at most 1.4e-5 (relative) over 300 steps; train.lr x3 moves it by 3% at the first log and 12%
# at step 40. 2% passes numerical noise (other kernels, other library versions reorder float sums) and
# still catches a changed recipe; a CI gate on one machine can tighten it (--rtol 0: any difference).
DEFAULT_RTOL, DEFAULT_ATOL = 0.02, 0.0


@dataclass
class Curve:
    label: str
    metric: str
    values: dict  # step -> float (NaN/Inf allowed)


@dataclass
class Comparison:
    a: Curve
    b: Curve
    rtol: float
    atol: float
    steps: list = field(default_factory=list)  # common steps, ascending
    diffs: list = field(default_factory=list)  # A − B at those steps
    max_abs: tuple = None  # (diff, step)
    max_rel: tuple = None  # (relative diff, step)
    first_diff: int = None  # first step with any difference
    first_part: int = None  # first step beyond tolerance
    only_a: list = field(default_factory=list)
    only_b: list = field(default_factory=list)

    @property
    def parted(self):
        return self.first_part is not None


def load_curve(source, metric):
    """The `metric` curve of a run directory or golden JSON file. Bad input is a UserError."""
    if os.path.isdir(source):
        return _run_curve(source, metric)
    if os.path.isfile(source):
        return _golden_curve(source, metric)
    raise UserError(f"'{source}' does not exist. compare-curves takes run directories (the --run-dir of "
                    f"'ms-llm train') or a golden JSON written by 'ms-llm compare-curves RUN --save-golden FILE'.")


def _run_curve(path, metric):
    run = load_run(path)
    records = run.evals if metric in EVAL_METRICS else run.train
    if any(metric in r for r in run.task_evals):  # an lm-eval task's metric (ms_llm.eval.hook), e.g. task/acc
        records = run.task_evals
    values = {}
    for r in records:  # a resumed run can log a step twice: the later record is the one it continued from
        v = r.get(metric)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            values[r["step"]] = float(v)
    if not values:
        numeric = sorted({k for r in run.train + run.evals + run.task_evals for k, v in r.items()
                          if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"})
        raise UserError(f"--metric {metric}: run '{path}' logged no such value ({len(run.train)} log records, "
                        f"{len(run.evals)} evaluations, {len(run.task_evals)} task evaluations). Metrics it has: "
                        f"{', '.join(numeric) or 'none'}.")
    return Curve(os.path.basename(os.path.normpath(path)), metric, values)


def _golden_curve(path, metric):
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"'{path}' is not a readable JSON file ({e}). Give a run directory or a golden file written "
                        f"by 'ms-llm compare-curves RUN --save-golden FILE'.") from None
    if not isinstance(obj, dict):
        raise UserError(f"'{path}' holds a JSON {type(obj).__name__}; a golden curve is an object of step → value "
                        f"(or one written by --save-golden).")
    raw = obj.get("values") if "values" in obj else obj
    saved_metric = obj.get("metric") if "values" in obj else None
    if saved_metric and saved_metric != metric:
        raise UserError(f"golden file '{path}' holds the '{saved_metric}' curve, not --metric {metric}. Pass "
                        f"--metric {saved_metric}, or save a golden of {metric}.")
    values = {}
    for k, v in (raw or {}).items() if isinstance(raw, dict) else ():
        v = NONFINITE.get(v, v) if isinstance(v, str) else v
        try:
            step = int(k)
        except ValueError:
            step = None
        if step is None or not isinstance(v, (int, float)) or isinstance(v, bool):
            raise UserError(f"golden file '{path}': entry {k!r}: {v!r} is not step → number. A golden curve maps "
                            f"integer steps (as strings) to numbers, e.g. {{\"10\": 3.99, \"20\": 3.65}}.")
        values[step] = float(v)
    if not values:
        raise UserError(f"golden file '{path}' holds no points. Write one with 'ms-llm compare-curves RUN "
                        f"--save-golden {path}'.")
    return Curve(os.path.basename(path), metric, values)


def save_golden(curve, source, path):
    obj = {"format": GOLDEN_FORMAT, "metric": curve.metric, "source": os.path.abspath(source),
           "created": datetime.datetime.now().isoformat(timespec="seconds"),
           "values": {str(s): (v if math.isfinite(v) else str(v)) for s, v in sorted(curve.values.items())}}
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise UserError(f"--save-golden {path}: folder '{directory}' does not exist. Create it or pick another path.")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")


def _same(a, b):
    return a == b or (math.isnan(a) and math.isnan(b))


def compare(a, b, rtol=DEFAULT_RTOL, atol=DEFAULT_ATOL):
    if rtol < 0 or atol < 0 or not math.isfinite(rtol) or not math.isfinite(atol):
        raise UserError(f"--rtol {rtol} / --atol {atol}: tolerances must be finite and non-negative, e.g. --rtol 0.02.")
    c = Comparison(a, b, rtol, atol)
    c.steps = sorted(set(a.values) & set(b.values))
    c.only_a = sorted(set(a.values) - set(b.values))
    c.only_b = sorted(set(b.values) - set(a.values))
    if not c.steps:
        raise UserError(f"{a.label} logs {a.metric} at steps {_span(a.values)} and {b.label} at {_span(b.values)}: no "
                        f"step in common. Compare runs with the same train.log_interval (or a golden saved from such "
                        f"a run).")
    for s in c.steps:
        va, vb = a.values[s], b.values[s]
        d = va - vb if math.isfinite(va) and math.isfinite(vb) else (0.0 if _same(va, vb) else math.inf)
        c.diffs.append(d)
        rel = abs(d) / abs(vb) if vb else (0.0 if d == 0 else math.inf)
        if c.max_abs is None or abs(d) > abs(c.max_abs[0]):
            c.max_abs = (d, s)
        if c.max_rel is None or rel > c.max_rel[0]:
            c.max_rel = (rel, s)
        if c.first_diff is None and not _same(va, vb):
            c.first_diff = s
        if c.first_part is None and not (_same(va, vb) or abs(d) <= atol + rtol * abs(vb)):
            c.first_part = s
    return c


def _span(values):
    steps = sorted(values)
    return f"{steps[0]}..{steps[-1]} ({len(steps)} points)"


def _g(v):
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def format_comparison(c):
    a, b = c.a, c.b
    lines = [f"compare-curves {a.metric}: A = {a.label} ({len(a.values)} points), B = {b.label} "
             f"({len(b.values)} points); {len(c.steps)} common steps {c.steps[0]}..{c.steps[-1]}"]
    if c.only_a or c.only_b:
        lines.append(f"not compared: {len(c.only_a)} step(s) only in A, {len(c.only_b)} only in B")
    d, s = c.max_abs
    lines.append(f"largest absolute difference: {_g(abs(d))} at step {s} (A {_g(a.values[s])}, B {_g(b.values[s])})")
    r, s = c.max_rel
    lines.append(f"largest relative difference: {_g(r)} ({100 * r:.3g}%) at step {s}")
    lines.append("first step that differs at all: " + (str(c.first_diff) if c.first_diff is not None else "none "
                                                       "(identical at every common step)"))
    lines.append(f"tolerance: |A - B| <= atol {c.atol:g} + rtol {c.rtol:g} x |B|")
    if c.parted:
        s = c.first_part
        va, vb = a.values[s], b.values[s]
        lines.append(f"PARTED at step {s}: A {_g(va)}, B {_g(vb)}, |A - B| = {_g(abs(va - vb))} > "
                     f"{_g(c.atol + c.rtol * abs(vb))} (exit 1)")
    else:
        lines.append(f"within tolerance at all {len(c.steps)} common steps (exit 0)")
    return "\n".join(lines)


def to_dict(c):
    fin = lambda v: v if v is None or math.isfinite(v) else str(v)  # noqa: E731 (JSON has no NaN/Inf)
    return {"metric": c.a.metric, "a": c.a.label, "b": c.b.label, "common_steps": len(c.steps),
            "max_abs_diff": fin(abs(c.max_abs[0])), "max_abs_step": c.max_abs[1],
            "max_rel_diff": fin(c.max_rel[0]), "max_rel_step": c.max_rel[1], "first_diff_step": c.first_diff,
            "first_part_step": c.first_part, "parted": c.parted, "rtol": c.rtol, "atol": c.atol,
            "only_a": len(c.only_a), "only_b": len(c.only_b)}
