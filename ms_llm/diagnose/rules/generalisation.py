"""Generalisation (`ms-llm diagnose`), and what the splits themselves say about it:

- `overfitting`: a validation loss that rises while the training loss falls, after the model has seen its data
  more than once; `generalisation_gap`: a train/validation gap that keeps widening while validation stalls. Both
  report the step where validation was best and the passes over the training data made by then (epochs: global
  batch x steps / training samples of the dataset's manifest, what `ms-llm data info` shows).
- `distribution_shift`: validation unlike the training data. Before the first repeat of a sample, the training
  loss is measured on batches the model has not seen: it is itself a held-out loss on the training distribution.
  A validation loss well above it then (or rising while it falls) is not overfitting but another distribution;
  and the splits' token distributions (the manifest's KL(val || train), ms_llm.data.overlap) say so from the data.
- `val_leakage`: validation holding near-copies of training text (the manifest's share of validation shingles found
  in training): the validation curve then tracks training and is no evidence of generalisation.
"""
import os
import statistics

from ms_llm.data.overlap import LEAK_WARN, SHIFT_WARN
from ms_llm.diagnose.common import Finding, cause, curve, g, points, quoted
from ms_llm.diagnose.references import dataset_dir, epochs_at, split_entropy, split_method, split_overlap, \
    train_samples
from ms_llm.diagnose.registry import EVAL, rule

MIN_EVALS = 3
RISE_ABS, RISE_REL = 0.02, 0.02   # validation above its best by max(0.02, 2%) at the last two evaluations
TRAIN_FALL = 0.02                 # ... while the training loss fell by 2% since the best evaluation
GAP_GROWTH, GAP_EVALS = 0.10, 4   # the gap grew by 0.1 nats over the last 4 evaluations, validation not improving
SHIFT_GAP_ABS, SHIFT_GAP_REL = 0.15, 0.05  # before the first epoch: validation above training by max(0.15, 5%)


def train_near(pts, step):
    """Median training loss of the (up to 3) records at or before `step`."""
    before = [v for s, v in pts if s <= step][-3:]
    return statistics.median(before) if before else None


@rule(finds=('overfitting', 'generalisation_gap', 'distribution_shift'), reads=('loss_nonfinite', 'divergence', 'underfitting', 'labels'), live=EVAL)
def rule_generalisation(run, found, _):
    evals = points(run.evals, "val_loss")
    pts = curve(run)
    if any(k in found for k in ("loss_nonfinite", "divergence", "underfitting")) or not evals or len(pts) < 4:
        return None
    curve_shape = rising_or_widening(run, evals, pts) if len(evals) >= MIN_EVALS else None
    shift = shift_evidence(run, evals, pts, found)
    if curve_shape is not None:
        rising, best, _, gaps = curve_shape[:4]
        onset = epochs_at(run, best[0] if rising else gaps[0][0])  # where validation parted from training
        if onset is None or onset >= 1.0:
            return overfitting_finding(run, evals, pts, *curve_shape, shift)
    if "labels" in found and not shift["data"]:
        return None  # validation apart from training from the start: the labels finding names both explanations
    if curve_shape is not None or shift["curve"] or shift["data"]:
        return [shift_finding(run, evals, pts, curve_shape, shift)]
    return None


def rising_or_widening(run, evals, pts):
    """(rising, best, last, gaps) when validation rises (or the gap widens) while training falls, else None."""
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
    return rising, best, last, gaps, t_best, t_last


def overfitting_finding(run, evals, pts, rising, best, last, gaps, t_best, t_last, shift):
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
    causes = [cause("the model memorises the training set: " + (
        f"{ep_last:.1f} passes over {n:,} samples" if ep_last is not None else "many passes over the data")
        + " is more than its size can take without overfitting", "high" if ep_best is not None else "medium")]
    if not run.cfg("model.dropout"):
        causes.append(cause("no regularisation: model.dropout = 0" + (
            f", train.weight_decay = {g(run.cfg('train.weight_decay'))}" if (run.cfg("train.weight_decay") or 0) < 0.05
            else ""), "medium"))
    if shift["data"]:
        ev.append(shift["data"])
        causes.append(cause("besides: validation data unlike the training data (the splits' token distributions "
                            "differ)", "medium"))
    actions = [f"more data: the run sees {ep_last:.1f} epochs; a larger corpus (ms-llm preprocess --input ...)"
               if ep_last is not None else "more data (a larger corpus)",
               f"fewer epochs: --set train.max_steps={best[0]} (where validation was best)"]
    if not run.cfg("model.dropout"):
        actions.append("--set model.dropout=0.1")
    wd = run.cfg("train.weight_decay")
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


# --- validation unlike the training data ----------------------------------------------------------------------

def shift_evidence(run, evals, pts, found):
    """{"early": [(step, val, train, gap, epochs)] of evaluations made before the first repeat of a sample,
    "curve": an evidence line when validation was well above training then (else None), "data": an evidence line
    when the manifest's KL(val || train) is above SHIFT_WARN (else None), "kl": the KL or None}."""
    early = []
    for s, v in evals:
        ep, t = epochs_at(run, s), train_near(pts, s)
        if ep is not None and ep < 1.0 and t is not None and s >= pts[0][0]:
            early.append((s, v, t, v - t, ep))
    above = [e for e in early if e[3] > max(SHIFT_GAP_ABS, SHIFT_GAP_REL * e[2])]
    curve_line = None
    if early and len(above) * 2 > len(early):
        curve_line = ("before any training sample was seen twice, validation was above the training loss (itself a "
                      "loss on unseen batches of the training data): " + ", ".join(
                          f"{g(v)} vs {g(t)} at step {s} ({gp:+.3g}, {ep:.2g} epochs)" for s, v, t, gp, ep in early[:6]))
    entry, _ = split_overlap(run)
    kl = (entry or {}).get("unigram_kl_val_train_nats")
    data_line = None
    if isinstance(kl, (int, float)) and kl >= SHIFT_WARN:
        unseen = (entry or {}).get("val_tokens_unseen_in_train") or 0
        data_line = (f"the splits' token distributions differ: KL(val || train) = {g(kl)} nats/token (above "
                     f"{SHIFT_WARN:g}; a split of one distribution: about 0.01), Jensen-Shannon "
                     f"{g(entry.get('unigram_js_nats'))}; {100 * unseen:.2g}% of validation tokens never occur in "
                     f"training")
    return {"early": early, "above": above, "curve": curve_line, "data": data_line, "kl": kl}


def shift_finding(run, evals, pts, curve_shape, shift):
    ev = []
    first = shift["above"][0] if shift["above"] else None
    if shift["curve"]:
        ev.append(shift["curve"])
    if curve_shape is not None:
        rising, best, last, gaps, t_best, t_last = curve_shape
        onset = best[0] if rising else gaps[0][0]
        ev.append(f"val_loss best {g(best[1])} at step {best[0]}, then " + ", ".join(
            f"{g(v)} at step {s}" for s, v in evals if s > best[0])[:300] + f", while the training loss fell "
            f"{g(t_best)} → {g(t_last)}; the gap to training " + ("grew" if not rising else "opened") +
            f" from step {onset}, after {epochs_at(run, onset):.2g} epochs: before any sample repeats, the training "
            f"loss is a held-out loss, so what the model learns of the training data does not carry over")
    if shift["data"]:
        ev.append(shift["data"])
    h_tr, h_va = split_entropy(run, "train"), split_entropy(run, "val")
    if h_tr and h_va:
        ev.append(f"unigram entropy: training {g(h_tr.nats)}, validation {g(h_va.nats)} ({h_va.source})")
    method, fraction = split_method(run)
    n = train_samples(run)
    ep_last = epochs_at(run, evals[-1][0])
    if method:
        ev.append(f"split: {method} (val_fraction {g(fraction)})" + (f"; {ep_last:.2g} epochs over the {n:,} training "
                                                                     f"samples by step {evals[-1][0]}" if n else ""))
    tail = method == "token tail of a single document"
    both = bool(shift["data"]) and bool(shift["curve"] or curve_shape)
    causes = []
    if tail:
        causes.append(cause(f"the validation split is the last {g(100 * (fraction or 0))}% of one document, and the "
                            f"corpus' end is different text (another work, an appendix, another language or format)",
                            "high" if shift["data"] else "medium"))
    else:
        causes.append(cause("the validation documents come from other sources than most training documents (another "
                            "corpus, a later period, an adopted split)", "high" if both else "medium"))
    if not shift["data"]:
        causes.append(cause("training and evaluation compute the loss differently (targets, masks): then "
                            "validation is off by a constant from the first evaluation", "low"))
    d = dataset_dir(run) or run.cfg("data.dataset_dir")
    src = run.cfg("data.source")
    actions = [f"ms-llm data info {quoted(str(d))} (where the split comes from: split method, both splits' unigram "
               f"entropies, the divergence of their token distributions, their overlap)"]
    if tail:
        actions.append("split by documents instead: one document per line of JSONL (ms-llm preprocess --input "
                       "corpus.jsonl ...), so the hash split draws validation from the whole corpus")
    actions.append(f"--val-fraction (data.val_fraction = {g(fraction)}): the share held out; with a tail split it "
                   f"only moves where the tail starts")
    actions.append("a separate validation source of the training distribution: held-out documents of the same "
                   "sources, preprocessed with the training data" + (f" (data.source = {src})" if src else ""))
    onset = (curve_shape[1][0] if curve_shape[0] else curve_shape[3][0][0]) if curve_shape else None
    step = first[0] if first and shift["curve"] else onset or evals[0][0]
    symptom = ("validation data unlike the training data: " + (
        f"val_loss {g(first[1])} vs training {g(first[2])} at step {step}, after {first[4]:.2g} epochs (before any "
        f"sample repeats)" if first and shift["curve"] else
        f"validation parts from training at step {onset} after {epochs_at(run, onset):.2g} epochs, before any sample "
        f"repeats" if curve_shape else f"KL(val || train) = {g(shift['kl'])} nats/token"))
    return Finding("distribution_shift", "warning", symptom, ev, causes, actions, [step])


# --- validation holding near-copies of training text -----------------------------------------------------------

@rule(finds=('val_leakage',), live=EVAL)
def rule_leakage(run, found, _):
    entry, where = split_overlap(run)
    share = (entry or {}).get("val_shingles_in_train")
    if not isinstance(share, (int, float)) or share < LEAK_WARN:
        return None
    ev = [f"{100 * share:.1f}% of the validation split's {entry['shingle_tokens']}-token shingles (runs of about 32 "
          f"characters) occur in the training split ({entry.get('sampled_val_shingles', 0):,} sampled of "
          f"{entry.get('val_shingles', 0):,}; {where}); unrelated text of one kind shares under 1%"]
    evals = points(run.evals, "val_loss")
    pts = curve(run)
    gaps = [(s, v - train_near(pts, s)) for s, v in evals if train_near(pts, s) is not None]
    if gaps:
        ep = epochs_at(run, gaps[-1][0])
        ev.append("validation - training loss: " + ", ".join(f"{g(gp)} (step {s})" for s, gp in gaps[-5:])
                  + (f"; {ep:.2g} epochs by step {gaps[-1][0]}" if ep is not None else "")
                  + ": with near-copies of training text in it, validation tracks training and cannot show "
                    "memorisation")
    method, _ = split_method(run)
    causes = [cause("near-duplicate documents across the splits: the same passage under another header, date or "
                    "number (the hash split keeps exact duplicates together, not near-copies)", "high")
              if method != "token tail of a single document" else
              cause("the corpus repeats itself: its last part (the validation tail) copies earlier text", "high")]
    d = dataset_dir(run) or run.cfg("data.dataset_dir")
    actions = ["remove near-duplicates before preprocessing (MinHash/LSH over shingles), then ms-llm preprocess "
               "again", f"ms-llm data info {quoted(str(d))} (the overlap after the fix; preprocessing warns above "
                        f"{100 * LEAK_WARN:.0f}%)",
               "until then, judge generalisation on a held-out set known to be clean, not on this validation loss"]
    return [Finding("val_leakage", "warning", f"validation overlaps training: {100 * share:.0f}% of its shingles "
                    f"occur in the training split, so the validation loss is no evidence of generalisation", ev,
                    causes, actions, [s for s, _ in gaps[-1:]])]
