"""Router health of a mixture-of-experts run (`ms-llm diagnose`), from the per-layer fields the trainer logs each
interval (ms_llm.train.loop.router_stats: moe/<layer>/share, lb_loss, dropped_frac; aux_loss):

- router collapse: one expert's share of the tokens far above the fair 1/E for a sustained window, and not
  falling (`moe_router_collapse`);
- dead experts: experts that got no token for a sustained window (`moe_dead_experts`);
- heavy token dropping at the capacity limit (`moe_tokens_dropped`);
- the aux loss coefficient too small: the load is uneven while the aux loss adds almost nothing to the loss
  (`moe_aux_too_small`);
- the aux loss coefficient too large: the aux loss is a large part of the loss, the load already balanced, and its
  gradient crowds out the LM's (`moe_aux_too_large`).

"Sustained" is the last WINDOW_SHARE of the log records and at least MIN_WINDOW of them, so a run that recovers, or
a healthy run's passing imbalance, raises nothing. A layer's collapse reports its dead experts with it; the separate
dead-expert finding is for layers that did not collapse. The thresholds, with the reason for each value, are in
docs/debugging.md and docs/moe.md.
"""
import statistics

from ms_llm.diagnose.common import Finding, cause, finite, g
from ms_llm.diagnose.registry import CHEAP, rule

MIN_WINDOW, WINDOW_SHARE = 5, 0.25   # sustained: the last max(5, 25%) of the log records
COLLAPSE_WAY = 0.6      # collapsed: the top share is 60% of the way from the fair 1/E to the most one expert can
                        # take, 1/top_k (E=8, k=2: 35%; a healthy run's passing peaks reach 31%, its windows <= 25%;
                        # an uneven router without a balancing loss stays near 30%, the aux-too-small case)
NOT_FALLING = 0.02      # ... and it did not fall by more than 2 points of share over the window
IMBALANCE = 2.0         # uneven: the window's median top share at least 2x the fair share (healthy runs here: <= 1.7x)
NEGLIGIBLE_AUX = 1e-3   # the aux loss below 0.1% of the LM loss: it cannot pull the router
DOMINANT_AUX = 0.25     # the aux loss at least 25% of the LM loss (a healthy coefficient of 0.01 gives ~0.3%)
BALANCED_LB = 1.1       # load-balancing loss at most this: already balanced (1.0 is perfect)
HEAVY_DROP = 0.10       # more than 10% of the (token, expert) assignments dropped at capacity
SWITCH_COEF = 0.01      # the Switch Transformer's coefficient, a safe default


def layers(run):
    """MoE layer indices with router fields in the log, in order."""
    found = set()
    for r in run.train:
        for key in r:
            if key.startswith("moe/") and key.endswith("/share"):
                found.add(int(key.split("/")[1]))
    return sorted(found)


def window(run, layer):
    """The sustained window of one layer: [(step, record)] of the last max(MIN_WINDOW, WINDOW_SHARE) records with
    its router fields, or [] when the run logged too few."""
    recs = [(r["step"], r) for r in run.train if isinstance(r.get(f"moe/{layer}/share"), list)]
    n = max(MIN_WINDOW, int(len(recs) * WINDOW_SHARE + 0.999))
    return recs[-n:] if len(recs) >= n else []


def experts_config(run):
    e, k = run.cfg("model.moe.num_experts"), run.cfg("model.moe.top_k")
    return (e, k) if isinstance(e, int) and isinstance(k, int) and e > 1 else (None, None)


def aux_share(run, recs):
    """Median over the window of aux_loss / LM loss, or None."""
    ratios = [r["aux_loss"] / r["loss"] for _, r in recs if finite(r.get("aux_loss")) and finite(r.get("loss"))
              and r["loss"] > 0]
    return statistics.median(ratios) if ratios else None


@rule(finds=('moe_*',), reads=('loss_nonfinite',), live=CHEAP)
def rule_moe(run, found, _):
    e, k = experts_config(run)
    if e is None or not layers(run) or "loss_nonfinite" in found:
        return None
    out = []
    fair = 1.0 / e
    line = fair + COLLAPSE_WAY * (1.0 / k - fair)
    collapsed, uneven, dead_only, dropping, windows = [], [], [], [], {}
    for layer in layers(run):
        recs = window(run, layer)
        if not recs:
            continue
        windows[layer] = recs
        shares = [r[f"moe/{layer}/share"] for _, r in recs]
        tops = [max(s) for s in shares]
        busiest = max(range(e), key=lambda j: statistics.median(s[j] for s in shares))
        dead = [j for j in range(e) if all(s[j] == 0 for s in shares)]
        if min(tops) >= line and tops[-1] >= tops[0] - NOT_FALLING:
            collapsed.append((layer, busiest, tops, dead))
        elif dead:
            dead_only.append((layer, dead))
        if statistics.median(tops) >= IMBALANCE * fair:
            uneven.append((layer, statistics.median(tops)))
        drops = [r.get(f"moe/{layer}/dropped_frac") for _, r in recs]
        drops = [d for d in drops if finite(d)]
        if drops and statistics.median(drops) > HEAVY_DROP:
            dropping.append((layer, statistics.median(drops), statistics.median(tops)))
    if not windows:
        return None
    any_recs = next(iter(windows.values()))
    share = aux_share(run, any_recs)
    coef, zcoef = run.cfg("model.moe.aux_loss_coef"), run.cfg("model.moe.z_loss_coef")
    span = f"steps {any_recs[0][0]}-{any_recs[-1][0]} ({len(any_recs)} log records)"
    weak = share is not None and share < NEGLIGIBLE_AUX
    aux_txt = (f"aux_loss is {100 * share:.2g}% of the LM loss over {span} (model.moe.aux_loss_coef = {g(coef)}, "
               f"z_loss_coef = {g(zcoef)})" if share is not None else f"model.moe.aux_loss_coef = {g(coef)}")
    if collapsed:
        out.append(collapse_finding(run, e, k, fair, line, collapsed, span, weak, aux_txt, coef, zcoef))
    if dead_only:
        out.append(dead_finding(run, e, dead_only, span, weak, aux_txt, coef, zcoef))
    if uneven and weak and not collapsed and not dead_only:
        out.append(aux_small_finding(run, e, fair, uneven, span, aux_txt, coef))
    if dropping:
        out.append(drop_finding(run, e, k, fair, dropping, span))
    large = aux_large_finding(run, windows, share, coef, span)
    if large:
        out.append(large)
    return out or None


def uneven_from_the_start(run, layer, fair):
    """Whether the layer's first log record is already uneven (busiest expert >= IMBALANCE x fair, or an expert at
    zero): then the imbalance comes from the start (the init), not from training drifting into it."""
    first = next((r for r in run.train if isinstance(r.get(f"moe/{layer}/share"), list)), None)
    if first is None:
        return False
    share = first[f"moe/{layer}/share"]
    return max(share) >= IMBALANCE * fair or min(share) == 0


def coef_action(coef):
    return (f"--set model.moe.aux_loss_coef={SWITCH_COEF:g} (now {g(coef)}; the Switch Transformer's value)"
            if coef < SWITCH_COEF else f"--set model.moe.aux_loss_coef={3 * coef:.2g} (3x the current {g(coef)})")


def router_init_cause(run):
    """(cause text, confidence) when the router was initialised much wider than the rest of the model, else None."""
    std, base = run.cfg("model.moe.router_init_std"), run.cfg("model.init_std")
    if std == 0:
        return ("the router starts at zero (model.moe.router_init_std = 0): every expert ties for every token, so "
                "the first steps' tie-breaks and gradients decide which experts get the tokens, and nothing moves "
                "the others back in")
    if finite(std) and std > 5 * base:
        return (f"the router is initialised {std / base:.0f}x wider than the rest of the model "
                f"(model.moe.router_init_std = {g(std)}, model.init_std = {g(base)}): its first decisions are nearly "
                f"one-hot and follow the token's identity, so frequent tokens pile onto a few experts from the first "
                f"steps")
    return None


def balance_causes(run, weak, aux_txt, coef, first_record_bad):
    """The causes shared by collapse and dead experts, most supported first."""
    init = router_init_cause(run)
    weak_cause = cause(f"the load-balancing loss is too weak to spread the tokens: {aux_txt}",
                       "high" if weak else "low")
    causes = []
    if init and first_record_bad:
        causes.append(cause(init + " (the imbalance is there from the first log record on)", "high"))
        causes.append(weak_cause)
    else:
        causes.append(weak_cause)
        if init:
            causes.append(cause(init, "medium"))
    if not weak:
        causes.append(cause("the router's learning rate is too high for it: rich-get-richer routing (the favoured "
                            "expert learns fastest and is favoured more) outruns the balancing loss", "medium"))
    return causes


def balance_actions(run, coef, zcoef):
    actions = [coef_action(coef)]
    if router_init_cause(run):
        actions.append(f"--set model.moe.router_init_std=null (now {g(run.cfg('model.moe.router_init_std'))}; the "
                       f"router initialised like the other weights)")
    if not zcoef:
        actions.append("--set model.moe.z_loss_coef=0.001 (ST-MoE's router z-loss keeps the router logits small, "
                       "so its decisions stay soft)")
    actions.append(f"a smaller learning rate slows the router too (ms_llm has one learning rate for all weights): "
                   f"--set train.lr={run.cfg('train.lr') / 3:.2g}" if run.cfg("train.lr") else
                   "a third of the peak learning rate")
    return actions


def collapse_finding(run, e, k, fair, line, collapsed, span, weak, aux_txt, coef, zcoef):
    ev = [f"fair share of each of the {e} experts: {100 * fair:.3g}% of a layer's tokens; with top_k = {k} one expert "
          f"can take at most {100 / k:.3g}%; collapse line {100 * line:.3g}%"]
    first_bad = False
    for layer, busiest, tops, dead in collapsed:
        ev.append(f"layer {layer}: the busiest expert takes {100 * min(tops):.3g}%-{100 * max(tops):.3g}% of the "
                  f"tokens in every record of {span}, {100 * tops[0]:.3g}% at its start and {100 * tops[-1]:.3g}% at "
                  f"its end (not falling); expert {busiest} is the busiest"
                  + (f"; experts {', '.join(map(str, dead))} got no token at all" if dead else ""))
        first_bad = first_bad or uneven_from_the_start(run, layer, fair)
    ev.append(aux_txt)
    names = ", ".join(str(layer) for layer, *_ in collapsed)
    return Finding("moe_router_collapse", "error",
                   f"router collapse in MoE layer(s) {names}: one expert takes most of the tokens and the balance "
                   f"is not improving", ev, balance_causes(run, weak, aux_txt, coef, first_bad),
                   balance_actions(run, coef, zcoef))


def dead_finding(run, e, dead_only, span, weak, aux_txt, coef, zcoef):
    ev = [f"layer {layer}: expert(s) {', '.join(map(str, dead))} of {e} received no token in any record of {span}"
          for layer, dead in dead_only]
    ev.append(aux_txt)
    n = sum(len(d) for _, d in dead_only)
    first_bad = any(uneven_from_the_start(run, layer, 1.0 / e) for layer, _ in dead_only)
    causes = balance_causes(run, weak, aux_txt, coef, first_bad)
    return Finding("moe_dead_experts", "warning", f"{n} dead expert(s): no tokens routed to them for the last {span}",
                   ev, causes, balance_actions(run, coef, zcoef))


def aux_small_finding(run, e, fair, uneven, span, aux_txt, coef):
    ev = [f"layer {layer}: the busiest expert's share, median over {span}: {100 * top:.3g}% = {top / fair:.1f}x the "
          f"fair {100 * fair:.3g}%" for layer, top in uneven]
    ev.append(aux_txt)
    what = "0: there is no load-balancing loss" if not coef else f"{g(coef)} is too small"
    causes = [cause(f"model.moe.aux_loss_coef = {what}: the load stays uneven and the aux loss adds less than "
                    f"{100 * NEGLIGIBLE_AUX:g}% to the loss, too little to move the router", "high")]
    init = router_init_cause(run)
    if init:
        causes.append(cause(init, "medium"))
    return Finding("moe_aux_too_small", "warning", "uneven expert load with a negligible load-balancing loss", ev,
                   causes, [coef_action(coef)] + (["--set model.moe.router_init_std=null"] if init else []))


def drop_finding(run, e, k, fair, dropping, span):
    cf = run.cfg("model.moe.capacity_factor")
    ev = [f"layer {layer}: median {100 * frac:.3g}% of the (token, expert) assignments dropped over {span}; its busiest "
          f"expert's median share {100 * top:.3g}% (fair {100 * fair:.3g}%)" for layer, frac, top in dropping]
    ev.append(f"model.moe.capacity_factor = {g(cf)}: each expert takes ceil({g(cf)} × tokens × {k} / {e}) tokens per "
              f"micro-batch; a dropped token skips that expert (only the residual carries it)")
    worst_top = max(top for *_, top in dropping)
    need = worst_top * e  # the busiest expert fits when capacity_factor >= its share × E
    need = -(-need * 4 // 1) / 4
    causes = []
    if finite(cf) and cf < 1:
        causes.append(cause(f"capacity_factor = {g(cf)} < 1: the experts together have fewer slots than there are "
                            f"assignments, so at least {100 * (1 - cf):.0f}% are dropped even under perfect balance",
                            "high"))
    elif worst_top >= IMBALANCE * fair:
        causes.append(cause(f"uneven routing: the busiest expert wants {worst_top / fair:.1f}x its fair share, beyond "
                            f"capacity_factor = {g(cf)}", "high"))
    else:
        causes.append(cause(f"capacity_factor = {g(cf)} leaves no headroom for the routing's normal fluctuation",
                            "medium"))
    actions = [f"--set model.moe.capacity_factor={need:g} (the busiest expert's median share × E: it then fits)",
               "--set model.moe.capacity_factor=null (dropless: no token dropped; costs padded compute on CPU, "
               "docs/moe.md)"]
    if worst_top >= IMBALANCE * fair:
        actions.append(coef_action(run.cfg("model.moe.aux_loss_coef")))
    return Finding("moe_tokens_dropped", "warning",
                   f"{100 * max(f for _, f, _ in dropping):.3g}% of tokens dropped at expert capacity", ev, causes,
                   actions)


def aux_large_finding(run, windows, share, coef, span):
    """The aux loss dominates the loss while the load is already balanced; the LM's share of the gradient shrinks
    (clipping at train.clip_grad scales the whole gradient, the aux part included)."""
    if share is None or share < DOMINANT_AUX:
        return None
    lbs = [r.get(f"moe/{layer}/lb_loss") for layer, recs in windows.items() for _, r in recs]
    lbs = [v for v in lbs if finite(v)]
    if not lbs or statistics.median(lbs) > BALANCED_LB:
        return None
    recs = next(iter(windows.values()))
    size = f"{share:.3g} times the LM loss" if share >= 1 else f"{100 * share:.3g}% of the LM loss"
    ev = [f"aux_loss is {size} over {span} (median; model.moe.aux_loss_coef = {g(coef)}); a coefficient of "
          f"{SWITCH_COEF:g} gives well under 1%",
          f"load-balancing loss median {statistics.median(lbs):.3f} (1.0 = perfectly balanced): the balance it buys "
          f"is already there"]
    clip = run.cfg("train.clip_grad")
    gn = [r["grad_norm"] for _, r in recs if finite(r.get("grad_norm"))]
    if clip and gn:
        ev.append(f"grad_norm median {g(statistics.median(gn))} against train.clip_grad = {g(clip)}: clipping scales "
                  f"the whole gradient, so the aux loss's part leaves the LM less of each step")
    pts = [(r["step"], r["loss"]) for r in run.train if finite(r.get("loss"))]
    if len(pts) >= 4:
        ev.append(f"LM loss {g(pts[0][1])} at step {pts[0][0]} → {g(pts[len(pts) // 2][1])} at step "
                  f"{pts[len(pts) // 2][0]} → {g(pts[-1][1])} at step {pts[-1][0]}")
    causes = [cause(f"model.moe.aux_loss_coef = {g(coef)} is too large: the load-balancing loss dominates the "
                    f"objective, and the language-model loss gets a shrinking part of each (clipped) update", "high")]
    return Finding("moe_aux_too_large", "warning", "the router's aux loss dominates the loss", ev, causes,
                   [f"--set model.moe.aux_loss_coef={SWITCH_COEF:g} (now {g(coef)})",
                    "compare: ms-llm compare-curves <this run> <the run with the smaller coefficient>"],
                   [recs[0][0], recs[-1][0]])
