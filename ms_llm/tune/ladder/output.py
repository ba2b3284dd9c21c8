"""What a ladder leaves besides its rung directories: the table (console), ladder.json (for tools), and the next
command for a parting rung (a layer-by-layer dump of both sides and `ms-llm compare`)."""
import json
import math
import os
import shlex

from ms_llm.fileio import atomic_write_bytes, read_versioned_json
from ms_llm.tune.ladder.launch import clock
from ms_llm.tune.ladder.plan import show

FORMAT = "ms_llm.ladder/1"
# Options the dump applies to a checkpoint's weights with --set (ms-llm debug dump builds the model with the run's
# compute dtype and kernels): for these the localisation dumps the rung before's weights twice, without and with
# the option, so every difference compare finds is the option's own. For the others (graph, layout, scheduling
# options: a dump of one batch in one process does not see them) it dumps each rung's own weights.
SAME_WEIGHTS = ("precision.compute_dtype", "context.cpu_kernels")


def read_doc(path):
    return read_versioned_json(path, FORMAT)


def write_doc(path, doc):
    atomic_write_bytes(path, (json.dumps(doc, indent=1, default=str, allow_nan=False) + "\n").encode())


def num(v, fmt="{:.3g}"):
    return fmt.format(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else (
        str(v) if isinstance(v, float) else "-")


def verdict_text(r):
    v = r.get("verdict") or {}
    if r["status"] == "skipped":
        return "skipped"
    if r["status"] in ("failed", "pending", "interrupted"):
        return r["status"]
    if r["index"] == 0:
        return "reference"
    if r["index"] < 0:
        return "noise band"
    text = v.get("verdict", "-")
    return text + (" (halted)" if r["status"] == "halted" else "")


def format_table(rungs):
    head = ["#", "rung", "option added", "expected", "verdict", "max |Δloss|", "max rel", "first diff",
            "first parting", "tokens/s", "speed-up", "peak mem GiB"]
    rows = []
    for r in rungs:
        v = r.get("verdict") or {}
        rows.append(["seed" if r["index"] < 0 else str(r["index"]), r["name"], r["label"], r.get("expect") or "-",
                     verdict_text(r), num(v.get("max_abs")), num(v.get("max_rel")),
                     str(v["first_diff"]) if v.get("first_diff") else "-",
                     str(v["first_part"]) if v.get("first_part") else "-",
                     f"{r['tokens_per_s']:,.0f}" if r.get("tokens_per_s") else "-",
                     f"x{r['speedup']:.2f}" if r.get("speedup") else "-", num(r.get("peak_mem_gib"), "{:.2f}")])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    return "\n".join("  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip() for line in [head] + rows)


def checkpoint_near(run_dir, step):
    """The rung's saved checkpoint step nearest below `step` (the weights its step `step` started from), else its
    first one; None when it saved none."""
    from ms_llm.checkpoint import store

    steps = sorted(store.list_checkpoints(store.rank_dir(run_dir, 0)))
    if not steps:
        return None
    below = [s for s in steps if s < step]
    return below[-1] if below else steps[0]


def localisation(before, now, step, out_dir):
    """The commands that localise a parting rung layer by layer at `step`, and what their answer means.
    `before`, `now`: the ladder.json records of the two rungs."""
    at = checkpoint_near(before["run_dir"], step)
    if at is None:
        return {"commands": [], "note": f"{before['name']} saved no checkpoint to dump"}
    a, b = os.path.join(out_dir, "before"), os.path.join(out_dir, "after")
    q = shlex.quote
    same = all(k in SAME_WEIGHTS for k in now["keys"])
    first = f"ms-llm debug dump --run-dir {q(before['run_dir'])} --step {at} --output {q(a)}"
    if same:
        sets = " ".join(f"--set {q(k + '=' + show(now['added'][k][1]))}" for k in now["keys"])
        second = f"ms-llm debug dump --run-dir {q(before['run_dir'])} --step {at} {sets} --output {q(b)}"
        note = (f"both dumps are {before['name']}'s weights at step {at}, the second with {', '.join(now['keys'])} "
                f"as {now['name']} runs it: every difference compare lists is the option's own. If no module is "
                f"beyond tolerance, the layers agree and the parting comes from the step around them (skipped "
                f"updates, loss scaling, the optimizer)")
    else:
        at_b = checkpoint_near(now["run_dir"], step)
        second = (f"ms-llm debug dump --run-dir {q(now['run_dir'])} --step {at_b if at_b is not None else at} "
                  f"--output {q(b)}")
        note = (f"each rung's own weights at step {at}: the first module beyond tolerance is where the two runs "
                f"stand furthest apart after {at} steps. (A dump runs one batch's forward and backward in one "
                f"process, without the training step's loss scaling, compiled-graph options or parallel layout, so "
                f"it cannot apply {', '.join(now['keys'])} to the same weights.)")
    return {"commands": [first, second, f"ms-llm compare {q(b)} {q(a)}"], "step": at, "dir": out_dir, "note": note}


def summary_lines(doc):
    """The closing lines: the band, each parting rung with its option and the commands that localise it."""
    out = []
    band = doc.get("band") or {}
    if band.get("steps"):
        out.append(f"seed-to-seed band (plain at seeds {band['seeds'][0]} and {band['seeds'][1]}): per step (running "
                   f"max of |Δloss|) {num(band['at_first'])} at step {band['steps'][0]}, {num(band['at_mid'])} at "
                   f"step {band['mid']}, {num(band['final'])} at step {band['last']}; trend (running max of the "
                   f"{band['trend_steps']}-step mean Δloss) {num(band['trend_at_mid'])} at step {band['mid']}, "
                   f"{num(band['trend_final'])} at step {band['last']}")
    for r in doc["rungs"]:
        v = r.get("verdict") or {}
        if r["status"] == "failed":
            out.append(f"rung {r['index']} {r['name']} failed to train: {r.get('error')} (log {r.get('log')})")
        if r["status"] == "skipped":
            out.append(f"rung {r['index']} {r['name']} skipped: {r['reason']}; on the cluster: {r['cluster_command']}")
        if v.get("verdict") == "PARTS":
            out.append(f"rung {r['index']} {r['name']} PARTS: {r['label']} — {v.get('reason')}")
            if r.get("skipped_note"):
                out.append(f"  {r['skipped_note']}")
            loc = r.get("localise") or {}
            if loc.get("commands"):
                out.append(f"  localise it layer by layer (checkpoint step {loc['step']}, nearest before the parting "
                           f"step {v.get('first_part') or v.get('first_diff')}):")
                out += [f"    {c}" for c in loc["commands"]]
                out.append(f"  ({loc['note']})")
        elif v.get("verdict") == "unverified" and r["index"] > 0:
            out.append(f"rung {r['index']} {r['name']}: not judged: {v.get('reason')}")
    return out


def duration(s):
    return clock(s) if isinstance(s, (int, float)) else "-"
