"""`ms-llm diagnose` rules on what the loss curve says (non-finite values, divergence, suspicious
labels, spikes). Progress against references is in progress.py."""
import math
import statistics

from ms_llm.diagnose.common import (Finding, MIN_RECORDS, OVERFLOW_SHARE, SPIKE_MIN_WINDOW, SPIKE_REL, SPIKE_WINDOW,
    SPIKE_Z, STUCK_TRAIN_DROP, STUCK_VAL, VAL_GAP_ABS, VAL_GAP_REL, ZERO_LOSS, cause, curve, g, lr_actions, nonfinite,
    points, quoted, steps_text)
from ms_llm.diagnose.rules.schedule import UNSTABLE, causes_for
from ms_llm.diagnose import recipes
from ms_llm.diagnose.rules.settings import lr_judgement
from ms_llm.rundir.divergence import (EXPLODE_FACTOR, SMOOTH, early_median, examine, line_above, nonfinite_symptom,
                                      nonfinite_val_symptom, smoothed, symptom)
from ms_llm.rundir.start import judge_start
from ms_llm.diagnose.evidence import before_cut
from ms_llm.diagnose.registry import CHEAP, EVAL, rule

# --- NaN / Inf --------------------------------------------------------------------------------------

@rule(finds=('loss_nonfinite',), live=CHEAP)
def rule_nonfinite(run, found, _):
    bad = [r for r in run.train if nonfinite(r.get("loss"))]
    if not bad:
        return rule_nonfinite_val(run)
    s, rd = bad[0]["step"], quoted(run.path)
    before = [r for r in run.train if r["step"] < s]
    last = points(before, "loss")
    ev = [f"loss = {bad[0]['loss']} at step {s}, the first non-finite of {len(bad)} log record(s)"
          + (f"; the last finite loss was {g(last[-1][1])} at step {last[-1][0]}" if last else "")]
    later = [st for st, _ in points([r for r in run.train if r["step"] > s], "loss")]
    if later:
        ev.append(f"the loss was finite again at step {later[0]}: the run went on (a dynamic loss scale skips the "
                  f"updates of overflowing steps)")
    gn = [v for _, v in points(before + bad[:1], "grad_norm")]
    exploding = len(gn) >= 3 and gn[-1] > EXPLODE_FACTOR * early_median(gn)
    if len(gn) >= 3:
        ev.append(f"grad_norm before it: {g(early_median(gn))} early, {g(gn[-1])} last"
                  + (f" ({gn[-1] / early_median(gn):.0f}x: exploding)" if exploding else " (not exploding)"))
    skipped = sum(r.get("skipped_interval") or 0 for r in before + bad[:1])
    overflowing = skipped >= 3 and skipped >= OVERFLOW_SHARE * s
    ev.append(f"{skipped} of {s} steps up to {s} overflowed and were skipped by the loss scale")
    fp16 = run.cfg("precision.compute_dtype") == "float16"
    causes = []
    if exploding:
        causes.append(cause(f"exploding gradients: the LR is too high or clipping too loose "
                            f"(train.lr = {g(run.cfg('train.lr'))}, train.clip_grad = {run.cfg('train.clip_grad')})",
                            "high"))
    if fp16:
        causes.append(cause("float16 overflow: activations or gradients above 65504"
                            + (" (overflows were frequent before the NaN)" if overflowing else ""),
                            "high" if overflowing or not exploding else "medium"))
    if not fp16 and overflowing:
        causes.append(cause("non-finite gradients in float32/bfloat16 are not a range problem: a NaN source in the "
                            "graph", "medium"))
    causes.append(cause("a NaN/Inf source: bad input ids or a numerically unsafe op (log of 0, division by zero, "
                        "a softmax row masked entirely)", "low" if exploding or fp16 else "medium"))
    if not exploding:
        causes.append(cause(f"exploding gradients (LR too high: train.lr = {g(run.cfg('train.lr'))})", "low"))
    actions = [f"ms-llm debug nan --run-dir {rd} (finds the first op and layer producing NaN/Inf)"]
    if fp16:
        actions.append("--set precision.compute_dtype=bfloat16 (float32's range at float16's cost)")
    actions += lr_actions(run)[:1] + (["--set train.clip_grad=1.0"] if not run.cfg("train.clip_grad") else [])
    actions.append(f"restart from the last checkpoint before step {s} (checkpoint.save_interval keeps them)")
    return [Finding("loss_nonfinite", "error", nonfinite_symptom(s), ev, causes, actions, [s])]


def rule_nonfinite_val(run):
    bad = [r["step"] for r in run.evals if nonfinite(r.get("val_loss"))]
    if not bad:
        return None
    return [Finding("loss_nonfinite", "error", nonfinite_val_symptom(bad[0]), [f"val_loss non-finite at steps {steps_text(bad)}"],
                    [cause("evaluation overflows in float16 (no loss scale protects the forward pass)",
                           "medium" if run.cfg("precision.compute_dtype") == "float16" else "low"),
                     cause("an empty or padded-only validation batch (division by zero tokens)", "low"),
                     cause("validation ids outside the vocabulary (dataset built with another tokenizer)", "low")],
                    [f"ms-llm debug nan --run-dir {quoted(run.path)}",
                     "check data.dataset_dir's manifest.json: vocab_size and tokenizer match the model"], bad[:1])]


# --- the start -------------------------------------------------------------------------------------

def initial_start(run):
    """The judged loss before any update (ms_llm.rundir.start), from the first log record's initial_loss; None
    for runs that did not record it (before it was recorded, or resumed past it)."""
    if not run.token_loss:
        return None  # judged against ln(vocab): a level of cross-entropy, not of a preference loss
    first = run.train[0] if run.train else {}
    return judge_start(first.get("initial_loss"), run.cfg("model.vocab_size"),
                       fresh=not run.cfg("checkpoint.load_weights"))


@rule(finds=('bad_start',), live=CHEAP)
def rule_start(run, found, _):
    start = initial_start(run)
    if start is None or start.verdict == "ok":
        return None
    pts = curve(run)
    std, hidden = run.cfg("model.init_std"), run.cfg("model.hidden_size")
    loaded = run.cfg("checkpoint.load_weights")
    ev = [f"loss before any update (the first step, on the initial weights): {g(start.loss)} (initial_loss, "
          f"metrics.jsonl); ln(vocab_size = {run.cfg('model.vocab_size')}) = {g(start.uniform)}"]
    if pts:
        low = min(pts, key=lambda p: p[1])
        ev.append(f"then: {g(pts[0][1])} (mean of the first log interval, step {pts[0][0]}), lowest {g(low[1])} at "
                  f"step {low[0]}, {g(pts[-1][1])} at step {pts[-1][0]}")
    rd = quoted(run.path)
    if start.verdict == "above":
        # random logits of spread s give ln V + s^2/2; a normalised hidden state times a head of std init_std gives
        # logits of spread about init_std x sqrt(hidden)
        expected = std * math.sqrt(hidden) if std and hidden else None
        ev.append(f"a loss of {g(start.loss)} means logits spread about {start.logit_spread:.1f} before training"
                  + (f"; model.init_std = {g(std)} with hidden_size {hidden} gives about {expected:.2g} "
                     f"(init_std x sqrt(hidden); GPT-2's 0.02 x sqrt(768) = 0.55)" if expected else ""))
        ev.append(f"train.lr = {g(run.cfg('train.lr'))}: not the cause, no update had been applied yet")
        init_explains = expected is not None and expected >= 0.5 * start.logit_spread
        causes = [cause(f"the initialisation is too large: model.init_std = {g(std)} (the usual is 0.02) makes the "
                        f"initial logits spread about {expected:.2g}", "high" if init_explains and not loaded else
                        "medium") if expected else None,
                  cause(f"the loaded weights do not fit this model (checkpoint.load_weights = {loaded}): a "
                        f"conversion or naming mismatch", "high" if loaded and not init_explains else "medium")
                  if loaded else None,
                  cause("the output scale: something multiplies the logits (a head applied without the final norm, "
                        "a logit scale, an untied head initialised like the embeddings)",
                        "low" if init_explains else "medium")]
        causes = [c for c in causes if c]
        causes.sort(key=lambda c: ("[confidence: high]" not in c))
        actions = [f"--set model.init_std=0.02 (now {g(std)})" if std and std > 0.02 else
                   "check the output scale: the final norm before the LM head, any logit multiplier",
                   f"ms-llm debug overfit --config {quoted(config_of(run))} (it judges its own first loss the same "
                   f"way, on 32 samples)"]
        symptom = (f"the loss started at {g(start.loss)}, {start.loss / start.uniform:.1f}x ln(vocab) = "
                   f"{g(start.uniform)}, before any update: the initialisation or the output scale, not the optimizer")
    else:
        causes = [cause("the logged loss is not the mean token cross-entropy: divided by more than the tokens (e.g. by "
                        "the accumulation steps twice) or summed over fewer positions", "medium"),
                  cause("the weights were not fresh: a checkpoint loaded without checkpoint.load_weights saying so",
                        "medium")]
        actions = [f"ms-llm debug overfit --config {quoted(config_of(run))} (checks the optimised loss against an "
                   f"independent next-token loss of the same logits)",
                   f"ms-llm debug dump --run-dir {rd} --output {rd}/dumps/start"]
        symptom = (f"the loss started at {g(start.loss)}, far below ln(vocab) = {g(start.uniform)}, before any update: "
                   f"a fresh model cannot do better than a uniform guess")
    return [Finding("bad_start", "error", symptom, ev, causes, actions, [0])]


def config_of(run):
    from ms_llm.rundir.names import run_config_path

    return run_config_path(run.path)


# --- divergence -------------------------------------------------------------------------------------

@rule(finds=('divergence',), live=CHEAP)
def rule_divergence(run, found, _):
    d = examine(run)  # the criterion (rundir/divergence.py): sweep and lr-find stop on the same verdict
    if not d.diverged:
        return None
    above, uniform, start, gn, blowup = d.above, d.uniform, d.start, d.grad_norms, d.blowup
    onset, best = d.onset if d.onset else (None, None)
    pts = smoothed(d.raw)
    vals = [v for _, v in gn]
    ev = []
    if above:
        ev.append(f"loss {g(above[0][1])} at step {above[0][0]} is above ln(vocab) = {g(uniform)}, the loss of a "
                  f"uniform prediction the model starts from: the first updates made it worse"
                  + (f" (the loss before any update was {g(start.loss)})" if start else ""))
    back = None  # the first smoothed record after the peak at or below the line: the climb came back down
    if onset is not None:
        peak = max((p for p in pts if p[0] >= onset), key=lambda p: p[1])
        line = line_above(best[1])
        back = next((p for p in pts if p[0] > peak[0] and p[1] <= line), None)
        ev.append(f"loss (median of {SMOOTH} records) fell to {g(best[1])} at step {best[0]}, then "
                  + (f"climbed above {g(line)} from step {onset}, up to {g(peak[1])} at step {peak[0]}, and came "
                     f"back to {g(back[1])} by step {back[0]} ({g(pts[-1][1])} at the end, step {pts[-1][0]})"
                     if back else f"stayed above {g(line)} from step {onset} on, up to {g(peak[1])} at step "
                                  f"{peak[0]}"))
    if vals:
        top = max(gn, key=lambda p: p[1])
        ev.append(f"grad_norm: median {g(early_median(vals))} early, {g(top[1])} at step {top[0]} "
                  f"({top[1] / early_median(vals):.1f}x)")
    ev.append(f"train.lr = {g(run.cfg('train.lr'))}, train.warmup_steps = {run.cfg('train.warmup_steps')}, "
              f"train.clip_grad = {run.cfg('train.clip_grad')}")
    judged = lr_judgement(run)
    if judged:
        ev.append(f"{judged[2]} [reference: {judged[3]}]")
    far = f": {judged[1]:,.0f}x the largest peak LR recipes use at this size" if judged and judged[0] == "high" else ""
    clip = run.cfg("train.clip_grad")
    loose = not clip or clip > 1
    sched, sched_actions, settings = causes_for(run, UNSTABLE)
    ev += settings
    strong = [c for c in sched if c.endswith("[confidence: high]")]
    warm = run.cfg("train.warmup_steps")
    causes = strong + [cause(f"learning rate (LR) too high for this model and batch (train.lr = "
                             f"{g(run.cfg('train.lr'))}{far})", "medium" if strong and not far else "high"
                             if above or blowup or far else "medium"),
                       cause(f"LR warmup too short (train.warmup_steps = {warm})",
                             "medium" if warm < 0.01 * (run.max_steps or 0) or warm < 50 else "low") if warm is not None
                       else cause("LR warmup too short (the log does not state the warmup)", "low")]
    causes += [c for c in sched if c not in strong]
    causes += [cause(f"gradient clipping off or loose (train.clip_grad = {clip})", "medium" if not clip else "low")
               ] if loose else []
    causes += [cause("float16 range: growing activations overflow", "low")] \
        if run.cfg("precision.compute_dtype") == "float16" else []
    causes.append(cause("a run of bad batches around the onset (duplicated or corrupt documents)", "low"))
    recipe = ([f"--set train.lr={recipes.fmt(run.cfg('train.lr') / judged[1])} (the largest peak LR recipes use "
               f"at this size)"] if far else [])
    actions = sched_actions + recipe + lr_actions(run) + (["--set train.clip_grad=1.0"] if loose else []) + [
        "--set train.beta2=0.95 (faster-adapting second moment, the usual LLM setting)",
        "--set monitor.tensor_stats.every=50 (which layers' gradients grow)"]
    step, text = symptom(d)
    if back and not (above or blowup):  # an instability the run recovered from: worth fixing, not fatal
        text = f"training was unstable from step {step}: the loss climbed and came back by step {back[0]}"
        return [Finding("divergence", "warning", text, ev, causes, actions, [step, back[0]])]
    return [Finding("divergence", "error", text, ev, causes, actions, [step])]


# --- loss not falling: progress.py --------------------------------------------------------------------


# --- suspicious labels ------------------------------------------------------------------------------

@rule(finds=('labels',), live=EVAL)
def rule_labels(run, found, _):
    if not run.token_loss:
        return None  # every level below (near 0, ln V, a val gap in nats) is one of next-token cross-entropy
    pts, evals = curve(run), points(run.evals, "val_loss")
    zero = next(((s, v) for s, v in pts if v < ZERO_LOSS), None)
    ev, causes, steps = [], [], []
    if zero:
        near_val = [v for s, v in evals if s >= zero[0]] or [v for _, v in evals[-1:]]
        ev.append(f"training loss {g(zero[1])} at step {zero[0]} ({100 * zero[0] / (run.max_steps or zero[0]):.0f}% "
                  f"into the run): natural text never gets this low"
                  + (f"; val_loss {g(near_val[0])} after it" if near_val else "; no evaluation to compare"))
        steps.append(zero[0])
        if near_val and near_val[0] < 2 * ZERO_LOSS:
            causes.append(cause("the future is visible to the model: targets equal inputs (not shifted by one) or "
                                "the causal mask is missing — train and val loss both collapse", "high"))
        else:
            causes.append(cause("the training step's targets are not shifted (or shifted twice) while evaluation's "
                                "are: the model learns to copy its input", "high" if near_val else "medium"))
    half = (run.max_steps or math.inf) / 2
    first_eval = evals[0] if evals and evals[0][0] <= half else None
    train_at = [v for s, v in pts if first_eval and s <= first_eval[0]]
    if first_eval and train_at and not splits_differ(run):  # a measured shift is distribution_shift's to name
        gap = first_eval[1] - train_at[-1]
        if gap > max(VAL_GAP_ABS, VAL_GAP_REL * train_at[-1]):
            ev.append(f"first evaluation at step {first_eval[0]}: val_loss {g(first_eval[1])} vs training loss "
                      f"{g(train_at[-1])} (+{g(gap)}) — too early in the run for overfitting")
            steps.append(first_eval[0])
            if not zero:  # with a collapsed training loss the cause above already says this
                causes.append(cause("training and evaluation build targets differently (one shifts, the other does "
                                    "not, or shifts twice)", "medium"))
            causes.append(cause("the validation split comes from another tokenizer or distribution "
                                "(data.dataset_dir)", "medium"))
    vocab = run.cfg("model.vocab_size")
    if len(evals) >= 2 and len(pts) >= MIN_RECORDS and vocab and not steps:
        # a fall from above the uniform level (a bad start) is recovery, not learning: measured from ln V at most
        uniform = math.log(vocab)
        top = min(pts[0][1], uniform)
        fell = (top - pts[-1][1]) / top
        if min(v for _, v in evals) > STUCK_VAL * uniform and fell > STUCK_TRAIN_DROP:
            ev.append(f"training loss fell {100 * fell:.0f}% ({g(top)} → {g(pts[-1][1])}) while val_loss never "
                      f"left the uniform-prediction level ln(vocab) = {g(uniform)} (best {g(min(v for _, v in evals))}):"
                      f" what the step learns does not transfer to next-token prediction")
            steps.append(evals[-1][0])
            causes.append(cause("the training step's targets are not the next tokens (not shifted, or shifted "
                                "twice) while evaluation's are", "high"))
            causes.append(cause("the validation split comes from another tokenizer or distribution "
                                "(data.dataset_dir)", "medium"))
    if not ev:
        return None
    causes.append(cause("memorising a tiny dataset over many epochs (then val_loss rises while train falls)", "low"))
    actions = ["ms-llm debug overfit (checks model + labels on one batch)",
               "decode one training batch and check targets == inputs shifted by one token (ids[:, 1:] vs "
               "ids[:, :-1]), in the training step and in evaluation",
               "check data.dataset_dir/manifest.json: tokenizer and vocab_size match config.yaml"]
    return [Finding("labels", "error", "suspicious labels: loss too low to be real or val far above train", ev,
                    causes, actions, steps)]


def splits_differ(run):
    """The dataset's manifest measured the splits' token distributions apart (ms_llm.data.overlap)."""
    from ms_llm.data.overlap import SHIFT_WARN
    from ms_llm.diagnose.references import split_overlap

    kl = (split_overlap(run)[0] or {}).get("unigram_kl_val_train_nats")
    return isinstance(kl, (int, float)) and kl >= SHIFT_WARN


# --- loss spikes ------------------------------------------------------------------------------------

def noise_scale(values, centre):
    """Standard deviation of `values` that ignores their 10% largest deviations (earlier spikes, the steep first
    records): RMS of the closest 90%, divided by 0.789, its value for Gaussian noise of unit deviation."""
    dev = sorted(abs(v - centre) for v in values)[:max(1, math.ceil(0.9 * len(values)))]
    return math.sqrt(sum(d * d for d in dev) / len(dev)) / 0.789


@rule(finds=('loss_spikes',), live=CHEAP)
def rule_spikes(run, found, _):
    pts = before_cut(run, curve(run))
    # z-score of the jump from the previous record against the previous jumps: the trend of a falling loss
    # cancels out
    jumps = [pts[i][1] - pts[i - 1][1] for i in range(1, len(pts))]
    spikes = []
    for i in range(SPIKE_MIN_WINDOW, len(jumps)):
        window = jumps[max(0, i - SPIKE_WINDOW):i]
        centre = statistics.median(window)
        prev = pts[i][1]
        scale = max(noise_scale(window, centre), 0.01 * prev)  # floor: a flat tail's tiny noise is no spike
        if not prev > 0 or not scale > 0:  # a loss of 0 (or below) after a flat stretch: no relative jump to judge
            continue
        z = (jumps[i] - centre) / scale
        s, v = pts[i + 1]
        if z > SPIKE_Z and v > (1 + SPIKE_REL) * prev:
            spikes.append((s, v, prev, z))
    if not spikes:
        return None
    if len(spikes) == 1 and recovered(pts, spikes[0]):
        return [one_spike(run, pts, spikes[0])]
    ev = [f"step {s}: loss {g(v)}, up from {g(m)} at the record before (+{100 * (v - m) / m:.0f}%; z = {z:.1f} "
          f"against up to {SPIKE_WINDOW} previous changes)" for s, v, m, z in spikes[:10]]
    sched, sched_actions, settings = causes_for(run, UNSTABLE)
    ev += settings
    causes = [c for c in sched if c.endswith("[confidence: high]")] + [
        cause("bad batches at those steps (corrupt, duplicated or very long/repetitive documents)",
              "medium" if len(spikes) <= 3 else "low"),
        cause(f"LR near the edge of stability (train.lr = {g(run.cfg('train.lr'))})",
              "medium" if len(spikes) > 3 else "low"),
        cause(f"Adam's second moment adapting too slowly (train.beta2 = {run.cfg('train.beta2')})",
              "medium" if (run.cfg("train.beta2") or 0) >= 0.999 else "low")]
    causes += [c for c in sched if not c.endswith("[confidence: high]")]
    if run.cfg("precision.compute_dtype") == "float16":
        causes.append(cause("float16 precision loss in attention logits or norms", "low"))
    where = steps_text([s for s, *_ in spikes])
    actions = sched_actions + [f"inspect the batches of steps {where} (data position = step x "
               f"global_batch_size samples)", "--set train.beta2=0.95", lr_actions(run)[0],
               "--set train.clip_grad=1.0" if not run.cfg("train.clip_grad") else "--set monitor.tensor_stats.every=50"]
    return [Finding("loss_spikes", "warning", f"{len(spikes)} loss spike(s) at steps "
                    f"{steps_text([s for s, *_ in spikes])}", ev, causes, actions, [s for s, *_ in spikes])]


def recovered(pts, spike):
    """The record after the spike is back near the level before it (within half the spike's threshold)."""
    s, v, prev, _ = spike
    after = [x for st, x in pts if st > s][:1]
    return bool(after) and after[0] < (1 + SPIKE_REL / 2) * prev


def one_spike(run, pts, spike):
    """A single loss spike the run recovered from at once: a note (one record is not an instability)."""
    s, v, prev, z = spike
    after = next((st, x) for st, x in pts if st > s)
    return Finding("loss_spikes", "info", f"note: one loss spike at step {s}, recovered by the next record",
                   [f"step {s}: loss {g(v)}, up from {g(prev)} at the record before (+{100 * (v - prev) / prev:.0f}%; "
                    f"z = {z:.1f}); {g(after[1])} at step {after[0]}: back at the level before it",
                    "one record the run recovers from is not an instability: two or more spikes, or a level that "
                    "stays up, would be"],
                   [cause("one unusual batch (a repetitive or very long document) or one large update", "medium")],
                   [f"if it repeats: inspect the batches of step {s} (data position = step x global_batch_size "
                    f"samples); --set train.log_interval=1 shows single steps"], [s])
