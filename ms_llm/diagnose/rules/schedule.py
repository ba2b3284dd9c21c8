"""Schedule and optimizer settings read from the config the run used (`ms-llm diagnose`): a warmup longer than
the run, a decay that ends long before or after max_steps, min_lr above lr, a weight decay that shrinks the
weights faster than they learn, beta2 or eps outside the published recipes, a global batch so small that gradient
noise dominates; with settings.py's suspects (the recipes' other settings and what the data supports), every
setting diagnose judges.

Each setting is a *suspect* (suspect.py) with the effect it would have: "slow" (smaller updates than the LR says),
"unstable" (larger or noisier updates), and settings.py's "gap", "start" and "cost". A suspect is reported as a
finding only when the run shows that effect (a progress finding for "slow"; divergence, NaN or spikes for
"unstable"; or the suspect's own evidence), and is then also the first cause of that finding; otherwise it is a
note. Each cites its reference (ms_llm/diagnose/recipes.py, the dataset's manifest).
"""
import math

from ms_llm.diagnose import recipes
from ms_llm.diagnose.causes import grad_rms, lr_reached
from ms_llm.diagnose.common import Explains, Finding, _memo, cause, g
from ms_llm.diagnose.rules import published, settings
from ms_llm.diagnose.rules.suspect import MEASURED, SHOWN_IDS, SLOW, UNSTABLE, Suspect, shown
from ms_llm.diagnose.registry import CHEAP, rule

WARMUP_SHARE = 0.5          # warmup over half the run (the recipes: 0.13-3% of the steps, recipes.py)
DECAY_EARLY, DECAY_LATE = 0.5, 1.5   # decay ending before 50% or after 150% of max_steps
MIN_LR_LOW = 0.2            # a decay that ends early matters when min_lr is below 20% of lr
WD_MAX, WD_STEP_SHARE = 1.0, 0.1  # weight decay above 1 (10x every recipe's 0.1); strong when wd x init_std >= 0.1
BETA2_RANGE = (0.9, 0.9999)
EPS_MAX, EPS_RMS_SHARE = 1e-5, 0.1  # eps above 1e-5 and above 10% of the RMS gradient shrinks Adam's steps
MIN_BATCH_TOKENS = 128      # tokens per optimizer step below this: gradient noise dominates
LR_KEYS = ("lr",)           # suspects the symptom rules name themselves (they cite the recipes: settings.py)


def suspects(run):
    """Every suspect of the run: the schedule's and optimizer's (here) and the recipes' and the data's
    (settings.py), computed once per diagnosis."""
    return _memo(run.train, "suspects", lambda: _suspects(run))


def _suspects(run):
    tc = run.section("train")  # the run's values, the schema's defaults where its config lacks one
    lr, min_lr, warm, n = tc.lr, tc.min_lr, tc.warmup_steps, tc.max_steps
    decay, kind = tc.decay_steps, tc.lr_schedule
    out = []
    reached = lr_reached(run)
    if n and warm > WARMUP_SHARE * n:
        peak = reached[0] if reached else None
        got = (f"; the largest LR logged was {g(peak[1])} at step {peak[0]} ({100 * peak[1] / lr:.0f}% of train.lr)"
               if peak and lr else "")
        out.append(Suspect("warmup", SLOW, f"train.warmup_steps = {warm} "
                           + (f"is longer than the run (train.max_steps = {n})" if warm >= n else
                              f"is {100 * warm / n:.0f}% of the run (train.max_steps = {n}); the recipes warm up "
                              f"for 0.13-3% of their steps") + got,
                           f"warmup longer than the run: the LR never reached its peak (train.warmup_steps = {warm}, "
                           f"train.max_steps = {n})" if warm >= n else
                           f"warmup takes {100 * warm / n:.0f}% of the run (train.warmup_steps = {warm})",
                           f"--set train.warmup_steps={max(1, round(0.02 * n))} (2% of the run)",
                           strong=warm >= n or (peak is not None and peak[1] < 0.5 * lr), key="train.warmup_steps",
                           reference=recipes.cite("warmup_share", scale=lambda v: f"{100 * v:.2g}%")))
    if n and kind != "constant" and decay and decay < DECAY_EARLY * n and min_lr < MIN_LR_LOW * lr:
        out.append(Suspect("decay_early", SLOW, f"train.decay_steps = {decay}: the LR reached train.min_lr = "
                           f"{g(min_lr)} at step {decay} and stayed there for the last {100 * (n - decay) / n:.0f}% "
                           f"of the run (train.max_steps = {n})",
                           f"the LR decay ended at step {decay} of {n}: the run trained at train.min_lr = "
                           f"{g(min_lr)} since", "--set train.decay_steps=null (decay until train.max_steps)",
                           strong=n - decay > 0.5 * n, key="train.decay_steps",
                           reference=recipes.cite("min_lr_share", scale=lambda v: f"{100 * v:.2g}% of the peak") +
                           " at the end of the run"))
    if n and kind != "constant" and decay and decay > DECAY_LATE * n:
        from ms_llm.train.lr_schedule import lr_at  # (an arrow into train the lead is removing)

        end = lr_at(n - 1, tc)
        out.append(Suspect("decay_late", UNSTABLE, f"train.decay_steps = {decay} is {decay / n:.1f}x "
                           f"train.max_steps = {n}: the run ends with the LR at {g(end)} ({100 * end / lr:.0f}% of "
                           f"its peak), before the decay anneals it", f"the LR decay ends long after the run (step "
                           f"{decay} of {n}): the LR stays high to the end", "--set train.decay_steps=null",
                           strong=end > 0.5 * lr, key="train.decay_steps", reference=recipes.CHINCHILLA))
    if min_lr > lr:
        out.append(Suspect("min_lr", UNSTABLE, f"train.min_lr = {g(min_lr)} is above train.lr = {g(lr)}: the "
                           f"'decay' raises the LR", f"train.min_lr = {g(min_lr)} above train.lr = {g(lr)}: the "
                           f"schedule raises the LR over the run", f"--set train.min_lr={g(lr / 10)}", strong=True,
                           key="train.min_lr", reference=recipes.cite("min_lr_share", scale=lambda v: f"{g(v)}x")))
    wd, std = tc.weight_decay, run.section("model").init_std
    if wd > WD_MAX:
        # AdamW moves a weight by about lr per step; decay takes lr x wd x |w| from it. At wd x |w| near 1 the decay
        # cancels what the gradients add (|w| ~ init_std early in training).
        ratio = wd * std
        out.append(Suspect("weight_decay", SLOW, f"train.weight_decay = {g(wd)} (every recipe: 0.1 or less): each step "
                           f"takes lr x wd = {g(lr * wd)} of every weight (half-life "
                           f"{math.log(2) / max(lr * wd, 1e-12):,.0f} steps at the peak LR); for a weight of the "
                           f"init size {g(std)} that is {ratio:.2g} of an "
                           f"Adam step (about lr)", f"weight decay pulls the weights to zero about as fast as the "
                           f"gradients move them (train.weight_decay = {g(wd)}: wd x init_std = {ratio:.2g})",
                           "--set train.weight_decay=0.1", strong=ratio >= WD_STEP_SHARE, key="train.weight_decay",
                           reference=recipes.cite("weight_decay")))
    b1, b2 = tc.beta1, tc.beta2
    if b2 < BETA2_RANGE[0] or b2 <= b1:
        out.append(Suspect("beta2", UNSTABLE, f"train.beta2 = {g(b2)} (beta1 = {g(b1)}): Adam's second moment "
                           f"averages only ~{1 / max(1 - b2, 1e-9):.0f} steps, so the step size jumps with each "
                           f"gradient; the recipes use 0.95-0.99", f"Adam's beta2 = {g(b2)} is too small: noisy step "
                           f"sizes", "--set train.beta2=0.95", strong=b2 < 0.8 or b2 <= b1, key="train.beta2",
                           reference=recipes.cite("beta2")))
    elif b2 > BETA2_RANGE[1]:
        out.append(Suspect("beta2", UNSTABLE, f"train.beta2 = {g(b2)}: Adam's second moment averages "
                           f"~{1 / (1 - b2):,.0f} steps, so it lags behind growing gradients (steps too large when "
                           f"they grow); the recipes use 0.95-0.99", f"Adam's beta2 = {g(b2)} adapts too slowly",
                           "--set train.beta2=0.95", strong=b2 > 0.99999, key="train.beta2",
                           reference=recipes.cite("beta2")))
    eps, rms = tc.eps, grad_rms(run)
    if eps > EPS_MAX and (rms is None or eps > EPS_RMS_SHARE * rms):
        factor = rms / (rms + eps) if rms else None
        out.append(Suspect("eps", SLOW, f"train.eps = {g(eps)} (the recipes use 1e-8 to 1e-5)"
                           + (f"; the RMS gradient per parameter is about {rms:.2g} (median grad norm / "
                              f"sqrt(parameters)), so Adam's steps are about {factor:.2g}x their size"
                              if factor else ""),
                           f"Adam's eps = {g(eps)} dominates sqrt(v): the updates shrink"
                           + (f" to about {factor:.2g}x" if factor else ""), "--set train.eps=1e-8",
                           strong=factor is not None and factor < 0.5, key="train.eps", reference=recipes.cite("eps")))
    tokens = (run.cfg("train.global_batch_size") or 0) * (run.cfg("model.seq_length") or 0)
    if 0 < tokens < MIN_BATCH_TOKENS:
        out.append(Suspect("batch", UNSTABLE, f"global batch {run.cfg('train.global_batch_size')} x seq_length "
                           f"{run.cfg('model.seq_length')} = {tokens} tokens per step: gradient noise dominates "
                           f"each update", f"a global batch of {tokens} tokens per step: gradient noise dominates",
                           f"--set train.global_batch_size={4 * run.cfg('train.global_batch_size')} (and the LR "
                           f"by up to 2x)", strong=tokens < MIN_BATCH_TOKENS // 2, key="train.global_batch_size",
                           reference=recipes.cite("batch_tokens")))
    for s in out:  # a slowing setting also shows where no progress rule fires: validation at the context-free level
        if s.effect == SLOW and s.shown_by is None:
            s.shown_by = settings.context_free
    out += settings.suspects(run)
    return out + published.suspects(run, covered={s.key for s in out})


def setting_line(s):
    """The suspect's evidence line, with where its reference comes from."""
    return s.setting + (f" [reference: {s.reference}]" if s.reference and s.reference not in s.setting else "")


def causes_for(run, effect):
    """(cause sentences with confidence, actions, evidence lines) of the suspects with this effect: for the symptom
    rules. The LR is left out: those rules weigh it themselves (and cite the recipes, settings.lr_judgement)."""
    out = [s for s in suspects(run) if effect in s.effects and s.id not in LR_KEYS]
    out.sort(key=lambda s: not s.strong)
    return ([cause(s.cause, "high" if s.strong else "medium") for s in out], [s.action for s in out],
            [setting_line(s) for s in out])


@rule(finds=('config_*',), reads=SHOWN_IDS, live=CHEAP)
def rule_schedule(run, found, _):
    """Run after the curve rules: each suspect is a finding when the run shows its effect (a curve finding, or its
    own evidence), and then the first cause of the findings it explains when its numbers are strong; otherwise a
    note saying the setting did nothing visible. Where two suspects show the same effect, each names the other and
    the experiment that separates them."""
    judged = []
    for s in suspects(run):
        findings = shown(s, found)
        own = s.shown_by(run) if s.shown_by else None
        judged.append((s, findings, own))
    judged.sort(key=lambda j: (not (j[1] or j[2]), not j[0].strong))  # shown first, then the strong ones
    out = []
    for s, findings, own in judged:
        if not findings and not own:
            out.append(Finding(f"config_{s.id}", "info", f"config note: {s.setting}",
                               [setting_line(s), f"the run shows no {' or '.join(s.effects)} effect: the setting "
                                                 f"did nothing visible (so far)"],
                               [cause(s.cause, "low")], [s.action] + s.experiment))
            continue
        measured = [f for f in findings if f.id in MEASURED]
        ev = [setting_line(s)] + ([own] if own else [])
        ev += [(f.symptom if f in measured else f"the curve shows the effect: {f.symptom}") + f" ({f.id})"
               for f in findings[:3]]
        causes = [cause(("measured: " if measured else "") + s.cause, "high" if s.strong or measured else "medium")]
        actions = [s.action]
        peers = [p for p, pf, po in judged if p is not s and (pf or po) and set(p.effects) & set(s.effects)]
        for p in peers:
            causes.append(cause(f"besides: {p.cause}", "medium" if p.strong else "low"))
        actions += s.experiment if (peers or s.experiment) and not measured else []
        steps = findings[0].steps if findings else [run.steps_done]
        f = Finding(f"config_{s.id}", "warning", f"config: {s.cause}", ev, causes, actions, steps)
        if s.strong or measured:
            # the suspect leads the findings it explains (not a resume's change: its cause is the key's change)
            f.explains = [Explains(t.id, cause(s.cause, "high"), s.action, setting_line(s), key=s.key)
                          for t in findings if t.id not in MEASURED and not t.id.startswith("resume_change")]
        out.append(f)
    return out
