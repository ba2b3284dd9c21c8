"""Preference optimisation (`ms-llm diagnose`): what goes wrong when a model is trained on chosen/rejected pairs
(DPO, IPO, SimPO: docs/preference.md). The evidence is the log records' metrics under TRL's names (rewards/chosen,
rewards/rejected, rewards/accuracies, rewards/margins, logps/chosen, logps/rejected; ms_llm/train/losses/preference.py
or a TRL run's), the evaluations' val_ versions, the config (finetune.preference, train.lr, model.dropout,
precision.compute_dtype, finetune.lora) and the dataset's pair statistics in run_info.json.

  likelihood_displacement  the chosen responses' log-prob falls while the margin rises: the model wins the pairs by
                           pushing the rejected ones down faster than the chosen ones, and makes the chosen ones less
                           likely too (Razin et al. 2024; Pal et al. 2024, "Smaug")
  pairs_too_easy           the reward accuracy reaches 1.0 within a few steps: the pairs are separable by something
                           simple (length, a truncated or empty rejected response), or the reference is not the
                           policy's start (its rewards were not 0 at step 1)
  margins_flat             the reward margin does not grow over many steps: beta too small (the policy moves, its
                           rewards stay small) or the learning rate too low (the policy does not move)
  reference_mismatch       the rewards at step 1 are not ~0: the reference is not the policy's starting point (the
                           reference and the policy compute differently: dropout, another dtype, other weights)

Only a cause the evidence supports is named; where two fit, both are, with the cheapest experiment that separates
them. Thresholds are module constants, chosen so that a healthy run (margins rising from 0, accuracies climbing over
tens of steps, chosen log-prob flat or rising) produces no finding.
"""
import statistics

from ms_llm.diagnose.common import Finding, cause, g, points
from ms_llm.diagnose.registry import EVAL, rule

WINDOW = 3                 # medians over this many log records at the start and the end
MIN_RECORDS = 6            # a shape rule needs at least this many records with the metrics
DISPLACE_DROP_ABS = 1.0    # logps/chosen falls by max(1 nat, 5% of its start) ...
DISPLACE_DROP_REL = 0.05
DISPLACE_MARGIN = 0.1      # ... while the margin rises by at least this (reward units, β · log-ratio)
EASY_ACC = 0.99            # accuracy at or above this ...
EASY_STEP = 10             # ... at a record by this step
EASY_KEEP = 0.95           # and staying at or above this afterwards
LENGTH_RATIO = 1.5         # mean chosen / rejected response length beyond 1.5x (or below 1/1.5): separable by length
FLAT_MIN_STEPS = 50        # margins flat: over at least 50 steps ...
FLAT_MARGIN = 0.05         # ... the margin's median stays below 0.05 reward units at the end
FLAT_LOGRATIO = 0.5        # the policy moved if the margin of log-ratios (margins / β) exceeds 0.5 nats
REF_TOL_ABS, REF_TOL_REL = 1e-4, 1e-5   # step 1's rewards within max(1e-4, 1e-5 · |logps|) of 0


def preference_run(run):
    return bool(points(run.train, "rewards/margins"))


def settings(run):
    """finetune.preference, the schema's defaults when the section is null (DPO at beta 0.1, as training runs it)."""
    from ms_llm.config.schema import PreferenceConfig

    return run.cfg("finetune.preference") or PreferenceConfig()


def objective(run):
    return settings(run).loss


def beta(run):
    return float(settings(run).beta)


def pair_stats(run):
    ds = (run.info.get("dataset") or {}) if isinstance(run.info, dict) else {}
    return (ds.get("preference") or {}).get("train") or {}


def ends(pts):
    """(median of the first WINDOW values, median of the last WINDOW values)."""
    vals = [v for _, v in pts]
    return statistics.median(vals[:WINDOW]), statistics.median(vals[-WINDOW:])


def start_ratio(run, which="chosen"):
    """log π(y) − log π_start(y) of the `which` responses at the end of a run whose reference is its starting point
    (DPO, IPO): the median of the last records' rewards/<which> / β, in nats; None without a reference (SimPO) or
    those records."""
    rewards = points(run.train, f"rewards/{which}")
    if objective(run) not in ("dpo", "ipo") or len(rewards) < MIN_RECORDS or beta(run) <= 0:
        return None
    return statistics.median(v for _, v in rewards[-WINDOW:]) / beta(run)


def rule_displacement(run, found, _):
    chosen, margins = points(run.train, "logps/chosen"), points(run.train, "rewards/margins")
    if len(chosen) < MIN_RECORDS or len(margins) < MIN_RECORDS:
        return None
    c0, c1 = ends(chosen)
    m0, m1 = ends(margins)
    drop = c0 - c1
    ev = [f"logps/chosen (the chosen responses' log-prob under the policy) {g(c0)} → {g(c1)} (steps "
          f"{chosen[0][0]} → {chosen[-1][0]}), while rewards/margins rose {g(m0)} → {g(m1)}"]
    ratio = start_ratio(run)
    from_start = ratio is not None and -ratio > drop
    if from_start:
        # a fall within the first log interval is before the first window of logged log-probs; the rewards measure
        # it from the start itself (the reference is the policy's start)
        c0, drop, m0 = c1 - ratio, -ratio, min(m0, 0.0)
        ev = [f"rewards/chosen / β = {g(ratio)} nats at the end (median of the last {WINDOW} records): the chosen "
              f"responses' log-prob is {g(-ratio)} below the policy's start (the reference), {g(c0)} → {g(c1)}; "
              f"rewards/margins rose from 0 to {g(m1)}"]
    if not (drop > max(DISPLACE_DROP_ABS, DISPLACE_DROP_REL * abs(c0)) and m1 - m0 > DISPLACE_MARGIN):
        return None
    rejected = points(run.train, "logps/rejected")
    both = False
    if len(rejected) >= MIN_RECORDS:
        r0, r1 = ends(rejected)
        fell = start_ratio(run, "rejected") if from_start else None
        r0 = r1 - fell if fell is not None else r0  # measured from the start, as the chosen ones are
        both = r0 - r1 > drop
        ev.append(f"logps/rejected {g(r0)} → {g(r1)}: " + ("it fell faster, so the margin grows by pushing both "
                                                          "down" if both else "it fell less than the chosen one"))
    val = points(run.evals, "val_logps/chosen")
    if len(val) >= 2:
        ev.append(f"validation logps/chosen {g(val[0][1])} → {g(val[-1][1])}"
                  + (" (falling there too: the held-out chosen responses are made less likely)"
                     if val[-1][1] < val[0][1] else ""))
    lr = run.cfg("train.lr")
    causes = [cause("likelihood displacement: the objective constrains only the margin between the two responses, "
                    "and when the chosen and rejected responses are alike (shared tokens, similar wording) their "
                    "gradients largely cancel, so winning the pair lowers the chosen response's probability too "
                    "(Razin et al. 2024)", "high" if both else "medium"),
              cause(f"steps too large for the objective: train.lr = {g(lr)} moves the policy far from the reference "
                    f"within the run, where the margin keeps rising by pushing probability mass off both responses",
                    "medium")]
    actions = [f"cheapest experiment that separates the two: the same run for {chosen[-1][0]} steps at train.lr = "
               f"{g(lr / 4) if lr else 'lr / 4'}: if logps/chosen still falls while the margins rise, it is the pairs "
               f"(displacement), not the step size",
               f"a larger beta (--set finetune.preference.beta={g(beta(run) * 4)}) keeps the policy closer to the "
               f"reference",
               "pairs whose chosen and rejected responses differ more (or fewer near-identical pairs); watch "
               "val_logps/chosen, which is what generation will see"]
    return [Finding("likelihood_displacement", "warning", f"the chosen responses become less likely "
                    f"(logps/chosen {g(c0)} → {g(c1)}) while the reward margin rises", ev, causes, actions,
                    [chosen[0][0], chosen[-1][0]])]


def rule_too_easy(run, found, _):
    acc = points(run.train, "rewards/accuracies")
    if len(acc) < 2:
        return None
    early = [(s, v) for s, v in acc if s <= EASY_STEP and v >= EASY_ACC]
    if not early:
        return None
    after = [v for s, v in acc if s >= early[0][0]]
    if min(after) < EASY_KEEP:
        return None
    ev = [f"rewards/accuracies reached {g(early[0][1])} at step {early[0][0]} and stayed at or above "
          f"{g(min(after))} for the {len(after)} log record(s) after"]
    causes, actions = [], []
    mismatch = "reference_mismatch" in found
    if mismatch:
        ev.append("the rewards were not 0 at step 1 (finding reference_mismatch): the reference is not the "
                  "policy's start, so the pairs are 'won' before any training")
        causes.append(cause("the reference leaks: it is not the policy's starting point, and the pairs are won "
                            "by the difference between the two models", "high"))
    st = pair_stats(run)
    lc, lr_ = st.get("mean_chosen_length"), st.get("mean_rejected_length")
    lengthy = bool(lc and lr_ and max(lc / lr_, lr_ / lc) >= LENGTH_RATIO)
    if lc and lr_:
        ev.append(f"the dataset's mean sequence lengths: chosen {g(lc)}, rejected {g(lr_)} tokens (prompt included)")
    if lengthy:
        causes.append(cause("the pairs are separable by length: the chosen responses are systematically "
                            f"{'longer' if lc > lr_ else 'shorter'} than the rejected ones, which a summed "
                            "log-prob tells apart at once", "high" if not mismatch else "medium"))
    val = points(run.evals, "val_rewards/accuracies")
    if val:
        ev.append(f"validation rewards/accuracies {g(val[-1][1])} at step {val[-1][0]}")
    if not lengthy and not mismatch:
        causes.append(cause("the pairs are too easy for the model: the rejected responses are unlike the chosen ones "
                            "in something simple (off-topic, truncated, another style or language)", "medium"))
        causes.append(cause("the reference leaks into the pairs: the chosen responses were generated by, or "
                            "fine-tuned into, the reference model itself", "medium"))
        actions.append("cheapest experiment that separates the two: score the pairs under another model of the same "
                       "family (its logps/chosen vs logps/rejected per token): pairs easy for any model are easy "
                       "pairs; pairs easy only for this reference point at it")
    actions += ["look at a few pairs: ms-llm data info DATASET --show-sample 0 (chosen = ⟨1⟩, rejected = ⟨2⟩)",
                "harder pairs (rejected responses close to the chosen ones), or fewer steps: an accuracy of 1.0 "
                "teaches nothing more, and the margins then grow by displacement"]
    return [Finding("pairs_too_easy", "warning", f"the reward accuracy reaches 1.0 within {early[0][0]} step(s)",
                    ev, causes, actions, [early[0][0]])]


def rule_margins_flat(run, found, _):
    margins = points(run.train, "rewards/margins")
    if len(margins) < MIN_RECORDS or margins[-1][0] - margins[0][0] < FLAT_MIN_STEPS:
        return None
    m0, m1 = ends(margins)
    if abs(m1) >= FLAT_MARGIN or m1 - m0 >= FLAT_MARGIN:
        return None
    b = beta(run)
    obj = objective(run)
    ev = [f"rewards/margins {g(m0)} → {g(m1)} over steps {margins[0][0]} → {margins[-1][0]} (below "
          f"{FLAT_MARGIN} at the end)"]
    acc = points(run.train, "rewards/accuracies")
    if acc:
        ev.append(f"rewards/accuracies {g(acc[-1][1])} at step {acc[-1][0]}")
    lr = run.cfg("train.lr")
    causes, actions = [], []
    if obj == "simpo":
        moved = None  # SimPO's reward is β · per-token log-prob: no log-ratio to read
    else:
        logratio = m1 / b
        moved = abs(logratio) > FLAT_LOGRATIO
        ev.append(f"the margin of log-ratios to the reference (margins / β, β = {g(b)}) is {g(logratio)} nats: the "
                  + ("policy moved away from the reference" if moved else "policy barely moved from the reference"))
    if moved:
        causes.append(cause(f"beta too small: β = {g(b)} scales the policy's real movement ({g(m1 / b)} nats) down to "
                            f"rewards near 0", "high"))
        actions.append(f"--set finetune.preference.beta={g(b * 10)} (DPO's usual 0.1; the margins then read the "
                       f"same movement ten times larger)")
    elif moved is False:
        causes.append(cause(f"the learning rate is too low: the policy barely moves at train.lr = {g(lr)}"
                            + (" with LoRA" if run.cfg("finetune.lora") is not None else ""), "high"))
        actions.append(f"--set train.lr={g(lr * 10) if lr else '10x'} (or `ms-llm debug lr-find` on the config)")
    else:
        causes.append(cause(f"the learning rate is too low (train.lr = {g(lr)})", "medium"))
        causes.append(cause(f"beta too small (β = {g(b)}): SimPO's reward is β times the per-token log-prob",
                            "medium"))
        actions.append(f"cheapest experiment that separates the two: the same run for {FLAT_MIN_STEPS} steps at "
                       f"train.lr ×10; margins rising then = the learning rate, flat still = β "
                       f"(--set finetune.preference.beta={g(b * 4)})")
    return [Finding("margins_flat", "warning", f"the reward margin stays flat ({g(m0)} → {g(m1)}) over "
                    f"{margins[-1][0] - margins[0][0]} steps", ev, causes, actions,
                    [margins[0][0], margins[-1][0]])]


def rule_reference_mismatch(run, found, _):
    if objective(run) == "simpo":
        return None  # no reference: its rewards are β · log-probs, never 0
    first = next((r for r in run.train if "rewards/chosen" in r), None)
    if first is None or first.get("step") != 1:
        return None  # the first record averages several steps (or the run resumed): the rewards have moved
    rc, rr = first.get("rewards/chosen"), first.get("rewards/rejected")
    lc = abs(first.get("logps/chosen") or 0.0)
    tol = max(REF_TOL_ABS, REF_TOL_REL * lc * beta(run))
    if rc is None or rr is None or (abs(rc) <= tol and abs(rr) <= tol):
        return None
    ev = [f"at step 1, before any update, rewards/chosen = {g(rc)} and rewards/rejected = {g(rr)} (β · log-ratio to "
          f"the reference; 0 when the reference is the policy's start, here above {g(tol)})"]
    causes = []
    dropout = run.cfg("model.dropout") or 0.0
    dtype = run.cfg("precision.compute_dtype")
    if dropout > 0:
        ev.append(f"model.dropout = {g(dropout)}: the training forward drops activations, the reference pass "
                  f"(evaluation mode) does not")
        causes.append(cause("dropout: the policy's log-probs are computed with dropout, the reference's without, so "
                            "they differ at the same weights", "high"))
    if dtype != "float32":
        ev.append(f"precision.compute_dtype = {dtype}")
        causes.append(cause(f"{dtype} compute: the reference pass and the training step round differently; expect "
                            f"rewards of the order of β × the rounding of a summed log-prob", "medium" if dropout <= 0
                            else "low"))
    causes.append(cause("the reference's weights are not the ones the run starts from (another checkpoint than "
                        "checkpoint.load_weights, adapters not at zero, or a TRL run whose ref_model is another "
                        "model)", "high" if not causes else "low"))
    actions = (["--set model.dropout=0.0 for preference training (TRL disables dropout for the same reason)"]
               if dropout > 0 else [])
    actions.append("check that the reference is the starting checkpoint: delete DATASET/reference_logps/ to compute "
                   "the reference again from the run's own starting weights")
    return [Finding("reference_mismatch", "warning", "the rewards at step 1 are not 0: the reference is not the "
                    "policy's starting point", ev, causes, actions, [1])]


@rule(finds=('likelihood_displacement', 'pairs_too_easy', 'margins_flat', 'reference_mismatch'), live=EVAL)
def rule_preference(run, found, limit):
    """The four rules above, on a run that logs preference metrics; reference_mismatch first (pairs_too_easy reads
    it)."""
    if not preference_run(run):
        return []
    out = []
    for judge in (rule_reference_mismatch, rule_displacement, rule_too_easy, rule_margins_flat):
        new = judge(run, found, limit) or []
        for f in new:
            found[f.id] = f
        out += new
    return out
