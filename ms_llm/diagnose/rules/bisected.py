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
    named = []
    for row in rows:
        named.append(", ".join(f"{v['key']} ({v['good']} → {v['bad']})" for v in row.get("values") or []))
    sets = [f"--set {v['key']}={v['good']}" for row in rows for v in row.get("values") or []]
    symptom = (f"measured: {'; '.join(named)} explain{'s' if len(named) == 1 else ''} {metric} {good:.4g} → "
               f"{bad:.4g} (bisect of {len(runs)} runs)")
    causes = [cause(f"{n}: measured, the run with it alone reproduces the difference" if len(row.get("keys") or []) == 1
                    else f"{n}: measured, together (neither alone reproduces it)", "high")
              for n, row in zip(named, rows)]
    return [Finding("bisected", "warning", symptom, ev, causes, [" ".join(sets) + " (the GOOD side's values)"])]
