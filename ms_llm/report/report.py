"""`write_report(run_dirs, output)`: one self-contained HTML page for one or several runs (the trainer calls it
at every evaluation; `ms-llm report` calls it from the command line)."""
import datetime
import os

from ms_llm.rundir.reader import summarize
from ms_llm.errors import UserError
from ms_llm.fileio import atomic_write_bytes
from ms_llm.pages import html as page
from ms_llm.pages.runs import load_runs
from ms_llm.pages.sections import config_section, differences_section, events_section
from ms_llm.rundir import names

def default_output(run_dirs):
    if len(run_dirs) == 1 and os.path.isfile(run_dirs[0]):  # a log file: the page beside it
        return os.path.splitext(run_dirs[0])[0] + "." + names.REPORT
    return os.path.join(run_dirs[0], names.REPORT) if len(run_dirs) == 1 else names.REPORT


def write_report(run_dirs, output=None, align="step", title=None, diagnose=None):
    """Write the report of `run_dirs` (a path or a list of paths) to `output` (default: RUN/report.html for
    one run, ./report.html for several). Returns the path written. Bad input is a UserError.

    The file is replaced atomically, so a copy taken while the trainer refreshes it (OBS sync) is never half
    written. `diagnose`: run dir → its findings (`ms-llm diagnose`'s); None leaves the diagnosis out (the costliest
    part on long runs).
    """
    if isinstance(run_dirs, (str, os.PathLike)):
        run_dirs = [run_dirs]
    run_dirs = [os.fspath(p) for p in run_dirs]
    runs = load_runs(run_dirs, align)
    output = os.fspath(output) if output else default_output(run_dirs)
    folder = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(folder):
        raise UserError(f"--output {output}: folder '{folder}' does not exist. Create it or choose another path.")
    text = render(runs, align, title, diagnose)
    atomic_write_bytes(output, text.encode("utf-8"))
    return output


def render(runs, align, title, diagnose=None):
    from ms_llm.pages.payload import Builder  # Bokeh takes about a second to import: only when a page is drawn

    builder = Builder(runs, align)
    panels = builder.build()
    grids = {}
    for p in panels:
        grids.setdefault(p["section"], []).append(page.panel_html(p["id"], p["title"], wide=p["section"] == "heatmap"))
    notes = "".join(f'<p class="note">{page.esc(n)}</p>' for n in builder.notes)
    names = ", ".join(r.name for r in runs)
    sections = {
        "summary": summary_section(runs),
        "differences": differences_section(runs) if len(runs) > 1 else None,
        "curves": f'<div class="grid">{"".join(grids.get("curves", []))}</div>{notes}',
        "events": events_section(runs),
        "telemetry": f'<div class="grid">{"".join(grids["telemetry"])}</div>' if grids.get("telemetry") else None,
        "heatmap": f'<div class="grid">{"".join(grids["heatmap"])}</div>' if grids.get("heatmap") else None,
        "diagnosis": diagnosis_section(runs, diagnose) if diagnose else None,
        "bisect": bisect_section(runs),
        "profile": profile_section(runs),
        "config": config_section(runs),
    }
    subtitle = f"{len(runs)} run(s), x axis: {align}" + (" (step × global batch × sequence length)"
                                                         if align == "tokens" else "")
    payload = {"x_label": builder.x_label, "panels": panels, "events": builder.event_lines()}
    return page.document(title or f"ms_llm report: {names}", subtitle, sections, payload)


def summary_section(runs):
    rows = []
    for rd in runs:
        s = summarize(rd.run)
        tok = s["tokens_per_s"]
        last = rd.run.train[-1] if rd.run.train else {}
        # the time fields (newer runs): wall time so far, when the last record was written, and for a run
        # still going, the trainer's own estimate of what is left
        elapsed = last.get("elapsed_s")
        when = last.get("time")
        eta = last.get("eta_s") if s["status"] == "running-or-crashed" else None
        rows.append([rd.name, s["status"], f"{s['steps']}/{s['max_steps'] or '?'}", s["best_val_loss"],
                     s["final_val_loss"], f"{tok:,.0f}" if tok else None, s["start_time"],
                     duration(elapsed), datetime.datetime.fromtimestamp(when).isoformat(timespec="seconds")
                     if isinstance(when, (int, float)) else None, duration(eta),
                     rd.run.cfg("precision.compute_dtype"), os.path.abspath(rd.path)])
    bad = [f"{rd.name}: {rd.run.bad_lines} unreadable line(s) skipped" for rd in runs if rd.run.bad_lines]
    return (page.table(["run", "status", "steps", "best val loss", "final val loss", "tokens/s (median)", "started",
                        "elapsed", "last record", "ETA", "compute dtype", "path"], rows, numeric=(3, 4, 5, 7, 9))
            + "".join(f'<p class="note">{page.esc(b)}</p>' for b in bad) + time_bars(runs))


TIME_COLORS = {"startup": "#bcbd22", "compile": "#8c564b", "training": "#2ca02c", "data wait": "#ff7f0e",
               "evaluation": "#1f77b4", "task evaluation": "#393b79", "checkpoints": "#9467bd", "report": "#17becf",
               "the rest": "#c7c7c7"}
HOOK_COLORS = ("#d62728", "#e377c2", "#7f7f7f", "#aec7e8", "#ffbb78")


def time_bars(runs):
    """Per run, a stacked bar of where its wall time went (ms_llm.rundir.walltime), phases as measured."""
    from ms_llm.rundir.walltime import account, duration, shares

    out = []
    for rd in runs:
        acc = account(rd.run)
        if acc is None:
            continue
        rows = [r for r in shares(acc) if r[1] > 0]
        hooks = iter(HOOK_COLORS)
        colors = {label: TIME_COLORS.get(label) or next(hooks, "#7f7f7f") for label, *_ in rows}
        bar = "".join(f'<span style="width:{100 * share:.3f}%;background:{colors[label]}" title="'
                      f'{page.esc(label)}: {sec:.1f} s ({100 * share:.1f}%)"></span>' for label, sec, share, _ in rows)
        legend = "".join(f'<i style="background:{colors[label]}"></i>{page.esc(label)} {100 * share:.1f}%'
                         + (f' <span class="sub">({page.esc(key)})</span>' if key and share >= 0.05 else "")
                         for label, _, share, key in rows)
        note = "" if acc["measured"] else " (records without timing fields: their time is in 'the rest')"
        out.append(f'<h3>where the wall time went: {page.esc(rd.name)}, {duration(acc["wall_s"])} over '
                   f'{acc["processes"]} process(es){page.esc(note)}</h3><div class="timebar">{bar}</div>'
                   f'<div class="timelegend">{legend}</div>')
    return "".join(out)


def duration(seconds):
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or seconds != seconds:
        return None
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"




def diagnosis_section(runs, diagnose):
    """The findings `diagnose(run_dir)` returns for each run (ms_llm.diagnose's, handed in by whoever writes the
    report: the report reads run directories and never imports another tool)."""
    out = []
    for rd in runs:
        try:
            findings = diagnose(rd.path)
        except UserError as e:
            out.append(f"<h3>{page.esc(rd.name)}</h3><p class=note>not diagnosed: {page.esc(e)}</p>")
            continue
        except Exception as e:  # noqa: BLE001 (a failing rule must not cost the user the rest of the report)
            out.append(f"<h3>{page.esc(rd.name)}</h3><p class=note>diagnose failed ({page.esc(type(e).__name__)}: "
                       f"{page.esc(e)}); run 'ms-llm diagnose {page.esc(rd.path)}' for details.</p>")
            continue
        out.append(f"<h3>{page.esc(rd.name)}: {len(findings) or 'no'} finding(s)</h3>")
        for f in findings:
            items = lambda xs: "".join(f"<li>{page.esc(x)}</li>" for x in xs)  # noqa: E731
            out.append(f'<details open><summary><span class="sev-{page.esc(f.severity)}">[{page.esc(f.severity)}]'
                       f'</span> {page.esc(f.symptom)}</summary><div class="note">evidence:<ul>{items(f.evidence)}'
                       f'</ul>likely causes:<ol>{items(f.causes)}</ol>actions:<ul>{items(f.actions)}</ul></div>'
                       f'</details>')
    return "".join(out)


def bisect_section(runs):
    """A run directory's bisect.json (`ms-llm debug bisect`, `ms-llm diagnose RUN --measure`): every short run, the
    settings of BAD it applied to GOOD, its metric and which side it landed on, and the verdict."""
    import json

    from ms_llm.rundir.names import BISECT

    out = []
    for rd in runs:
        try:
            with open(os.path.join(rd.path, BISECT), encoding="utf-8") as f:
                doc = json.load(f)
            good, bad, metric = float(doc["good_metric"]), float(doc["bad_metric"]), str(doc["metric"])
            gap = (bad - good) or 1.0
            rows = []
            for r in doc.get("runs") or []:
                share = (float(r["metric"]) - good) / gap
                rows.append([r.get("label"), ", ".join(r.get("applied") or []) or "(none)", r.get("metric"),
                             f"{100 * share:.0f}% of the way to BAD", r.get("run_dir")])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # no bisect here, or a file this version does not read
        out.append(f"<h3>{page.esc(rd.name)}: {page.esc(doc.get('verdict') or '')}</h3>"
                   f'<p class="note">GOOD = {page.esc(doc.get("good"))}, BAD = {page.esc(doc.get("bad"))}, '
                   f'{page.esc(metric)} after {page.esc(doc.get("steps"))} steps</p>'
                   + page.table(["run", "BAD's settings applied to GOOD", metric, "where it landed", "run directory"],
                                rows, numeric=(2,)))
    return "".join(out) or None


def profile_section(runs):
    out = []
    for rd in runs:
        ops = rd.run.final.get("profile_top_ops") or []
        if not ops:
            continue
        rows = [[i, o.get("op"), o.get("ms_per_step"), o.get("calls_per_step"),
                 f"{100 * o['share']:.1f}%" if isinstance(o.get("share"), (int, float)) else None]
                for i, o in enumerate(ops[:10], 1)]
        window = rd.profile_window()
        out.append(f"<h3>{page.esc(rd.name)}" + (f": steps {window[0]}-{window[1]}" if window else "") + "</h3>"
                   + page.table(["#", "operator", "ms/step", "calls/step", "share"], rows, numeric=(0, 2, 3, 4)))
    return "".join(out) or ('<p class="note">not profiled (set monitor.profile.start_step / stop_step to record '
                            'a window and list its top operators here).</p>')
