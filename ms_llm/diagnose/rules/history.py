"""What changed at a resume, and what it did (`ms-llm diagnose`): the keys of config.resume_<n>.yaml that differ
from the config before it (../history.py) are evidence, and the curve around step n says which of them mattered:

- the loss jumps in the first records after n (above its level before n by more than its noise);
- the loss, falling before n, is flat after it, or rises after it (a plateau, a new slope);
- the logged LR or the gradient norm jumps at n;
- the steps after n run at another speed (a changed context/monitor setting).

A change that shows is a finding, and the first cause of the spike, divergence or stall that starts at n (which
the curve rules alone blame on bad batches or the LR). A resume that changed nothing but is followed by a jump
names the resume itself: state that did not come back as it was. A change that shows nothing is a note.
"""
import math
import statistics

from ms_llm.diagnose.common import Explains, Finding, cause, curve, g, points, quoted
from ms_llm.diagnose.history import resumes
from ms_llm.diagnose.rules.device import run_contention
from ms_llm.diagnose.references import trend
from ms_llm.diagnose.registry import CHEAP, rule

WINDOW = 8              # log records looked at on each side of a resume
JUMP_REL, JUMP_Z = 0.05, 3.0  # a loss after the resume 5% and 3 noise deviations above its level before it (3, not
                              # the spike rule's 5: the step is known in advance, not searched for among all records)
SLOPE_RECORDS = WINDOW  # records on each side of n whose slopes are compared
STALL_SLOPE = 0.1       # falling after n at under 10% of the rate just before it, flat within its noise: a stall
LR_JUMP = 1.5           # logged LR after / before outside [1/1.5, 1.5]
GRAD_JUMP = 3.0         # grad norm after / before above 3x
SPEED_CHANGE = 0.2      # tokens/s after / before outside [0.8, 1.25]
SHOWS_AT = 3            # a finding whose first step is within this many log intervals after n starts there
LOSS_EFFECTS = ("jumped", "rises", "stalled")  # what the loss did (an LR or grad-norm jump alone is a note)

WHAT = {  # what a changed key does to the steps after the resume
    "train.lr": "the peak LR: every update after the resume is scaled by it",
    "train.min_lr": "the LR the decay ends at",
    "train.max_steps": "the LR schedule is recomputed over the new length, so the LR jumps to where the new "
                       "schedule is at step n",
    "train.warmup_steps": "the LR schedule (a warmup that now ends later or earlier)",
    "train.decay_steps": "the LR schedule's decay",
    "train.lr_schedule": "the LR schedule",
    "train.global_batch_size": "the batch each update averages over (and so its noise and the right LR)",
    "train.weight_decay": "the decay each step applies to the weights",
    "train.clip_grad": "the largest update a step can make",
    "train.beta1": "Adam's first moment", "train.beta2": "Adam's second moment (how fast step sizes adapt)",
    "train.eps": "Adam's step size for small gradients",
    "train.seed": "the data order from the resume on",
    "model.dropout": "the dropout the steps train with",
    "precision.compute_dtype": "the precision the steps compute in",
    "precision.loss_scale": "the loss scaling", "precision.init_scale": "the loss scaling",
}


def noise_of(pts):
    """The noise of a short stretch of records: the spread of their record-to-record changes."""
    from ms_llm.diagnose.rules.loss import noise_scale

    jumps = [b - a for (_, a), (_, b) in zip(pts, pts[1:])]
    if len(jumps) < 3:
        return 0.0
    return noise_scale(jumps, statistics.median(jumps))


def sides(pts, n, k=WINDOW):
    return [p for p in pts if p[0] <= n][-k:], [p for p in pts if p[0] > n][:k]


def loss_effects(run, n):
    """[(what happened: "jumped", "rises", "stalled", "logged LR jumped", "gradient norm jumped", evidence line)] at
    step n."""
    pts = curve(run)
    before, after = sides(pts, n, 2 * WINDOW)
    out = []
    if len(before) >= 3 and after:
        # the level just before the resume: the last record (a falling loss's earlier records lie above it)
        level = min(before[-1][1], statistics.median(v for _, v in before[-3:]))
        noise = trend(before[-WINDOW:]).noise if len(before) >= 4 else noise_of(before)
        s, peak = max(after[:2], key=lambda p: p[1])
        if peak > level + max(JUMP_Z * noise, JUMP_REL * level):
            out.append(("jumped", f"the loss jumped to {g(peak)} at step {s}, the first record(s) after the resume, "
                                  f"from {g(level)} before it (at step {before[-1][0]}; "
                                  f"+{100 * (peak - level) / level:.0f}%"
                                  + (f", noise {g(noise)} per record)" if noise > 0 else ")")))
    # the slope of the SLOPE_RECORDS on each side of n (after a jump's records: a spike would pass for noise)
    jumped = bool(out)
    b, a = before[-SLOPE_RECORDS:], after[2:2 + SLOPE_RECORDS] if jumped else after[:SLOPE_RECORDS]
    if len(b) >= 4 and len(a) >= 4:
        tb, ta = trend(b), trend(a)
        # a healthy loss decelerates too (adjacent windows of an exponential decay): a stall falls far slower
        stalled = tb.falling_steadily and ta.flat and -ta.slope < STALL_SLOPE * -tb.slope
        if ta.drop < -max(3 * ta.noise, 0.002 * ta.level):
            out.append(("rises", f"the loss rises after the resume: {g(a[0][1])} at step {a[0][0]} → {g(a[-1][1])} "
                                 f"at step "
                       f"{a[-1][0]} (before it, it " + ("fell" if tb.falling_steadily else "was flat") + ")"))
        elif stalled:
            out.append(("stalled", f"the loss fell before the resume ({g(abs(tb.drop))} over steps {tb.first_step}-"
                       f"{tb.last_step}) and is flat after it ({g(ta.drop)} over steps {ta.first_step}-{ta.last_step},"
                       f" noise {g(ta.noise)})"))
    for key, label, factor in (("lr", "logged LR", LR_JUMP), ("grad_norm", "gradient norm", GRAD_JUMP)):
        kb, ka = sides(points(run.train, key), n, 3)
        if kb and ka and kb[-1][1] > 0:
            ratio = ka[0][1] / kb[-1][1]
            if ratio > factor or (key == "lr" and ratio < 1 / factor):
                out.append((f"{label} jumped", f"the {label} went {g(kb[-1][1])} (step {kb[-1][0]}) → "
                                               f"{g(ka[0][1])} (step {ka[0][0]}): "
                           f"{ratio:.2g}x at the resume"))
    return out


def speed_effect(run, n):
    """An evidence line when the steps after the resume run at another speed, or None."""
    pts = points(run.train, "tokens_per_s")
    before, after = sides(pts, n)
    after = after[1:]  # the first record after a restart carries the compile/warm-up
    if len(before) < 3 or len(after) < 3:
        return None
    b, a = statistics.median(v for _, v in before), statistics.median(v for _, v in after)
    if b <= 0 or 1 - SPEED_CHANGE <= a / b <= 1 / (1 - SPEED_CHANGE):
        return None
    return (f"tokens/s {b:,.0f} before the resume (median of {len(before)} records) and {a:,.0f} after it "
            f"({a / b:.2f}x)")


@rule(finds=('resume_*',), reads=('divergence', 'loss_nonfinite', 'loss_spikes', 'loss_plateau', 'slow_progress', 'loss_not_falling', 'underfitting'), live=CHEAP)
def rule_resume(run, found, _):
    out = []
    for r in resumes(run):
        effects = loss_effects(run, r.step)
        lines = [line for _, line in effects]
        speed = speed_effect(run, r.step)
        training, fast = r.of_kind("training"), r.of_kind("speed")
        if speed and run_contention(run):
            speed = None  # other processes took the CPU meanwhile: a change of speed is no evidence
        fid = "resume_change" if not any(f.id == "resume_change" for f in out) else f"resume_change_{r.step}"
        if training and any(kind in LOSS_EFFECTS for kind, _ in effects):
            out.append(change_finding(run, r, fid, training, effects, found))
        elif fast and speed:
            out.append(speed_finding(run, r, fid, fast, speed))
        elif not r.changes and any(kind in LOSS_EFFECTS for kind, _ in effects):
            out.append(resume_finding(run, r, fid, effects, found))
        elif r.changes:
            shows = " and ".join(x for x in ("; ".join(lines), speed) if x)
            out.append(Finding(fid, "info", f"note: the resume at step {r.step} changed "
                               f"{', '.join(c.text() for c in r.changes[:4])}" + (" ..." if len(r.changes) > 4 else ""),
                               [f"{r.path}: {c.text()} ({c.kind})" for c in r.changes[:10]]
                               + [shows or "the curve shows no jump, plateau, new slope or change of speed at that "
                                           "step: the change did nothing visible"],
                               [cause("a change that did not matter for this run's curves", "low")],
                               ["nothing to do; ms-llm runs --diff compares two runs' configs"], [r.step]))
    return out


def started_there(run, f, n):
    """Whether finding `f` (spikes, divergence, a stall) starts within SHOWS_AT log intervals after step n."""
    interval = run.cfg("train.log_interval") or 1
    return any(isinstance(s, int) and n < s <= n + SHOWS_AT * interval for s in f.steps[:1])


def size(change):
    """How far a change moves its key: |log of the ratio| for positive numbers, 1 for anything else."""
    a, b = change.before, change.after
    if all(isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 for x in (a, b)):
        return round(abs(math.log(b / a)), 2)  # (equal moves of two keys tie, then the order of WHAT)
    return 1.0


def change_finding(run, r, fid, training, effects, found):
    n = r.step
    one = len(training) == 1
    order = list(WHAT)
    training = sorted(training, key=lambda c: (-size(c), order.index(c.key) if c.key in order else len(order)))
    causes = [cause(f"the resume at step {n} changed {c.text()}: {WHAT.get(c.key, 'what the steps after it compute')}"
                    + ("" if one or i else f" (the largest of the {len(training)} changes; the experiment below "
                                           f"tells them apart)"), "high" if one else "medium" if i == 0 else "low")
              for i, c in enumerate(training)]
    causes.append(cause("a run of bad batches right after the resume (then the same data would spike without the "
                        "change)", "low"))
    cfg = quoted(r.path)
    actions = [f"resume with {c.key} as before: --set {c.key}={c.before if c.before is not None else 'null'}"
               for c in training[:3]]
    actions.append(f"to tell them apart: resume a copy of the run from its checkpoint of step {n} (ms-llm train "
                   f"--config {cfg} --run-dir COPY --resume) once per key, with that key set back, then ms-llm "
                   f"compare-curves {quoted(run.path)} COPY" if not one else
                   f"to confirm: resume a copy of the run from its checkpoint of step {n} with --set "
                   f"{training[0].key}={training[0].before} and ms-llm compare-curves {quoted(run.path)} COPY: no jump "
                   f"→ the change was the cause")
    bad = any(k in found and started_there(run, found[k], n) for k in ("divergence", "loss_nonfinite"))
    ev = [f"{r.path}: {c.text()}" for c in r.changes[:10]] + [line for _, line in effects]
    symptom = (f"the {what(effects)} at the resume at step {n}, which changed "
               f"{', '.join(c.text() for c in training[:3])}" + (" ..." if len(training) > 3 else ""))
    f = Finding(fid, "error" if bad else "warning", symptom, ev, causes, actions, [n])
    kinds = {kind for kind, _ in effects}
    line = f"{r.path}: {', '.join(c.text() for c in training)}; {effects[0][1]}"
    for k in ("loss_spikes", "divergence", "loss_nonfinite"):  # a jump: what starts right after the resume
        if k in found and (started_there(run, found[k], n) or (k == "loss_spikes" and any(
                n < s <= n + SHOWS_AT * (run.cfg("train.log_interval") or 1) for s in found[k].steps))):
            f.explains.append(Explains(k, causes[0], actions[0], line))
    if kinds & {"rises", "stalled"}:  # a new slope: the progress judged over the run's late part is this one's
        for k in ("loss_plateau", "slow_progress", "loss_not_falling", "underfitting"):
            if k in found:
                f.explains.append(Explains(k, causes[0], actions[0], line))
    return f


def speed_finding(run, r, fid, fast, speed):
    n = r.step
    causes = [cause(f"the resume at step {n} changed {c.text()}", "high" if len(fast) == 1 else "medium")
              for c in fast]
    causes.append(cause("the host: other processes or another machine after the restart (telemetry.jsonl, "
                        "run_info.json host)", "low"))
    return Finding(fid, "warning", f"the steps run at another speed since the resume at step {n}, which changed "
                   f"{', '.join(c.text() for c in fast[:3])}", [f"{r.path}: {c.text()}" for c in r.changes[:10]]
                   + [speed], causes, [f"--set {c.key}={c.before if c.before is not None else 'null'} (as before the "
                                       f"resume)" for c in fast[:3]], [n])


def resume_finding(run, r, fid, effects, found):
    n = r.step
    causes = [cause(f"the resume at step {n} itself: the config is the same, so state that did not come back as it "
                    f"was (the optimizer's moments, the loss scale, the data position or the RNG)", "medium"),
              cause("a run of bad batches right after the resume", "medium")]
    actions = [f"train the same config without stopping to step {n + 3 * (run.cfg('train.log_interval') or 1)} "
               f"and ms-llm compare-curves {quoted(run.path)} THAT_RUN: the same jump → the data; none → the resume",
               "check the resume's log line: the checkpoint step, consumed samples and loss scale it restored"]
    f = Finding(fid, "warning", f"the {what(effects)} at the resume at step {n} (the config did not change)",
                [line for _, line in effects] + [f"{r.path}: no key differs from the config before it"], causes,
                actions, [n])
    for k in ("loss_spikes", "divergence"):
        if k in found and any(n < s <= n + SHOWS_AT * (run.cfg("train.log_interval") or 1) for s in found[k].steps):
            f.explains.append(Explains(k, causes[0], actions[0], effects[0][1]))
    return f


def what(effects):
    """'loss jumped', 'loss rises', ...: the first (strongest) thing the curve did at the resume."""
    kind = effects[0][0]
    return {"jumped": "loss jumped", "rises": "loss rises from there", "stalled": "loss stalled"}.get(kind, kind)
