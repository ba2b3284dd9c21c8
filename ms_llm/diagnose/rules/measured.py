"""Throughput left on the table (`ms-llm diagnose`): the run's step measured under other settings of the same
computation (`ms-llm diagnose RUN --measure`, ../measure.py, RUN/measure.json). A setting that runs the step
faster than the run's own settings by more than the noise of two measurements of those (and MARGIN) is named,
with the tokens/s of every setting measured. Measurements taken while other processes kept the CPU busy say so, and
the margin is raised (SHARED_MARGIN) beside the measured noise."""
from ms_llm.diagnose.common import Finding, cause, finite, quoted
from ms_llm.diagnose.measure import MEASURE_FILE, by_setting, faster_than, load_measure
from ms_llm.diagnose.rules.device import OTHER_CORES
from ms_llm.diagnose.evidence import median_speed
from ms_llm.diagnose.registry import EVAL, rule

SHARED_MARGIN = 0.2  # with other processes busy during the measurements, a setting must beat the run's by 20%
HOST_DEPENDENT = ("context.num_threads",)  # settings whose best value depends on what else runs on the host


def combined(row):
    """A measurement of every faster setting at once (measure.py's "together" round)."""
    return row["name"].startswith("together: ")


@rule(finds=('throughput_measured', 'throughput_left'), live=EVAL)
def rule_measured(run, found, _):
    doc = load_measure(run)
    if not doc:
        return None
    rows = doc.get("results") or []
    settings = by_setting(rows)
    if not any(not row["sets"] for row, _ in settings.values()):
        return None
    busy = [r for r in rows if finite(r.get("other_cores")) and r["other_cores"] >= OTHER_CORES]
    base, need, faster = faster_than(rows, SHARED_MARGIN if busy else 0.0)
    own = next(rounds for row, rounds in settings.values() if not row["sets"])
    logged = median_speed(run)
    ev = [f"{MEASURE_FILE}: {len(rows)} benchmarks ({len(settings)} settings x {doc.get('rounds', 1)} rounds) of "
          f"{doc.get('steps')} steps in {doc.get('duration_s')} s, each at its 10th-percentile step; the run's "
          f"settings " + ", ".join(f"{v:,.0f}" for _, v in sorted(own.items())) + " tokens/s by round; a setting "
          f"counts as faster when it beats them by {100 * need:.0f}% in every round"]
    if logged:
        ev.append(f"the run itself logged a median {logged:,.0f} tokens/s (its steps alone)")
    for row, rounds in settings.values():
        if row["sets"]:
            ratios = [v / own[k] for k, v in sorted(rounds.items()) if k in own]
            ev.append(f"{row['name']} ({row['what']}): " + ", ".join(f"{v:,.0f}" for _, v in sorted(rounds.items()))
                      + " tokens/s by round = " + ", ".join(f"{x:.2f}x" for x in ratios) + " the run's")
    ev += [f"{r['name']} (round {r.get('round', 1)}): failed: {r.get('error')}" for r in rows
           if not finite(r.get("tokens_per_s"))]
    again = f"ms-llm diagnose {quoted(run.path)} --measure (again, after the change)"
    if busy:
        ev.append(f"other processes kept up to {max(r['other_cores'] for r in busy):.1f} cores busy during "
                  f"{len(busy)} of {len(rows)} measurements: the margin a setting must clear was raised to "
                  f"{100 * need:.0f}%")
    tried = sum(1 for row, _ in settings.values() if row["sets"])
    if not faster:
        return [Finding("throughput_measured", "info", f"note: measured {tried} other setting(s) of the same "
                        f"computation; none runs the step faster than the run's own in every round", ev,
                        [cause("the run's speed settings are the fastest of those measured here", "medium")],
                        [again])]
    # fewer threads win on a host whose cores other processes hold: that is the host's state, not the run's setting
    hosted = [x for x in faster if busy and any(s.startswith(HOST_DEPENDENT) for s in x[0]["sets"])]
    own_win = [x for x in faster if x not in hosted]
    best, factor, _ = (own_win or hosted)[0]
    # the causes are settings: each single setting by its own factor, the best of them first; the combined run
    # (every faster setting at once) is evidence that their gains add, after them, even when it is the fastest
    singles = [x for x in own_win if not combined(x[0])]
    first = singles[0][0] if singles else best
    ranked = singles + [x for x in own_win if combined(x[0])] + hosted
    causes = [cause(f"{r['what']}: {f:.2f}x the tokens/s of the run's settings (every round), same global batch and "
                    f"computation" + (": faster only while other processes hold cores (fewer threads contend less "
                                      "with them)" if (r, f, x) in hosted else ""),
                    "high" if r is first and (r, f, x) not in hosted else "medium" if (r, f, x) not in hosted
                    else "low") for r, f, x in ranked]
    actions = [" ".join(f"--set {s}" for s in best["sets"]) + f" ({best['name']})", again]
    symptom = (f"throughput left on the table: {best['name']} runs the step {factor:.2f}x as fast as the run's "
               f"settings (measured: {best['tokens_per_s']:,.0f} vs {base:,.0f} tokens/s at best)")
    if not own_win:
        ev.append("the only faster settings are thread counts, measured while other processes held the host's cores: "
                  "a note; measure again on an idle host before changing them")
        return [Finding("throughput_left", "info", "note: " + symptom + " on a host shared with other processes", ev,
                        causes, actions)]
    return [Finding("throughput_left", "warning", symptom, ev, causes, actions)]
