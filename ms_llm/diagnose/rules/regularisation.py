"""A model that learns nothing beyond token frequencies (`ms-llm diagnose`): the validation loss flattens at or
above the validation split's unigram entropy (the loss of a model that ignores the context) while the training
loss has not gone clearly below its own. Such a run must never pass as healthy, whatever its training curve looks
like (with dropout the training loss is measured with units dropped, so it says little on its own).

The usual suspects, each named with the evidence for it: dropout, weight decay, a model too small for its data
(its parameters against the tokens it saw), a frozen or detached part (tensor statistics: parameters whose update
ratio stays 0), and the learning rate. The experiment that separates them is one short run without regularisation.
"""
import math
import statistics

from ms_llm.diagnose import recipes
from ms_llm.diagnose.causes import UPDATE_RATIO_LOW, update_ratio
from ms_llm.diagnose.common import MIN_RECORDS, Finding, cause, curve, finite, g, points, quoted
from ms_llm.diagnose.references import late_window, split_entropy, trend, unigram_entropy
from ms_llm.diagnose.rules.generalisation import shift_evidence
from ms_llm.diagnose.rules.progress import SLOW_MIN_STEPS, UNIGRAM_BAND
from ms_llm.diagnose.registry import EVAL, rule

MIN_EVALS = 3
TRAIN_LEARNED = 0.10     # a training loss 10% below its unigram entropy has learned context: not this finding
DROPOUT_HIGH, DROPOUT_SOME = 0.5, 0.2   # dropout at or above these: a strong / a plausible suspect
WD_USUAL = 0.1           # AdamW weight decay above the usual 0.1 is a suspect ...
WD_SHRINK = 0.5          # ... a strong one when the decay alone would shrink the weights below half their size
DROPOUT_NOISE = 0.05     # training loss (dropout on) above validation (dropout off) by this: dropout's noise shows
TOKENS_PER_PARAM = 1000  # far past the ~20 tokens per parameter of a compute-optimal model


@rule(finds=('underfitting',), reads=('loss_nonfinite', 'divergence', 'bad_start', 'moe_aux_too_large'), live=EVAL)
def rule_underfitting(run, found, _):
    if any(k in found for k in ("loss_nonfinite", "divergence", "bad_start", "moe_aux_too_large")):
        return None  # those explain a high loss first
    evals = points(run.evals, "val_loss")
    pts = curve(run)
    warm, n = run.cfg("train.warmup_steps") or 0, run.max_steps or 0
    gate = max(SLOW_MIN_STEPS, 2 * min(warm, n // 4 if n else warm))
    h_val = split_entropy(run, "val")
    if len(evals) < MIN_EVALS or len(pts) < MIN_RECORDS or evals[-1][0] < gate or h_val is None:
        return None
    best = min(evals, key=lambda p: p[1])
    if best[1] < (1 - UNIGRAM_BAND) * h_val.nats:
        return None  # validation got clearly below the context-free level at some point
    tr = trend(late_window(evals, 0.5, 3))
    if tr.falling_steadily:
        return None  # still learning: the progress rules judge the pace
    h_train = unigram_entropy(run)
    late_train = statistics.median(v for _, v in pts[-3:])
    if h_train and late_train < (1 - TRAIN_LEARNED) * h_train.nats:
        return None  # the training distribution was learned: a split problem (generalisation.py), not capacity
    shift = shift_evidence(run, evals, pts, found)
    if shift["curve"] or shift["data"]:
        return None  # validation worse than unseen training batches, or measured apart: distribution_shift's
    regularised = (run.cfg("model.dropout") or 0.0) >= DROPOUT_SOME or (run.cfg("train.weight_decay")
                                                                             or 0.0) > WD_USUAL
    frozen, detached, _ = frozen_parts(run)
    at_unigram = h_train is not None and abs(late_train - h_train.nats) <= UNIGRAM_BAND * h_train.nats
    if at_unigram and not (regularised or frozen or detached):
        return None  # nothing regularises it and the training loss sits at its own unigram entropy: the context
        # is ignored (a bug in the targets or the inputs), which the progress rules name (loss_plateau)
    return [finding(run, evals, best, tr, h_val, h_train, late_train)]


def finding(run, evals, best, tr, h_val, h_train, late_train):
    last = evals[-1]
    flat_from = next((s for s, v in evals if v <= best[1] + max(0.02, 2 * tr.noise)), best[0])
    dropout = run.cfg("model.dropout") or 0.0
    wd = run.cfg("train.weight_decay") or 0.0
    ev = [f"val_loss " + ", ".join(f"{g(v)} (step {s})" for s, v in evals[-6:]) + f": best {g(best[1])} at step "
          f"{best[0]}; over steps {tr.first_step}-{tr.last_step} the fitted line "
          f"{'falls' if tr.drop >= 0 else 'rises'} {g(abs(tr.drop))} (noise {g(tr.noise)})",
          f"references: the validation split's unigram entropy {g(h_val.nats)} ({h_val.source}), the loss of a model "
          f"that ignores the context" + (f"; training split's {g(h_train.nats)}" if h_train else "")
          + (f"; ln(vocab) = {g(math.log(run.cfg('model.vocab_size')))}" if run.cfg("model.vocab_size") else "")]
    gap = late_train - last[1]
    ev.append(f"training loss {g(late_train)} at step {curve(run)[-1][0]} (measured in training mode"
              + (f", with dropout {g(dropout)} dropping units" if dropout else "") + f") vs validation {g(last[1])}"
              + (": the training loss is above the validation loss, dropout's noise" if dropout and
                 gap > DROPOUT_NOISE else ""))
    causes, actions = [], []
    # --- dropout
    if dropout > 0:
        strong = dropout >= DROPOUT_HIGH or (dropout >= DROPOUT_SOME and gap > DROPOUT_NOISE)
        lo, hi = recipes.span("dropout")
        causes.append((cause(f"dropout too high: model.dropout = {g(dropout)} drops {100 * dropout:.0f}% of the "
                             f"activations in training (published recipes use {g(lo)}-{g(hi)}: recipes.py)",
                             "high" if strong else "medium" if dropout >= DROPOUT_SOME else "low"), "dropout"))
    # --- weight decay: how far the decay alone would have shrunk a weight by now (exp(-wd x sum of the LRs))
    lr_sum = lr_integral(run)
    if wd > WD_USUAL:
        shrink = math.exp(-wd * lr_sum) if lr_sum is not None else None
        ev.append(f"train.weight_decay = {g(wd)}" + (f": the decay alone takes each weight matrix to {100 * shrink:.2g}% "
                                                    f"of its size over the run (exp(-wd x the sum of the LRs = "
                                                    f"{g(lr_sum)}))" if shrink is not None else ""))
        strong = shrink is not None and shrink < WD_SHRINK
        causes.append((cause(f"weight decay too strong: train.weight_decay = {g(wd)} (the usual is 0.1) pulls the "
                             f"weights to zero faster than the gradients move them", "high" if strong else "medium"),
                       "weight_decay"))
    # --- a frozen or detached part: tensor statistics see it
    frozen, detached, have_stats = frozen_parts(run)
    if frozen or detached:
        names = frozen or detached
        ev.append(f"tensor statistics: {len(names)} parameter(s) " + ("never changed (update ratio 0)" if frozen else
                  "got exactly zero gradients") + f": {', '.join(names[:6])}" + (" ..." if len(names) > 6 else ""))
        causes.append((cause(f"a frozen or detached part: {', '.join(names[:3])}" + (" ..." if len(names) > 3 else "")
                             + (" never change" if frozen else " get no gradient"), "high"), "frozen"))
    elif have_stats:
        ev.append("tensor statistics: every parameter changes (no update ratio of 0): nothing frozen")
    # --- capacity: the parameters against the tokens seen
    params = run.final.get("parameters")
    tokens = (run.steps_done or 0) * (run.cfg("train.global_batch_size") or 0) * (run.cfg("model.seq_length") or 0)
    strong_other = any("[confidence: high]" in c for c, _ in causes)
    if isinstance(params, int) and params > 0 and tokens:
        ratio = tokens / params
        ev.append(f"capacity: {params:,} parameters have seen {tokens:,} tokens ({ratio:,.0f} per parameter; a "
                  f"compute-optimal model sees about 20)")
        causes.append((cause(f"the model is too small for its data ({params:,} parameters, hidden_size "
                             f"{run.cfg('model.hidden_size')}, {ratio:,.0f} tokens per parameter)",
                             "low" if strong_other else "medium" if ratio >= TOKENS_PER_PARAM or not causes
                             else "low"), "capacity"))
    else:
        causes.append((cause(f"the model is too small for its data (hidden_size {run.cfg('model.hidden_size')}, "
                             f"{run.cfg('model.num_layers')} layers; the parameter count is in run_info.json's final "
                             f"summary once the run ends)", "low"), "capacity"))
    if not (frozen or detached):
        causes.append((cause("a frozen or detached part (parameters that never change)"
                             + ("" if have_stats else ": not visible without tensor statistics"), "low"), "frozen"))
    ur = update_ratio(run)
    causes.append((cause(f"learning rate too low (train.lr = {g(run.cfg('train.lr'))})"
                         + (f": update ratio {ur[0]:.2g}" if ur else ""),
                         "medium" if ur and ur[0] < UPDATE_RATIO_LOW else "low"), "lr"))
    order = {"high": 0, "medium": 1, "low": 2}
    causes.sort(key=lambda c: order[c[0].rsplit("[confidence: ", 1)[1].rstrip("]")])
    suspects = [k for _, k in causes]
    gate = max(SLOW_MIN_STEPS, flat_from)
    actions = experiment(run, min(last[0], gate), suspects, dropout, wd)
    symptom = (f"validation loss stalled at the context-free level: best {g(best[1])} (step {best[0]}), {g(last[1])} "
               f"at step {last[0]}, against the validation split's unigram entropy {g(h_val.nats)}: the model learns "
               f"nothing beyond token frequencies")
    return Finding("underfitting", "error", symptom, ev, [c for c, _ in causes], actions, [flat_from, last[0]])


def experiment(run, steps, suspects, dropout, wd):
    """The fix for the first suspect, then the run that tells the suspects apart: the same config without
    regularisation for as many steps as validation took to flatten."""
    from ms_llm.rundir.names import run_config_path

    cfg = quoted(run_config_path(run.path))
    base = run.path.rstrip("/\\")
    h = run.cfg("model.hidden_size") or 0
    out = []
    first = suspects[0]
    if first == "dropout":
        out.append(f"--set model.dropout={0.1 if dropout > 0.1 else 0} (now {g(dropout)})")
    elif first == "weight_decay":
        out.append(f"--set train.weight_decay=0.1 (now {g(wd)})")
    elif first == "capacity" and h:
        out.append(f"--set model.hidden_size={2 * h} (a larger model; now {h})")
    sets = [s for s, on in ((f"--set model.dropout=0", dropout > 0), (f"--set train.weight_decay=0", wd > WD_USUAL)) if on]
    every = max(10, steps // 4)
    if sets:
        noreg = quoted(f"{base}_noreg")
        out.append(f"the experiment that separates them: ms-llm train --config {cfg} --run-dir {noreg} "
                   f"{' '.join(sets)} --set train.max_steps={steps} --set train.eval_interval={every}"
                   f" --set monitor.tensor_stats.every={every}")
        out.append(f"then ms-llm compare-curves {quoted(run.path)} {noreg}: validation clearly below the unigram "
                   f"entropy by step {steps} → the regularisation was the cause"
                   + (" (then dropout and weight decay one at a time)" if len(sets) == 2 else "")
                   + f"; still at it → the model (--set model.hidden_size={2 * h if h else '2x'}) or a frozen part "
                     f"(stats.jsonl: update ratios of 0)")
    else:
        bigger = quoted(f"{base}_h{2 * h}")
        out.append(f"the experiment that separates them: ms-llm train --config {cfg} --run-dir {bigger} --set "
                   f"model.hidden_size={2 * h} --set train.max_steps={steps} --set train.eval_interval={every}"
                   f" --set monitor.tensor_stats.every={every}: validation below the unigram entropy → capacity; "
                   f"not → a frozen part (update ratios of 0 in stats.jsonl) or the LR (ms-llm debug lr-find --config "
                   f"{cfg})")
    return out


def lr_integral(run):
    """The sum of the learning rates over the steps done (trapezoid over the logged LRs), or None."""
    lrs = points(run.train, "lr")
    if len(lrs) < 2:
        return None
    total = lrs[0][0] * lrs[0][1] / 2
    for (s0, a), (s1, b) in zip(lrs, lrs[1:]):
        total += (s1 - s0) * (a + b) / 2
    return total


def frozen_parts(run):
    """(parameters whose update ratio is 0 at every record, parameters whose gradient is exactly 0 at every record,
    whether stats.jsonl has update ratios at all)."""
    ratios, grads = {}, {}
    for r in run.stats:
        name = r.get("name")
        if r.get("kind") == "update_ratio" and finite(r.get("value")):
            ratios.setdefault(name, []).append(r["value"])
        elif r.get("kind") == "gradient" and finite(r.get("norm")):
            grads.setdefault(name, []).append(r["norm"])
    frozen = sorted(n for n, v in ratios.items() if v and max(v) == 0)
    detached = sorted(n for n, v in grads.items() if v and max(v) == 0)
    return frozen, detached, bool(ratios)
