"""The tune package's HTML pages, built with the report's own machinery (ms_llm/report: page.document, the
Builder's panel dicts, static/report.js drawing them with the inlined BokehJS), so there is one plotting stack:

- sweep_report.html: the results table and the one-at-a-time order, the metric against each varied key, and
  every trial's curves overlaid (the same panels `ms-llm report` draws for several runs);
- lr_find.html: the range test's loss against the learning rate.
"""
import math
import os

from ms_llm.fileio import atomic_write_bytes
from ms_llm.tune.output import duration, num
from ms_llm.tune.values import show


def write_sweep_page(doc, path):
    from ms_llm.report import page
    from ms_llm.report.data import load_runs
    from ms_llm.report.payload import Builder
    from ms_llm.report.report import config_section, differences_section, events_section

    trials = doc["trials"]
    spec = doc["spec"]
    dirs = [t["run_dir"] for t in trials if os.path.isfile(os.path.join(t["run_dir"], "metrics.jsonl"))]
    runs = load_runs(dirs) if dirs else []
    builder = Builder(runs, "step")
    for i, key in enumerate(spec["vary"]):
        metric_panel(builder, trials, key, spec["metric"], list(spec["vary"]), i)
    panels = builder.build() if runs else builder.panels
    grid = "".join(page.panel_html(p["id"], p["title"], wide=p["section"] == "heatmap") for p in panels
                   if p["section"] == "curves")
    notes = "".join(f'<p class="note">{page.esc(n)}</p>' for n in builder.notes)
    sections = {"summary": summary_html(doc, page), "curves": f'<div class="grid">{grid}</div>{notes}',
                "differences": differences_section(runs) if len(runs) > 1 else None,
                "events": events_section(runs) if runs else None, "config": config_section(runs) if runs else None}
    payload = {"x_label": builder.x_label, "panels": [p for p in panels if p["section"] == "curves"],
               "events": builder.event_lines()}
    name = os.path.basename(os.path.dirname(os.path.abspath(path)))
    html = page.document(f"ms_llm sweep: {name}", f"{len(trials)} trial(s), {spec['strategy']}, {spec['steps']} "
                         f"steps each, metric {spec['metric']}", sections, payload)
    atomic_write_bytes(path, html.encode("utf-8"))
    return path


def metric_panel(builder, trials, key, metric, keys, index):
    """The metric against one varied key: one line per combination of the other keys' values."""
    done = [t for t in trials if t["metric"] is not None]
    numeric = all(isinstance(t["values"].get(key), (int, float)) and not isinstance(t["values"].get(key), bool)
                  for t in done)
    labels = []
    if not numeric:  # a categorical key (lr_schedule): positions 0..n-1, named in the title
        for t in done:
            if show(t["values"].get(key)) not in labels:
                labels.append(show(t["values"].get(key)))
    xs = [t["values"][key] if numeric else labels.index(show(t["values"].get(key))) for t in done]
    positive = [x for x in xs if x > 0]
    log = numeric and len(positive) == len(xs) and len(xs) > 1 and max(xs) / min(xs) >= 10
    title = f"{metric} against {key}" + (f" ({', '.join(f'{i}={v}' for i, v in enumerate(labels))})" if labels else "")
    p = builder.panel("curves", f"sweep_{index}", title + "; trials without a value (diverged, stopped, failed) are "
                      "in the table only", axis=f"sweep_{index}", value_label=metric, x_label=key, x_log=log,
                      x_format="@x")
    groups = {}
    for t, x in zip(done, xs):
        rest = ", ".join(f"{k}={show(t['values'].get(k))}" for k in keys if k != key) or metric
        groups.setdefault(rest, []).append((x, t["metric"]))
    for i, (label, pts) in enumerate(groups.items()):
        pts.sort()
        builder.series(p, i, [x for x, _ in pts], [y for _, y in pts], label, markers=True)
    if not done:
        builder.notes.append(f"{metric} against {key}: no trial finished with a value yet")


def summary_html(doc, page):
    spec, trials, keys = doc["spec"], doc["trials"], list(doc["spec"]["vary"])
    rows = []
    for i, t in enumerate(trials, 1):
        rows.append([i if t["metric"] is not None else "-"] + [show(t["values"].get(k)) for k in keys]
                    + [num(t["final_val_loss"]), num(t["best_val_loss"]),
                       f"{t['tokens_per_s']:,.0f}" if t["tokens_per_s"] else None, "yes" if t["diverged"] else "no",
                       t["stopped_at_step"], t["stop_reason"], duration(t["wall_s"]), t["status"], t["run_dir"]])
    head = ["#"] + keys + ["final val loss", "best val loss", "tokens/s", "diverged", "stopped at step", "why",
                           "wall", "status", "run directory"]
    out = [f'<p class="note">config {page.esc(spec["config"])}'
           + "".join(f" --set {page.esc(o)}" for o in spec["overrides"] + spec.get("fixed", []))
           + "; varied: " + page.esc("; ".join(f"{k} = " + ", ".join(show(v) for v in vs)
                                               for k, vs in spec["vary"].items()))
           + f'; state: {page.esc(doc["state"])}</p>',
           page.table(head, rows, numeric=tuple(range(len(keys) + 1, len(keys) + 4)))]
    best = doc.get("best")
    if best:
        out.append(f'<p><b>best</b>: {page.esc(", ".join(f"{k}={show(v)}" for k, v in best["values"].items()))} '
                   f'({page.esc(spec["metric"])} {num(best["metric"])}); config ready to train: '
                   f'<code>{page.esc(best.get("config"))}</code></p>')
    if doc.get("order"):
        out.append("<h3>one-at-a-time: the order taken</h3>" + page.table(
            ["round", "key", "others fixed at", "tried (metric)", "best"],
            [[s["round"], s["key"], ", ".join(f"{k}={show(v)}" for k, v in s["fixed"].items()) or "-",
              "; ".join(f"{show(x['value'])}: " + ("diverged" if x["diverged"] else num(x["metric"]))
                        for x in s["tried"]), show(s["best"])] for s in doc["order"]]))
    out += [f'<p class="note">guide check: {page.esc(w)}</p>' for w in doc.get("warnings") or []]
    return "".join(out)


def write_lr_find_page(result, points, path):
    """Loss (raw and smoothed) against the learning rate, log x axis, the suggested and blow-up LRs marked."""
    from ms_llm.report import page
    from ms_llm.report.payload import Builder

    builder = Builder([], "step")
    p = builder.panel("curves", "lr_find", "loss against learning rate (vertical lines: steepest descent, "
                      "suggested peak LR, blow-up)", axis="lr", value_label="loss", x_label="learning rate",
                      x_log=True, x_format="@x", legend_location="top_left")
    lrs = [pt["lr"] for pt in points]
    builder.series(p, 0, lrs, [pt["loss"] for pt in points], "loss (per step)")
    builder.series(p, 1, lrs, [pt["smoothed"] for pt in points], "smoothed")
    p["vlines"] = [v for v in (result.get("steepest_lr"), result.get("suggested_lr"), result.get("blowup_lr"))
                   if isinstance(v, float) and math.isfinite(v)]
    finite = [pt["smoothed"] for pt in points if isinstance(pt["smoothed"], float) and math.isfinite(pt["smoothed"])]
    if finite:  # the blow-up can reach 1e3: keep the descent readable
        lo = min(finite)
        p["y_range"] = [lo - 0.1 * abs(lo), max(pt["smoothed"] for pt in points[:3]) * 1.5]
    rows = [["suggested peak LR", result.get("suggested_lr")], ["steepest descent at LR", result.get("steepest_lr")],
            ["lowest smoothed loss at LR", result.get("min_lr")], ["blew up at LR", result.get("blowup_lr")],
            ["steps run", result.get("steps_run")], ["stopped because", result.get("stop_reason")],
            ["config", result.get("config")]]
    rule = f'<p class="note">{page.esc(result.get("rule", ""))}</p>'
    sections = {"summary": page.table(["reading", "value"], rows) + rule,
                "curves": f'<div class="grid">{page.panel_html("lr_find", p["title"], wide=True)}</div>'}
    html = page.document("ms_llm lr-find", f"LR range test, {result.get('steps_run')} steps", sections,
                         {"x_label": "learning rate", "panels": [p], "events": builder.event_lines()})
    atomic_write_bytes(path, html.encode("utf-8"))
    return path
