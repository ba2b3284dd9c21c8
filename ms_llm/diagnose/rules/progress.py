"""Is the loss making the progress it should? (`ms-llm diagnose`'s progress rules.) Judged against references, not only
against the first record (ms_llm/diagnose/references.py):

- a loss at ln(vocab) has learned nothing (`loss_not_falling`);
- a loss flat at the data's unigram entropy predicts token frequencies and ignores the context (`loss_plateau`);
- a loss still above the unigram entropy after the warmup and 200 steps, falling steadily, learns too slowly
  (`slow_progress`);
- a loss flat anywhere above the unigram entropy has stalled (`loss_plateau`);
- a loss clearly above what sibling runs of the same config reached at the same steps (`behind_siblings`).

The causes of each come with the evidence for them (../causes.py, schedule.py) and, where two fit,
the experiment that tells them apart.
"""
import statistics

from ms_llm.diagnose.causes import (GRAD_GROWTH, UPDATE_RATIO_LOW, clipping, CLIP_SWING_CV,
                                          describe_update_ratio, grad_growth, lr_experiment, lr_reached, lr_text,
                                          overfit_action, update_ratio)
from ms_llm.diagnose.common import (FLAT_MIN_STEPS, FLAT_REL_DROP, MIN_RECORDS, UNIFORM_FRAC, Finding, cause,
                                          curve, g, points, quoted)
from ms_llm.diagnose.references import late_window, loss_at, siblings, trend, uniform_loss, unigram_entropy
from ms_llm.diagnose.rules.schedule import SLOW, causes_for
from ms_llm.diagnose.rules.settings import lr_judgement
from ms_llm.diagnose.registry import EVAL, OFFLINE, rule

SLOW_MIN_STEPS = 200     # a loss still above the unigram entropy this late (and past 2x warmup) is slow
UNIGRAM_BAND = 0.04      # flat within 4% of the unigram entropy: the context-free level
NOISY_REL = 0.03         # noise around the late trend above 3% of the loss: a bouncing loss
SIB_ABS, SIB_REL, SIB_SPREAD = 0.05, 0.05, 3.0  # behind siblings by max(0.05, 5%, 3x their spread)
TINY_HIDDEN = 16         # a model narrower than this may be unable to use the context at all


@rule(finds=('slow_progress', 'loss_plateau', 'loss_not_falling'), reads=('loss_nonfinite', 'divergence', 'moe_aux_too_large', 'bad_start', 'underfitting'), live=EVAL)
def rule_progress(run, found, limit):
    if "loss_nonfinite" in found or "divergence" in found or "moe_aux_too_large" in found:
        return None  # those explain the curve better
    out = judge_progress(run)
    if out and "bad_start" in found:  # a model that started far off is still recovering from its start
        f = out[0]
        f.causes.insert(0, cause(f"the start: {found['bad_start'].symptom} (bad_start); the loss is still recovering "
                                 f"from it", "high"))
        f.actions.insert(0, found["bad_start"].actions[0])
    elif out and "underfitting" in found:  # validation stalled at the context-free level: its suspect, when sure
        f, top = out[0], found["underfitting"].causes[0]
        if top.endswith("[confidence: high]") and not f.causes[0].endswith("[confidence: high]"):
            f.causes.insert(0, top.replace(" [confidence: high]", " (underfitting) [confidence: high]"))
            f.actions.insert(0, found["underfitting"].actions[0])
    return out


def judge_progress(run):
    pts = curve(run)
    warm, n = run.cfg("train.warmup_steps") or 0, run.max_steps or 0
    if len(pts) < MIN_RECORDS or pts[-1][0] < max(FLAT_MIN_STEPS, min(warm, n // 2 if n else warm)):
        return None
    uniform, h1 = uniform_loss(run), unigram_entropy(run)
    late = statistics.median(v for _, v in pts[-3:])
    tr = trend(late_window(pts))
    last = pts[-1][0]
    ev = [f"loss {g(pts[0][1])} at step {pts[0][0]}, {g(late)} (median of the last 3 records) at step {last}; "
          f"over steps {tr.first_step}-{tr.last_step} the fitted line {'falls' if tr.drop >= 0 else 'rises'} "
          f"{g(abs(tr.drop))} with noise {g(tr.noise)} around it"]
    if uniform:
        ev.append(f"references: ln(vocab_size = {run.cfg('model.vocab_size')}) = {g(uniform)} (a uniform guess)"
                  + (f"; unigram entropy of the training data = {g(h1.nats)} ({h1.source}): the loss of a model that "
                     f"ignores the context" if h1 else "; unigram entropy unknown (dataset not reachable from here)"))
    slow_gate = max(SLOW_MIN_STEPS, 2 * min(warm, n // 4 if n else warm))
    above = (late > h1.nats) if h1 else (uniform is not None and late > 0.9 * uniform)
    if tr.falling_steadily:
        if above and last >= slow_gate:
            return [slow_finding(run, pts, late, tr, h1, uniform, ev)]
        return None
    if uniform and late >= UNIFORM_FRAC * uniform:
        return [stalled_finding(run, pts, late, tr, h1, uniform, ev, "loss_not_falling")]
    if h1 and above and last >= slow_gate:
        return [stalled_finding(run, pts, late, tr, h1, uniform, ev, "loss_plateau")]
    if h1 and tr.flat and abs(late - h1.nats) <= UNIGRAM_BAND * h1.nats and last >= slow_gate:
        # (small models can pass through a short unigram phase early: only a plateau past the slow gate counts)
        return [stalled_finding(run, pts, late, tr, h1, uniform, ev, "loss_plateau")]
    if not h1 and pts[0][1] - late < FLAT_REL_DROP * pts[0][1]:
        return [stalled_finding(run, pts, late, tr, h1, uniform, ev, "loss_not_falling")]
    return None


def lr_evidence(run, tr, ev):
    """Adds the LR-related evidence lines; returns (update ratio or None, noisy, growing grad norms, clip info)."""
    ur = update_ratio(run)
    if ur:
        ev.append(describe_update_ratio(ur))
    reached = lr_reached(run)
    if reached:
        (ps, pv), (ls, lv) = reached
        ev.append(f"{lr_text(run)}; logged LR: largest {g(pv)} (step {ps}), last {g(lv)} (step {ls})")
    judged = lr_judgement(run)
    if judged:
        ev.append(f"{judged[2]} [reference: {judged[3]}]")
    noisy = tr.level > 0 and tr.noise / tr.level > NOISY_REL
    growth = grad_growth(run)
    if growth is not None:
        ev.append(f"grad_norm late / early = {growth:.2f}" + (" (growing)" if growth >= GRAD_GROWTH else ""))
    clip = clipping(run)
    if clip and clip[0] >= 0.9:
        share, med, cv = clip
        ev.append(f"grad_norm above train.clip_grad = {g(run.cfg('train.clip_grad'))} in {100 * share:.0f}% of the "
                  f"records (median {g(med)}, variation {cv:.2f}): "
                  + ("the clip factor swings, so clipping changes AdamW's step sizes" if cv >= CLIP_SWING_CV else
                     "a steady clip factor, which AdamW's normalisation cancels: clipping is not what limits the "
                     "updates"))
    return ur, noisy, growth is not None and growth >= GRAD_GROWTH, clip


def slow_finding(run, pts, late, tr, h1, uniform, ev):
    last = pts[-1][0]
    ref = (f"the unigram entropy {g(h1.nats)}" if h1 else f"90% of ln(vocab) = {g(0.9 * uniform)}")
    ur, noisy, growing, clip = lr_evidence(run, tr, ev)
    sched, sched_actions, settings = causes_for(run, SLOW)
    ev += settings
    strong_sched = any(c.endswith("[confidence: high]") for c in sched)
    causes = [c for c in sched if c.endswith("[confidence: high]")]
    smooth = tr.smooth
    step_share = lr_step_share(run)
    if step_share is not None:
        ev.append(f"an Adam step moves a weight by about the LR: {g(run.cfg('train.lr'))} is {step_share:.2g} of the "
                  f"init scale model.init_std = {g(run.cfg('model.init_std'))}")
    judged = lr_judgement(run)
    if (ur and ur[0] < UPDATE_RATIO_LOW) or (judged and judged[0] == "low" and not strong_sched):
        conf = "high"
    elif strong_sched:
        conf = "low"
    else:
        conf = "high" if smooth else "medium"
    causes.append(cause(f"learning rate too low for this model ({lr_text(run)}): the loss falls steadily"
                        + (" and smoothly (noise " + f"{100 * tr.noise / tr.level:.2f}% of the loss)" if smooth else "")
                        + ", but slowly"
                        + (f"; the update ratio {ur[0]:.2g} is small" if ur and ur[0] < UPDATE_RATIO_LOW else ""),
                        conf))
    causes += [c for c in sched if not c.endswith("[confidence: high]")]
    if clip and clip[0] >= 0.9 and clip[2] >= CLIP_SWING_CV:
        causes.append(cause(f"train.clip_grad = {g(run.cfg('train.clip_grad'))} too small: every update is clipped "
                            f"and the factor swings (variation {clip[2]:.2f})", "medium"))
    causes.append(cause("the run is still early for this model: the loss is still falling", "low"))
    lr = run.cfg("train.lr")
    if strong_sched:  # fix the schedule first; the LR itself is judged after that
        actions = sched_actions
    else:
        actions = sched_actions + [f"--set train.lr={3 * lr:.3g} (3x)"] + lr_experiment(run)
        if not ur:
            actions.append("--set monitor.tensor_stats.every=50 (the update ratios ||dw||/||w|| confirm a small LR)")
    return Finding("slow_progress", "warning", f"loss falling too slowly: still above {ref} at step {last}", ev,
                   causes, actions, [pts[0][0], last])


def stalled_finding(run, pts, late, tr, h1, uniform, ev, fid):
    last = pts[-1][0]
    ur, noisy, growing, clip = lr_evidence(run, tr, ev)
    sched, sched_actions, settings = causes_for(run, SLOW)
    ev += settings
    causes = [c for c in sched if c.endswith("[confidence: high]")]
    gn = [v for _, v in points(run.train, "grad_norm")]
    at_uniform = uniform is not None and late >= UNIFORM_FRAC * uniform
    near_h1 = h1 is not None and abs(late - h1.nats) <= UNIGRAM_BAND * h1.nats
    skipped = run.train[-1].get("skipped") or 0
    if skipped >= 0.5 * last:
        ev.append(f"{skipped} of {last} steps were skipped as overflows")
        causes.append(cause("most optimizer steps are skipped (loss-scale overflow): the weights barely change",
                            "high"))
    if at_uniform:
        symptom = f"loss not falling after {last} steps: stuck at the uniform-guess level"
        if gn and statistics.median(gn) < 1e-6:
            causes.append(cause(f"zero gradients (median grad_norm {g(statistics.median(gn))}): parameters frozen or "
                                f"detached from the loss", "high"))
        causes.append(cause("nothing is learned: the updates do not reach the weights (LR ≈ 0, frozen parameters) or "
                            "the targets are unrelated to the inputs", "medium"))
    elif near_h1:
        symptom = (f"loss stalled at the context-free level: {g(late)} ≈ unigram entropy {g(h1.nats)} at step {last}")
        causes.append(cause("the predictions ignore the context: the targets are not the next tokens of the inputs "
                             "(a misaligned or shuffled batch) or the inputs never reach the output (an embedding, "
                             "attention or mask bug); an LR problem slows or bounces a loss, it does not stop it "
                             "exactly at the unigram entropy", "high" if not causes and tr.flat and not
                             0 < (run.cfg("model.hidden_size") or 0) < TINY_HIDDEN else "medium"))
    else:
        symptom = f"loss stalled at {g(late)} after {last} steps" + (
            f", above the context-free level {g(h1.nats)}" if h1 and late > h1.nats else "")
    if fid == "loss_not_falling" and not at_uniform:
        symptom = f"loss not falling after {last} steps"
    causes += [c for c in sched if not c.endswith("[confidence: high]")]
    if noisy or growing:
        causes.append(cause(f"learning rate too high: the loss bounces on a plateau ({lr_text(run)}"
                            + (f"; noise {100 * tr.noise / tr.level:.1f}% of the loss" if noisy else "")
                            + ("; grad norms growing" if growing else "") + ")", "medium"))
    if ur and ur[0] < UPDATE_RATIO_LOW:
        causes.append(cause(f"learning rate too low: update ratio {ur[0]:.2g} ({lr_text(run)})", "medium"))
    elif not (noisy or growing):
        causes.append(cause(f"learning rate too low or too high ({lr_text(run)}): the curve alone does not say which",
                            "low"))
    if not near_h1:
        causes.append(cause("a label bug: targets misaligned with inputs (not shifted by one, or shuffled separately)",
                            "medium" if not sched else "low"))
    else:
        h = run.cfg("model.hidden_size") or 0
        causes.append(cause(f"a model too small to use the context (hidden_size {h}, "
                            f"{run.final.get('parameters') or '?'} parameters): --set model.hidden_size={2 * h} tells",
                            "medium" if 0 < h < TINY_HIDDEN else "low"))
    causes.append(cause("a fine-tuned model already at its plateau (checkpoint.load_weights) — then this is expected",
                        "medium" if run.cfg("checkpoint.load_weights") else "low"))
    actions = sched_actions + [overfit_action(run)]
    if near_h1:
        actions.append("decode one training batch and check targets == inputs shifted by one token (ids[:, 1:] vs "
                       "ids[:, :-1]), sample by sample")
    if not causes[0].endswith("[confidence: high]"):  # an LR problem is still in the running
        actions += lr_experiment(run)
    return Finding(fid, "error", symptom, ev, causes, actions, [pts[0][0], last])


def lr_step_share(run):
    """The peak LR relative to model.init_std: how far one Adam step (about lr per weight) moves a typical weight."""
    lr, std = run.cfg("train.lr"), run.cfg("model.init_std")
    return lr / std if lr and std else None


# --- sibling runs ------------------------------------------------------------------------------------

@rule(finds=('behind_siblings',), reads=('loss_nonfinite', 'divergence', 'moe_aux_too_large'), live=OFFLINE)
def rule_siblings(run, found, _):
    if "loss_nonfinite" in found or "divergence" in found or "moe_aux_too_large" in found:
        return None
    pts = curve(run)
    if len(pts) < MIN_RECORDS:
        return None
    sibs = siblings(run)
    if not sibs:
        return None
    rows = []
    for s, v in late_window(pts, 1 / 3, 3):
        vals = [x for x in (loss_at(sib, s) for sib in sibs) if x is not None]
        if vals:
            rows.append((s, v, statistics.median(vals), spread_of(vals)))
    if len(rows) < 3:
        return None
    gap = statistics.median(v - m for _, v, m, _ in rows)
    ref = statistics.median(m for _, _, m, _ in rows)
    spread = statistics.median(sp for *_, sp in rows)
    line = max(SIB_ABS, SIB_REL * ref, SIB_SPREAD * spread)
    if gap <= line:
        return None
    names = ", ".join(sib.name for sib in sibs[:5]) + (" ..." if len(sibs) > 5 else "")
    ev = [f"steps {rows[0][0]}-{rows[-1][0]}: loss {g(rows[-1][1])} at step {rows[-1][0]} vs {g(rows[-1][2])} for "
          f"{len(sibs)} sibling run(s) of the same config ({names}); {g(gap)} higher (median over {len(rows)} records; "
          f"the siblings spread {g(spread)} (median range or interquartile range), so more than {g(line)} is not seed "
          f"noise)"]
    diffs = env_differences(run, sibs[0])
    ev += [f"{k}: {a} here, {b} in {sibs[0].name}" for k, a, b in diffs] or [
        f"run_info.json: same git revision, versions and device as {sibs[0].name}"]
    keys = {k for k, *_ in diffs}
    causes = []
    if "git_revision" in keys:
        causes.append(cause("the code changed between the runs (git revisions differ)", "high"))
    if any(k.startswith("versions") for k in keys):
        causes.append(cause("framework or library versions differ", "medium"))
    dirty = str(run.info.get("git_revision") or "").endswith("-dirty")
    causes.append(cause("code that is not in the revision ran: uncommitted changes" + (" (the revision is marked "
                        "-dirty)" if dirty else "") + ", or the model/step patched in-process; same config, so the "
                        "computation differs", "medium" if not causes else "low"))
    causes.append(cause(f"the data changed: {run.cfg('data.dataset_dir')} rewritten or a different copy", "low"))
    if len(sibs) == 1 and run.cfg("train.seed") != sibs[0].cfg("train.seed"):
        causes.append(cause("seed variance (only one sibling, with another seed)", "low"))
    rd, sd = quoted(run.path), quoted(sibs[0].path)
    actions = [f"ms-llm runs --diff {rd} {sd} (config and environment differences)",
               f"ms-llm compare-curves {rd} {sd} (the first step where the curves part: from the start = code or data)",
               f"ms-llm debug dump --run-dir {rd} --output {rd}/dumps/here and the same for {sd}, then ms-llm compare "
               f"(needs checkpoints of the same step: checkpoint.save_interval)"]
    return [Finding("behind_siblings", "warning", f"loss {g(gap)} above sibling runs of the same config at steps "
                    f"{rows[0][0]}-{rows[-1][0]}", ev, causes, actions, [rows[0][0], rows[-1][0]])]


def spread_of(vals):
    """How far sibling losses at one step lie apart: the range of up to 3, else the interquartile range (a folder
    of debugging runs holds broken siblings too; the median and the IQR ignore a minority of them)."""
    if len(vals) <= 3:
        return max(vals) - min(vals)
    q = statistics.quantiles(vals, n=4)
    return q[2] - q[0]


def env_differences(run, other):
    from ms_llm.rundir.reader import ENV_KEYS, changed, flatten

    a = flatten({k: run.info.get(k) for k in ENV_KEYS if k in run.info and k != "host"})
    b = flatten({k: other.info.get(k) for k in ENV_KEYS if k in other.info and k != "host"})
    return [(k, x, y) for k, x, y in changed(a, b) if not k.startswith("parallel")]
