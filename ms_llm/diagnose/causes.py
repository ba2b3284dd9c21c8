"""The evidence for and against the usual causes of a slow or stalled loss, so that a cause is named only when
something in the run supports it (`ms-llm diagnose`'s progress rules use these):

- learning rate too low: a small update-to-weight ratio (stats.jsonl, when monitor.tensor_stats is on), or a
  loss that falls steadily but slowly with little noise;
- learning rate too high: a noisy or rising loss and growing gradient norms;
- clip_grad too small: only when the loss falls slowly *and* clipping limits the updates. AdamW divides the
  update by the running RMS of the gradient, so a gradient scaled down by a steady factor gives the same update:
  clipping that always rescales by about the same factor does not slow training; a factor that swings does.
- and the experiments that tell them apart when the evidence cannot.
"""
import math
import os
import statistics

from ms_llm.diagnose.common import finite, g, points, quoted

UPDATE_RATIO_LOW = 1e-3     # the largest record's median per-step ||dw||/||w|| of the weight matrices below this:
                            # LR too low (healthy runs here peak at 5e-3 - 2e-2; LR/100 at 3e-4)
CLIP_SWING_CV = 0.5         # clip factor varying this much (std/mean of the grad norm) limits AdamW's updates
GRAD_GROWTH = 2.0           # late grad norm over early: growing


def update_ratio(run):
    """(largest per-record median update ratio of the weight matrices, steps measured) from stats.jsonl, or None.
    The largest record is the one at (or nearest) the peak LR: a decayed LR makes late ratios small in any run."""
    recs = [r for r in run.stats if r.get("kind") == "update_ratio" and finite(r.get("value"))
            and str(r.get("name", "")).endswith("weight") and "norm" not in str(r.get("name", ""))]
    if not recs:
        return None
    by_step = {}
    for r in recs:
        by_step.setdefault(r.get("step"), []).append(r["value"])
    return max(statistics.median(v) for v in by_step.values()), sorted(s for s in by_step if s is not None)


def lr_reached(run):
    """(largest logged LR, step), (last logged LR, step) or None."""
    lrs = points(run.train, "lr")
    if not lrs:
        return None
    return max(lrs, key=lambda p: p[1]), lrs[-1]


def clipping(run, before=None):
    """(share of records above clip_grad, median grad norm, coefficient of variation) or None."""
    clip = run.cfg("train.clip_grad")
    gn = [v for s, v in points(run.train, "grad_norm") if before is None or s < before]
    if not clip or len(gn) < 4:
        return None
    mean = statistics.fmean(gn)
    return sum(v > clip for v in gn) / len(gn), statistics.median(gn), statistics.pstdev(gn) / mean if mean else 0


def grad_growth(run, before=None):
    """Late grad norm (median of the last 3 records) / early (records 2-4), or None."""
    gn = [v for s, v in points(run.train, "grad_norm") if before is None or s < before]
    if len(gn) < 6:
        return None
    early = statistics.median(gn[1:4])
    return statistics.median(gn[-3:]) / early if early > 0 else None


def grad_rms(run):
    """Root-mean-square gradient per parameter (median grad norm / sqrt(parameters)), or None."""
    n = run.final.get("parameters")
    gn = [v for _, v in points(run.train, "grad_norm")]
    if not isinstance(n, int) or n <= 0 or not gn:
        return None
    return statistics.median(gn) / math.sqrt(n)


def lr_experiment(run, steps=100):
    """The cheapest test that tells 'LR too low' from 'LR too high' (and from an LR that is fine): 100 steps at
    3x and at 1/3 of the LR from the config the run used, compared at the end. A list of actions."""
    from ms_llm.rundir.names import run_config_path

    lr = run.cfg("train.lr")
    min_lr = run.cfg("train.min_lr")
    cfg = quoted(run_config_path(run.path))
    base = run.path.rstrip("/\\")
    warm = run.cfg("train.warmup_steps")
    extra = f" --set train.warmup_steps={min(warm, steps // 10)}" if warm > steps // 10 else ""
    out, dirs = [], []
    for tag, f in (("lr_x3", 3.0), ("lr_x0.33", 1 / 3)):
        new_lr = lr * f
        floor = f" --set train.min_lr={new_lr / 10:.3g}" if min_lr > new_lr else ""
        dirs.append(quoted(f"{base}_{tag}"))
        out.append(f"LR experiment, {tag[3:]}: ms-llm train --config {cfg} --run-dir {dirs[-1]} --set "
                   f"train.max_steps={steps} --set train.lr={new_lr:.3g}{floor}{extra}")
    out.append(f"then ms-llm runs {quoted(os.path.dirname(base) or '.')} (or ms-llm compare-curves {dirs[0]} "
               f"{dirs[1]}): the run with the lower loss at step {steps} says which way train.lr should move")
    out.append(f"or the LR range test: ms-llm debug lr-find --config {cfg}")
    return out


def overfit_action(run):
    from ms_llm.rundir.names import run_config_path

    return (f"ms-llm debug overfit --config {quoted(run_config_path(run.path))} (can the model memorise 32 samples? "
            f"if not, the bug is in the model, the labels or the optimizer, not the LR or the data)")


def config_path_exists(run):
    from ms_llm.rundir.names import run_config_path

    return os.path.isfile(run_config_path(run.path))


def describe_update_ratio(ur):
    value, steps = ur
    return (f"update ratio ||dw||/||w|| of the weight matrices: at most {value:.2g} per step (median over the "
            f"matrices, stats.jsonl steps {', '.join(str(s) for s in steps[:6])}{' ...' if len(steps) > 6 else ''}; "
            f"healthy runs reach 5e-3 to 2e-2 at the peak LR)")


def lr_text(run):
    return f"train.lr = {g(run.cfg('train.lr'))}"
