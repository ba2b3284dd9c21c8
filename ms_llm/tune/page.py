"""The tune package's HTML pages, built with the report's own machinery (ms_llm/report: page.document, the
Builder's panel dicts, static/report.js drawing them with the inlined BokehJS), so there is one plotting stack:

- sweep_report.html: the results table and the one-at-a-time order, the metric against each varied key, and
  every trial's curves overlaid (the same panels `ms-llm report` draws for several runs);
- lr_find.html: the range test's loss against the learning rate;
- ladder.html: the ladder's table, every rung's curves overlaid, and each rung's difference to the rung before
  against the seed-to-seed band.
"""
import math
import os

from ms_llm.fileio import atomic_write_bytes
from ms_llm.tune.sweep.output import duration, num
from ms_llm.tune.values import show
from ms_llm.rundir import names


def write_sweep_page(doc, path):
    from ms_llm.pages import html as page
    from ms_llm.pages.runs import load_runs
    from ms_llm.pages.payload import Builder
    from ms_llm.pages.sections import config_section, differences_section, events_section

    trials = doc["trials"]
    spec = doc["spec"]
    dirs = [t["run_dir"] for t in trials if os.path.isfile(os.path.join(t["run_dir"], names.METRICS))]
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
    from ms_llm.pages import html as page
    from ms_llm.pages.payload import Builder

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


def write_ladder_page(doc, path):
    """The ladder's table and notes, every rung's curves overlaid (the report's panels), and the differences to
    the rung before against the seed-to-seed band (ladder_difference_panels)."""
    from ms_llm.pages import html as page
    from ms_llm.pages.runs import load_runs
    from ms_llm.pages.payload import Builder
    from ms_llm.pages.sections import config_section, differences_section

    rungs = [r for r in doc["rungs"] if r["status"] in ("finished", "halted")
             and os.path.isfile(os.path.join(r["run_dir"], names.METRICS))]
    runs = load_runs([r["run_dir"] for r in rungs]) if rungs else []
    builder = Builder(runs, "step")
    panels = [p for p in (builder.build() if runs else []) if p["section"] == "curves"]
    panels += ladder_difference_panels(builder, doc)
    grid = "".join(page.panel_html(p["id"], p["title"], wide=p["id"].startswith("ladder_")) for p in panels)
    notes = "".join(f'<p class="note">{page.esc(n)}</p>' for n in builder.notes)
    sections = {"summary": ladder_summary_html(doc, page), "curves": f'<div class="grid">{grid}</div>{notes}',
                "differences": differences_section(runs) if len(runs) > 1 else None,
                "config": config_section(runs) if runs else None}
    payload = {"x_label": "step", "panels": panels, "events": builder.event_lines()}
    ident = doc["identity"]
    html = page.document(f"ms_llm ladder: {os.path.basename(ident['config'])}",
                         f"{len(doc['rungs']) - 2} option rung(s) after plain, {ident['steps']} steps each, "
                         f"state {doc['state']}", sections, payload)
    atomic_write_bytes(path, html.encode("utf-8"))
    return path


def ladder_difference_panels(builder, doc):
    """Each rung's difference to the rung before against the seed-to-seed band: |Δloss| per step (log axis), the
    trailing mean of Δloss (the trend the band's second envelope bounds), and |Δ grad norm| (log axis)."""
    from ms_llm.rundir.reader import read_jsonl
    from ms_llm.tune.ladder.verdict import Curves, gaps, trailing_means

    def curves(r):
        if r["status"] not in ("finished", "halted"):
            return None
        return Curves.from_records(read_jsonl(os.path.join(r["run_dir"], names.METRICS))[0])

    chain = [doc["rungs"][0]] + doc["rungs"][2:]
    band = doc.get("band") or {}
    n = band.get("trend_steps") or 10
    log_p = builder.panel("curves", "ladder_absdiff", "|Δloss| against the rung before, per step (log axis; a rung "
                          "identical to the one before has no points; dashed black: the per-step seed band)",
                          value_label="|Δloss|", y_log=True, x_label="step", x_format="@x",
                          legend_location="bottom_right")
    trend = builder.panel("curves", "ladder_trend", f"mean Δloss over the last {n} steps, rung − rung before "
                          f"(dashed black: ± the trend seed band)", value_label=f"{n}-step mean Δloss",
                          hlines=[0.0], x_label="step", x_format="@x")
    grad = builder.panel("curves", "ladder_graddiff", "|Δ grad norm| against the rung before (log axis)",
                         value_label="|Δ grad norm|", y_log=True, x_label="step", x_format="@x")
    for p in (log_p, trend, grad):
        p["y_format"] = "@y{0.000e}"
    for i in range(1, len(chain)):
        before, now = chain[i - 1], chain[i]
        a, b = curves(before), curves(now)
        if not (a and b):
            continue
        d = gaps(b.loss, a.loss)
        steps = [s for s, _ in d]
        g = [abs(b.grad_norm.get(s, math.nan) - a.grad_norm.get(s, math.nan)) for s in steps]
        label = f"{now['dir']} − {before['dir']}"
        # markers: a difference at isolated steps (zero, hence no point, around them) is no line
        builder.series(log_p, i, steps, [abs(x) if x else math.nan for _, x in d], label, markers=True)
        builder.series(trend, i, steps, [m for _, m in trailing_means(d, n)], label)
        builder.series(grad, i, steps, [x if x else math.nan for x in g], label, markers=True)
    if band.get("steps"):
        xs = band["steps"]
        per_step = [v if isinstance(v, (int, float)) else math.nan for v in band["values"]]
        trend_band = [v if isinstance(v, (int, float)) else math.nan for v in band["trend_values"]]
        builder.series(log_p, 0, xs, [y if y else math.nan for y in per_step], "per-step seed band", dash="dashed")
        builder.series(trend, 0, xs, trend_band, "+ trend seed band", dash="dashed")
        builder.series(trend, 0, xs, [-y for y in trend_band], "− trend seed band", dash="dashed")
        for s in [log_p["series"][-1]] + trend["series"][-2:]:
            s["color"] = "#000000"
    return [p for p in (log_p, trend, grad) if p["series"]]


def ladder_summary_html(doc, page):
    from ms_llm.tune.ladder.output import summary_lines, verdict_text

    rows = []
    for r in doc["rungs"]:
        v = r.get("verdict") or {}
        rows.append(["seed" if r["index"] < 0 else r["index"], r["name"], r["label"], r.get("expect"), verdict_text(r),
                     v.get("max_abs"), v.get("max_rel"), v.get("first_diff"), v.get("first_part"),
                     f"{r['tokens_per_s']:,.0f}" if r.get("tokens_per_s") else None,
                     f"x{r['speedup']:.2f}" if r.get("speedup") else None,
                     round(r["peak_mem_gib"], 3) if isinstance(r.get("peak_mem_gib"), float) else None, r.get("batch"),
                     duration(r.get("wall_s")), r.get("reason") or r.get("error") or v.get("reason"), r["run_dir"]])
    head = ["#", "rung", "option added", "expected", "verdict", "max |Δloss|", "max rel", "first diff",
            "first parting", "tokens/s", "speed-up", "peak mem GiB", "batch", "wall", "why", "run directory"]
    out = [page.table(head, rows, numeric=(5, 6, 7, 8, 9, 10, 11))]
    band = doc.get("band") or {}
    if band.get("definition"):
        out.append(f'<p class="note">noise band: {page.esc(band["definition"])}; a rung expected to move the '
                   f'numbers is within noise while, at every step, |Δloss(t)| <= per-step band(t) and |mean Δloss '
                   f'over the last {band.get("trend_steps")} steps| <= trend band(t) (each + rtol x |loss(t)|, rtol '
                   f'{doc["rtol"]:g}); one that must not change them is exact only when every logged loss and grad '
                   f'norm is bit-identical (docs/ladder.md).</p>')
    out += [f'<p class="note">{page.esc(line)}</p>' for line in summary_lines(doc)]
    out += [f'<p class="note">note: {page.esc(n)}</p>' for n in doc.get("notes") or []]
    return "".join(out)
