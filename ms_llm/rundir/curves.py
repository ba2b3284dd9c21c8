"""`ms-llm compare-curves A B`: does a run follow a baseline's curve? The regression gate that every
optimisation needs (a faster step must leave the loss curve where it was).

A and B are run directories, golden files (`--save-golden` writes one: step → value of one metric), or another
framework's training logs (a log file or a folder of worker logs: ms_llm.rundir.foreign), aligned by step or,
with align="tokens", by the tokens consumed (each side's step × global batch × sequence length, or the tokens its
log counts; where the two sides' token counts do not coincide, B is interpolated linearly at A's).
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
    values: dict  # step (or tokens, when x is "tokens") -> float (NaN/Inf allowed)
    x: str = "step"
    note: str = ""  # how a foreign log was read (its reader's first line)


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


def load_curve(source, metric, align="step"):
    """The `metric` curve of a run directory, a golden JSON file or another framework's log (a file or a folder of
    worker logs). Bad input is a UserError."""
    if align not in ALIGNS:
        raise UserError(f"--align {align}: not one of {', '.join(ALIGNS)}.")
    if os.path.isdir(source) or (os.path.isfile(source) and not is_golden(source)):
        return _run_curve(source, metric, align)
    if os.path.isfile(source):
        if align == "tokens":
            raise UserError(f"--align tokens: golden file '{source}' holds steps only; compare it with --align step.")
        return _golden_curve(source, metric)
    raise UserError(f"'{source}' does not exist. compare-curves takes run directories (the --run-dir of "
                    f"'ms-llm train') or a golden JSON written by 'ms-llm compare-curves RUN --save-golden FILE'.")


ALIGNS = ("step", "tokens")


def is_golden(path):
    """A golden JSON (a .json file, or one whose text starts with '{'), not a training log."""
    from ms_llm.rundir.reader import LOG_FORMAT

    if LOG_FORMAT.get() not in (None, "auto"):
        return False  # --format names the reader: the file is a log
    if path.endswith(".json"):
        return True
    try:
        with open(path, "rb") as f:
            head = f.read(64).lstrip()
    except OSError:
        return False
    return head.startswith(b"{")


def tokens_per_step(run):
    batch, seq = run.cfg("train.global_batch_size"), run.cfg("model.seq_length")
    return batch * seq if isinstance(batch, int) and isinstance(seq, int) else None


def _run_curve(path, metric, align="step"):
    run = load_run(path)
    records = run.evals if metric in EVAL_METRICS else run.train
    if any(metric in r for r in run.task_evals):  # an lm-eval task's metric (ms_llm.eval.hook), e.g. task/acc
        records = run.task_evals
    per_step = tokens_per_step(run)
    logged = {r["step"]: r["tokens"] for r in run.train if isinstance(r.get("tokens"), int)}
    values = {}
    for r in records:  # a resumed run can log a step twice: the later record is the one it continued from
        v = r.get(metric)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if align == "tokens":
                x = logged.get(r["step"]) or (r["step"] * per_step if per_step else None)
                if x is None:
                    raise UserError(f"--align tokens: '{path}' says neither the tokens per step (train.global_batch_size "
                                    f"and model.seq_length{' in its config' if not run.foreign else ', from its log or a config beside it'}) "
                                    f"nor the tokens consumed. Use --align step.")
                values[x] = float(v)
            else:
                values[r["step"]] = float(v)
    if not values:
        numeric = sorted({k for r in run.train + run.evals + run.task_evals for k, v in r.items()
                          if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"})
        raise UserError(f"--metric {metric}: run '{path}' logged no such value ({len(run.train)} log records, "
                        f"{len(run.evals)} evaluations, {len(run.task_evals)} task evaluations). Metrics it has: "
                        f"{', '.join(numeric) or 'none'}.")
    note = ""
    if run.foreign:
        from ms_llm.rundir.foreign import describe

        note = describe(run)
    return Curve(os.path.basename(os.path.normpath(path)), metric, values, align, note)


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
    if a.x != b.x:
        raise UserError(f"{a.label} is aligned by {a.x} and {b.label} by {b.x}: compare both by the same axis.")
    if a.x == "tokens" and not set(a.values) & set(b.values):
        b = interpolated(b, a)
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


def interpolated(b, a):
    """B's curve at A's token counts within B's span (linear between B's neighbouring points): runs whose batches
    differ log at token counts that never coincide."""
    xs = sorted(b.values)
    out = {}
    for x in a.values:
        if x < xs[0] or x > xs[-1]:
            continue
        i = next(i for i, bx in enumerate(xs) if bx >= x)
        if xs[i] == x or i == 0:
            out[x] = b.values[xs[i]]
            continue
        x0, x1 = xs[i - 1], xs[i]
        v0, v1 = b.values[x0], b.values[x1]
        out[x] = v0 + (v1 - v0) * (x - x0) / (x1 - x0)
    return Curve(b.label + " (interpolated at A's token counts)", b.metric, out, b.x, b.note)


def _span(values):
    steps = sorted(values)
    return f"{steps[0]}..{steps[-1]} ({len(steps)} points)"


def _g(v):
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def format_comparison(c):
    a, b = c.a, c.b
    at = "step" if a.x == "step" else "tokens"  # the x axis: "at step 200", "at tokens 1,228,800"
    x = (lambda v: str(v)) if at == "step" else (lambda v: f"{v:,}")  # noqa: E731
    lines = [f"{side} {curve.note}" for side, curve in (("A", a), ("B", b)) if curve.note]
    lines.append(f"compare-curves {a.metric}: A = {a.label} ({len(a.values)} points), B = {b.label} "
                 f"({len(b.values)} points); {len(c.steps)} common {'steps' if at == 'step' else 'token counts'} "
                 f"{x(c.steps[0])}..{x(c.steps[-1])}")
    if c.only_a or c.only_b:
        lines.append(f"not compared: {len(c.only_a)} {'step' if at == 'step' else 'token count'}(s) only in A, "
                     f"{len(c.only_b)} only in B")
    d, s = c.max_abs
    lines.append(f"largest absolute difference: {_g(abs(d))} at {at} {x(s)} (A {_g(a.values[s])}, "
                 f"B {_g(b.values[s])})")
    r, s = c.max_rel
    lines.append(f"largest relative difference: {_g(r)} ({100 * r:.3g}%) at {at} {x(s)}")
    lines.append(f"first {'step' if at == 'step' else 'token count'} that differs at all: " + (x(c.first_diff) if c.first_diff is not None else
                                                        "none (identical at every common step)"))
    lines.append(f"tolerance: |A - B| <= atol {c.atol:g} + rtol {c.rtol:g} x |B|")
    if c.parted:
        s = c.first_part
        va, vb = a.values[s], b.values[s]
        lines.append(f"PARTED at {at} {x(s)}: A {_g(va)}, B {_g(vb)}, |A - B| = {_g(abs(va - vb))} > "
                     f"{_g(c.atol + c.rtol * abs(vb))} (exit 1)")
    else:
        lines.append(f"within tolerance at all {len(c.steps)} common {'steps' if at == 'step' else 'token counts'} "
                     f"(exit 0)")
    return "\n".join(lines)


def to_dict(c):
    fin = lambda v: v if v is None or math.isfinite(v) else str(v)  # noqa: E731 (JSON has no NaN/Inf)
    return {"metric": c.a.metric, "a": c.a.label, "b": c.b.label, "common_steps": len(c.steps),
            "max_abs_diff": fin(abs(c.max_abs[0])), "max_abs_step": c.max_abs[1],
            "max_rel_diff": fin(c.max_rel[0]), "max_rel_step": c.max_rel[1], "first_diff_step": c.first_diff,
            "first_part_step": c.first_part, "parted": c.parted, "rtol": c.rtol, "atol": c.atol,
            "only_a": len(c.only_a), "only_b": len(c.only_b)}
