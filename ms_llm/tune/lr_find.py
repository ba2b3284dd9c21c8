"""`ms-llm debug lr-find`: the LR range test. From the config's own initial weights, train with the learning
rate rising exponentially from 1e-7 to 1 over the steps, stop once the loss has clearly diverged, and read the
curve: the LR of steepest descent, the LR of the lowest loss (the suggested peak LR), the LR where it blew up.

How: a session of the config (ms_llm.train.session.open_session, the trainer's own step) with a constant
schedule at lr = 1.0, so the compiled step applies lr_table[step] x lr_scale = lr_scale, and lr_scale (the
step's own parameter, the one the anomaly guard lowers) is set before each step. Nothing of the trainer's run
machinery is needed (no evaluation, checkpoints or run directory to bend), and the user's runs are not
touched: the test writes only into its own --output-dir.
"""
import datetime
import json
import math
import os
import statistics
import time

import numpy as np

from ms_llm.rundir.divergence import DIVERGE_ABS, DIVERGE_REL, DIVERGE_SUSTAIN, SMOOTH
from ms_llm.errors import UserError
from ms_llm.fileio import atomic_write_bytes

# The suggestion: the LR at the lowest smoothed loss, Smith's reading of his range test for a schedule that warms up
# to its peak (the edge where the loss stops falling). Chosen among five standard readings by a calibration set up
# before it was run (docs/tuning.md, the LR range test): on three models its worst miss of the 300-step sweeps' best
# LR was 2.0x; fastai's max(steepest, min/10), used before, missed by 4.8x, 3.7x and 19.6x (its steepest-descent
# reading is taken from the first, noisy fall of the loss and sits a decade or more below what a warmed-up run can
# use).
RULE = ("suggested peak LR = the LR at the lowest smoothed loss (centered moving average); diverged = the "
        f"trailing median of {SMOOTH} steps above best + max({DIVERGE_ABS}, {DIVERGE_REL:.0%} of best) for "
        f"{DIVERGE_SUSTAIN} steps in a row (ms-llm diagnose's divergence thresholds), or a non-finite loss")


def default_output_dir(config):
    stem = os.path.splitext(os.path.basename(config))[0]
    return os.path.join("runs", f"lr_find-{stem}-{datetime.datetime.now():%Y%m%d-%H%M%S}")


def check_args(steps, start_lr, end_lr, output_dir):
    if steps < 20:
        raise UserError(f"--steps {steps}: the range test needs at least 20 steps to read a curve (default 200).")
    if not (0 < start_lr < end_lr) or not math.isfinite(end_lr):
        raise UserError(f"--start-lr {start_lr:g} and --end-lr {end_lr:g}: need 0 < start < end (defaults 1e-7 "
                        f"and 1).")
    if os.path.exists(output_dir) and (not os.path.isdir(output_dir) or os.listdir(output_dir)):
        raise UserError(f"--output-dir {output_dir} exists and is not empty; lr-find writes only into a folder of "
                        f"its own. Choose a new one (default: runs/lr_find-<config>-<time>).")


def lr_at(k, steps, start_lr, end_lr):
    return start_lr * (end_lr / start_lr) ** (k / (steps - 1))


def range_test_overrides(steps):
    """A constant schedule at 1.0, so lr_scale is the LR; no anomaly guard (it would skip the blow-up itself)."""
    return [f"train.max_steps={steps}", "train.lr=1.0", "train.min_lr=0", "train.warmup_steps=0",
            "train.lr_schedule=constant", "train.decay_steps=null", "train.anomaly=null"]


def lr_find(config, overrides, steps=200, start_lr=1e-7, end_lr=1.0, output_dir=None, echo=print):
    from ms_llm.config import load_config, save_config

    output_dir = output_dir or default_output_dir(config)
    check_args(steps, start_lr, end_lr, output_dir)
    cfg = load_config(config, list(overrides) + range_test_overrides(steps))
    from ms_llm.train.setup.dataset import prepared_runtime
    from ms_llm.train.session import open_session
    from ms_llm.train.step_runner import StepRunner

    s = open_session(cfg, echo, purpose="lr_find", rt=prepared_runtime(cfg, echo))
    runner = StepRunner(s)
    import mindspore as ms  # after the session: select_device quiets MindSpore's logging before its first import
    os.makedirs(output_dir, exist_ok=True)
    save_config(s.cfg, os.path.join(output_dir, "config.yaml"))
    state, points, stop_reason, t0 = s.step_fn.state, [], None, time.perf_counter()
    echo(f"lr-find: {steps} steps, LR from {start_lr:g} to {end_lr:g} (x{(end_lr / start_lr) ** (1 / (steps - 1)):.4f} "
         f"per step); writing {output_dir}")
    with open(os.path.join(output_dir, "lr_find.jsonl"), "w", encoding="utf-8") as f:
        for k in range(steps):
            lr = lr_at(k, steps, start_lr, end_lr)
            state.lr_scale.set_data(ms.Tensor(lr, ms.float32))
            out = runner.step()
            loss, grad_norm = float(out.loss.asnumpy()), float(out.grad_norm.asnumpy())
            points.append({"step": k + 1, "lr": lr, "loss": loss, "grad_norm": grad_norm})
            f.write(json.dumps({kk: (v if math.isfinite(v) else str(v)) for kk, v in points[-1].items()}) + "\n")
            if (k + 1) % max(1, steps // 10) == 0:
                echo(f"lr-find: step {k + 1}/{steps}, lr {lr:.3g}, loss {loss:.4f}")
            stop_reason = diverged([p["loss"] for p in points])
            if stop_reason:
                echo(f"lr-find: stopped at step {k + 1} (lr {lr:.3g}): {stop_reason}")
                break
    result = analyse([p["lr"] for p in points], [p["loss"] for p in points])
    result.update(steps=steps, steps_run=len(points), stop_reason=stop_reason or "reached the last LR",
                  seconds=round(time.perf_counter() - t0, 1), config=os.path.abspath(config), overrides=list(overrides),
                  start_lr=start_lr, end_lr=end_lr, rule=RULE)
    for p, sm in zip(points, result.pop("smoothed")):
        p["smoothed"] = sm
    atomic_write_bytes(os.path.join(output_dir, "lr_find.json"),
                       json.dumps(result, indent=1, default=str).encode("utf-8"))
    page = None
    try:
        from ms_llm.tune.page import write_lr_find_page

        page = write_lr_find_page(result, points, os.path.join(output_dir, "lr_find.html"))
    except UserError as e:
        echo(f"warning: lr_find.html not written: {e}")
    report(result, output_dir, page, config, echo)
    return result


def report(r, output_dir, page, config, echo):
    g = lambda v: f"{v:.3g}" if isinstance(v, float) else "n/a"  # noqa: E731
    echo(f"steepest descent at LR {g(r['steepest_lr'])}; lowest smoothed loss {g(r['min_loss'])} at LR "
         f"{g(r['min_lr'])}; " + (f"blew up at LR {g(r['blowup_lr'])} (step {r['blowup_step']})"
                                   if r["blowup_lr"] else "did not blow up up to the last LR"))
    if r["suggested_lr"] is None:
        echo("no suggestion: the loss never fell (check the data and the model with ms-llm debug overfit)")
        return
    echo(f"suggested peak LR: {r['suggested_lr']:.3g}")
    lr = r["suggested_lr"]
    echo(f"check it with a sweep around it: ms-llm sweep --config {config} --vary train.lr={lr / 3:.2g},{lr:.2g},"
         f"{lr * 3:.2g} --steps N")
    echo(f"lr-find: {output_dir}/lr_find.json, lr_find.jsonl" + (f", {page}" if page else ""))


def diverged(losses):
    """Why the loss has clearly diverged, or None (the online stop rule; see RULE)."""
    if not math.isfinite(losses[-1]):
        return f"loss {losses[-1]} (non-finite)"
    trail = trailing_medians(losses)
    if len(trail) < SMOOTH + DIVERGE_SUSTAIN:
        return None
    best = min(trail[:-DIVERGE_SUSTAIN])
    line = best + max(DIVERGE_ABS, DIVERGE_REL * best)
    if all(v > line for v in trail[-DIVERGE_SUSTAIN:]):
        return f"loss (median of {SMOOTH} steps) {trail[-1]:.4g} stayed above {line:.4g} (best {best:.4g})"
    return None


def trailing_medians(losses):
    vals = [v if math.isfinite(v) else math.inf for v in losses]
    return [statistics.median(vals[max(0, i - SMOOTH + 1):i + 1]) for i in range(len(vals))]


def centered(losses, half):
    """Centered moving average (no lag: an LR axis shifted by a trailing window would bias every reading)."""
    vals = np.array([v if math.isfinite(v) else np.nan for v in losses], dtype=np.float64)
    out = np.full(len(vals), np.nan)
    for i in range(len(vals)):
        window = vals[max(0, i - half):i + half + 1]
        if np.isfinite(window).all():
            out[i] = window.mean()
    return out


def analyse(lrs, losses):
    """The readings of one range test (pure: unit-tested on synthetic curves)."""
    n = len(losses)
    half = max(2, n // 50)
    sm = centered(losses, half)
    out = {"steepest_lr": None, "min_lr": None, "min_loss": None, "blowup_lr": None, "blowup_step": None,
           "suggested_lr": None, "smoothed": [float(v) if np.isfinite(v) else None for v in sm]}
    finite = np.flatnonzero(np.isfinite(sm))
    if len(finite) < 5:
        return out
    i_min = int(finite[np.argmin(sm[finite])])
    out["min_lr"], out["min_loss"] = float(lrs[i_min]), float(sm[i_min])
    onset = blowup_index(losses)
    if onset is not None:
        out["blowup_lr"], out["blowup_step"] = float(lrs[onset]), onset + 1
    # steepest descent: the most negative d(loss)/d(log LR) before the minimum, past the smoothing's edge
    lo = half
    if i_min - lo >= 2:
        slope = np.gradient(sm[lo:i_min + 1], np.log10(np.asarray(lrs[lo:i_min + 1], dtype=np.float64)))
        i_steep = lo + int(np.nanargmin(slope))
        out["steepest_lr"] = float(lrs[i_steep])
    start = np.nanmedian(sm[finite[:max(3, n // 20)]])
    if out["min_loss"] < start - DIVERGE_ABS / 2:  # the loss fell: the readings mean something
        out["suggested_lr"] = float(f"{out['min_lr']:.3g}")
    return out


def blowup_index(losses):
    """The first step of the excursion that made the test stop: where the trailing median crossed the line
    (best so far + max(DIVERGE_ABS, DIVERGE_REL x best)) and stayed above it, or the first non-finite loss."""
    bad = [i for i, v in enumerate(losses) if not math.isfinite(v)]
    trail = trailing_medians(losses)
    best = math.inf
    for i in range(1, len(trail) - DIVERGE_SUSTAIN + 1):
        best = min(best, trail[i - 1])
        line = best + max(DIVERGE_ABS, DIVERGE_REL * best)
        if all(v > line for v in trail[i:i + DIVERGE_SUSTAIN]):
            first_raw = next((j for j in range(i - SMOOTH + 1 if i >= SMOOTH else 0, i + 1) if losses[j] > line), i)
            return min([first_raw] + bad)
    return bad[0] if bad else None
