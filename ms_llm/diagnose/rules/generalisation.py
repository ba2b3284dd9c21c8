"""Generalisation (`ms-llm diagnose`): a validation loss that rises while the training loss falls (`overfitting`),
and a train/validation gap that keeps widening while validation stalls (`generalisation_gap`). Both report the
step where validation was best and how many passes over the training data had been made by then (epochs: global
batch x steps / training samples of the dataset's manifest, what `ms-llm data info` shows)."""
import os
import statistics

from ms_llm.diagnose.common import Finding, cause, curve, g, points, quoted
from ms_llm.diagnose.references import epochs_at, train_samples

MIN_EVALS = 3
RISE_ABS, RISE_REL = 0.02, 0.02   # validation above its best by max(0.02, 2%) at the last two evaluations
TRAIN_FALL = 0.02                 # ... while the training loss fell by 2% since the best evaluation
GAP_GROWTH, GAP_EVALS = 0.10, 4   # the gap grew by 0.1 nats over the last 4 evaluations, validation not improving


def train_near(pts, step):
    """Median training loss of the (up to 3) records at or before `step`."""
    before = [v for s, v in pts if s <= step][-3:]
    return statistics.median(before) if before else None


def rule_generalisation(run, found, _):
    evals = points(run.evals, "val_loss")
    pts = curve(run)
    if len(evals) < MIN_EVALS or len(pts) < 4 or "loss_nonfinite" in found or "divergence" in found:
        return None
    best = min(evals, key=lambda p: p[1])
    last = evals[-1]
    line = best[1] + max(RISE_ABS, RISE_REL * best[1])
    t_best, t_last = train_near(pts, best[0]), train_near(pts, last[0])
    if t_best is None or t_last is None:
        return None
    rising = best[0] < evals[-2][0] and evals[-2][1] > line and last[1] > line and t_last < (1 - TRAIN_FALL) * t_best
    gaps = [(s, v - train_near(pts, s)) for s, v in evals[-GAP_EVALS:] if train_near(pts, s) is not None]
    widening = (not rising and len(gaps) >= GAP_EVALS and gaps[-1][1] - gaps[0][1] > GAP_GROWTH
                and all(b[1] >= a[1] - 0.01 for a, b in zip(gaps, gaps[1:])) and last[1] >= evals[-GAP_EVALS][1] - 0.01
                and t_last < (1 - TRAIN_FALL) * train_near(pts, gaps[0][0]))
    if not (rising or widening):
        return None
    ep_best, ep_last = epochs_at(run, best[0]), epochs_at(run, last[0])
    n = train_samples(run)
    ev = [f"val_loss best {g(best[1])} at step {best[0]}; then " + ", ".join(f"{g(v)} at step {s}" for s, v in evals
                                                                           if s > best[0]),
          f"training loss {g(t_best)} around step {best[0]} → {g(t_last)} around step {last[0]}",
          "train/val gap: " + ", ".join(f"{g(gp)} (step {s})" for s, gp in gaps)]
    if ep_best is not None:
        ev.append(f"epochs (passes over the {n:,} training samples): {ep_best:.1f} by the best evaluation, "
                  f"{ep_last:.1f} by step {last[0]} (global batch {run.cfg('train.global_batch_size')})")
    else:
        ev.append("epochs unknown: the dataset's manifest is not reachable from here (ms-llm data info DIR --config "
                  "config.yaml shows them)")
    memorising = ep_best is None or ep_best >= 1.0
    causes = []
    if memorising:
        causes.append(cause("the model memorises the training set: " + (
            f"{ep_last:.1f} passes over {n:,} samples" if ep_last is not None else "many passes over the data")
            + " is more than its size can take without overfitting", "high" if ep_best is not None else "medium"))
        if not run.cfg("model.dropout"):
            causes.append(cause("no regularisation: model.dropout = 0" + (
                f", train.weight_decay = {g(run.cfg('train.weight_decay'))}" if run.cfg("train.weight_decay", 0) < 0.05
                else ""), "medium"))
    else:
        causes.append(cause(f"validation data unlike the training data: validation rises after only {ep_best:.2f} "
                            f"epoch(s), before any sample was seen twice (the split takes the corpus' tail; check it "
                            f"comes from the same distribution)", "medium"))
        causes.append(cause(f"the LR is too high late in the run (train.lr = {g(run.cfg('train.lr'))}, min_lr = "
                            f"{g(run.cfg('train.min_lr'))})", "low"))
    actions = [f"more data: the run sees {ep_last:.1f} epochs; a larger corpus (ms-llm preprocess --input ...)"
               if ep_last is not None else "more data (a larger corpus)",
               f"fewer epochs: --set train.max_steps={best[0]} (where validation was best)"]
    if not run.cfg("model.dropout"):
        actions.append("--set model.dropout=0.1")
    wd = run.cfg("train.weight_decay", 0.0)
    actions.append(f"--set train.weight_decay={max(0.1, 2 * wd):.2g} (now {g(wd)})")
    ckpt = earlier_checkpoint(run, best[0])
    actions.append(f"use the checkpoint of step {ckpt[0]}: {ckpt[1]}" if ckpt else
                   f"keep the best weights: --set checkpoint.save_interval={run.cfg('train.eval_interval') or best[0]} "
                   f"--set checkpoint.keep_last=20, then use the checkpoint nearest step {best[0]}")
    if rising:
        return [Finding("overfitting", "warning", f"overfitting: validation loss rising since step {best[0]} while the "
                        f"training loss falls", ev, causes, actions, [best[0], last[0]])]
    return [Finding("generalisation_gap", "warning", f"train/validation gap widening to {g(gaps[-1][1])} while "
                    f"validation stalls (best at step {best[0]})", ev, causes, actions, [gaps[0][0], gaps[-1][0]])]


def earlier_checkpoint(run, step):
    """(step, path) of the newest checkpoint at or before `step` still on disk (rank 0), or None."""
    folder = os.path.join(run.path, "checkpoints", "rank_0")
    best = None
    try:
        names = os.listdir(folder)
    except OSError:
        return None
    for name in names:
        stem, ext = os.path.splitext(name)
        if stem.startswith("step_") and ext in (".ckpt", ".safetensors") and stem[5:].isdigit():
            s = int(stem[5:])
            if s <= step and (best is None or s > best[0]):
                best = (s, quoted(os.path.join(folder, name)))
    return best
