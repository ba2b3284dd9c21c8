"""Sections shared by the HTML pages of the tools (the run report, the sweep and ladder pages): the config and
environment of runs, what differs between them, and their events."""
from ms_llm.pages import html as page
from ms_llm.pages.payload import EVENT_COLORS, WINDOW_EVENTS, event_detail
from ms_llm.rundir.reader import ENV_KEYS, changed, flatten

MAX_EVENT_ROWS = 300


def differences_section(runs):
    """Config and environment keys whose values differ between the runs (one column per run)."""
    out = []
    for what, get in (("config", lambda rd: flatten(rd.run.config)),
                      ("environment", lambda rd: flatten({k: rd.run.info.get(k) for k in ENV_KEYS
                                                          if k in rd.run.info}))):
        flat = [get(rd) for rd in runs]
        keys = sorted({k for f in flat[1:] for k, _, _ in changed(flat[0], f)})
        keys = [k for k in keys if not k.endswith("strategy_dir")]  # per-run path by construction
        if keys:
            out.append(f"<h3>{what}: {len(keys)} key(s) differ</h3>"
                       + page.table(["key"] + [rd.name for rd in runs],
                                    [[k] + [f.get(k, "(absent)") for f in flat] for k in keys]))
        else:
            out.append(f'<p class="note">{what}: no differences</p>')
    return "".join(out)


def events_section(runs):
    rows = []
    for rd in runs:
        rows += [[rd.name, e["step"], e.get("event"), event_detail(e)] for e in rd.events()]
    copies = remote_section(runs)
    if not rows:
        return ('<p class="note">no events (resume, preemption, NaN, rollback, checkpoint, anomaly skip) recorded; '
                'runs made before events were logged have none.</p>') + copies
    legend = " ".join(f'<span style="color:{c}">━ {page.esc(k)}</span>' for k, c in EVENT_COLORS.items())
    more = (f'<p class="note">{len(rows) - MAX_EVENT_ROWS} more not listed</p>' if len(rows) > MAX_EVENT_ROWS else "")
    return (copies + f'<p class="note">on the curves: {legend}; the profiled window ({", ".join(WINDOW_EVENTS)}) is '
            f'shaded on the speed panels.</p>' + page.table(["run", "step", "event", "details"],
                                                           rows[:MAX_EVENT_ROWS], numeric=(1,)) + more)


def remote_section(runs):
    """Per run with a checkpoint.remote_dir: which checkpoints are there, and which are only local (and why)."""
    from ms_llm.rundir.uploads import remote_copies

    out = []
    for rd in runs:
        copies = remote_copies(rd.run)
        if copies is None:
            continue
        there = sorted(copies.uploaded)
        text = (f"{rd.name}: remote copies in {copies.remote}: checkpoints at steps "
                f"{', '.join(map(str, there)) or 'none'}")
        if copies.only_local:
            text += "; only local: " + "; ".join(copies.describe(s) for s in copies.only_local)
        out.append(f'<p class="note">{page.esc(text)}</p>')
    return "".join(out)


def config_section(runs):
    out = []
    for i, rd in enumerate(runs):
        env = {k: v for k, v in rd.run.info.items() if k not in ("final", "run_dir")}
        final = rd.run.final
        rows_env = sorted(flatten(env).items()) + [(f"final.{k}", v) for k, v in sorted(flatten(final).items())
                                                   if k != "profile_top_ops"]
        note = f'<p class="note">config note: {page.esc(rd.run.config_note)}</p>' if rd.run.config_note else ""
        out.append(f'<details{" open" if i == 0 else ""}><summary>{page.esc(rd.name)}</summary>{note}'
                   f'<div class="grid"><div><h3>config.yaml</h3>'
                   f'{page.table(["key", "value"], sorted(flatten(rd.run.config).items()))}</div>'
                   f'<div><h3>environment (run_info.json)</h3>{page.table(["key", "value"], rows_env)}</div></div>'
                   f'</details>')
    return "".join(out)
