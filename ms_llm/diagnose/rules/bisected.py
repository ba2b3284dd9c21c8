"""A cause proven by experiment (`ms-llm diagnose`): RUN/bisect.json, written by `ms-llm debug bisect` or by
`ms-llm diagnose RUN --measure` (a bisect between the run and the run with its suspect settings at their published
values). The keys the bisect found explain the metric's difference: a finding that names them, with both values and
the metric of every run, which shows their suspects (rules/published.py) as measured rather than likely. A bisect
that found nothing measurable says so: the suspects it tried did nothing at that length."""
import os

from ms_llm.diagnose.common import Finding, cause, finite
from ms_llm.rundir.names import BISECT
from ms_llm.diagnose.registry import EVAL, rule

FORMAT = "ms_llm.tune.bisect/1"  # the bisect's file format (ms_llm/tune/bisect.py writes it)
LOWER_IS_BETTER = ("val_loss", "loss", "grad_norm", "mem_gib")  # tokens_per_s and mfu: higher is better
HARM = 0.01  # BAD counts as worse when its metric is worse than GOOD's by more than 1% (runs of one seed repeat
             # exactly on CPU; the quickstart's seeds spread 1.90-1.92 in val_loss, about 1%)


def load_bisect(run):
    from ms_llm.fileio import read_versioned_json

    return read_versioned_json(os.path.join(run.path, BISECT), FORMAT)


@rule(finds=('bisected',), live=EVAL)
def rule_bisected(run, found, _):
    doc = load_bisect(run)
    if not doc or not finite(doc.get("good_metric")) or not finite(doc.get("bad_metric")):
        return None
    metric, good, bad = doc.get("metric"), doc["good_metric"], doc["bad_metric"]
    runs = doc.get("runs") or []
    ev = [f"{BISECT}: {len(runs)} runs of {doc.get('steps')} steps, GOOD = {doc.get('good')}, BAD = {doc.get('bad')}; "
          f"{metric} {good:.4g} (GOOD) and {bad:.4g} (BAD)"]
    ev += [f"run {r.get('label')}: BAD's {', '.join(r.get('applied') or []) or 'none'} → {metric} "
           f"{r.get('metric'):.6g} ({r.get('run_dir')})" for r in runs if finite(r.get("metric"))]
    rows = doc.get("found") or []
    if not rows:
        return [Finding("bisected", "info", f"note: measured: none of the {len(doc.get('differing') or [])} "
                        f"setting(s) bisected changes {metric} measurably at {doc.get('steps')} steps", ev,
                        [cause("the settings tried did nothing measurable at this length", "high")],
                        [doc.get("verdict") or ""])]
    row = rows[0]
    worse = bad - good if metric in LOWER_IS_BETTER else good - bad
    if worse <= HARM * abs(good):  # BAD is no worse: what the bisect found changes the metric, for the better or
        return [Finding("bisected", "info", f"note: measured: {doc.get('verdict') or ''}, and BAD's side is not worse "
                        f"({metric} {bad:.4g} against {good:.4g}): not the cause of a worse run", ev,
                        [cause("the settings found do not make the run worse at this length", "high")],
                        [f"nothing to change for {metric}: the run's side of the bisect is as good or better"])]
    values = row.get("values") or []
    alone = {a.get("key"): a.get("share") for a in row.get("alone") or []}
    named = [f"{v['key']} ({v['good']} → {v['bad']})" for v in values]
    sets = [f"--set {v['key']}={v['good']}" for v in values]
    together = len(named) > 1
    symptom = (f"measured: {' and '.join(named)} {'together explain' if together else 'explains'} {metric} "
               f"{good:.4g} → {bad:.4g} (bisect of {len(runs)} runs)")
    if together:
        causes = [cause(f"{n}: measured, with the other key(s) of the set; alone it goes "
                        f"{100 * alone[v['key']]:.0f}% of the way" if finite(alone.get(v["key"])) else
                        f"{n}: measured, with the other key(s) of the set", "high") for n, v in zip(named, values)]
    else:
        causes = [cause(f"{named[0]}: measured, the run with it alone reproduces the difference", "high")]
    return [Finding("bisected", "warning", symptom, ev, causes, [" ".join(sets) + " (the GOOD side's values)"])]
