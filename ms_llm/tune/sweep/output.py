"""What a sweep leaves behind besides its trial directories: the results table (console), sweep.json (for
tools), and the best trial's config as a YAML file ready to train with."""
import datetime
import json
import os

import yaml

from ms_llm.fileio import atomic_write_bytes, read_versioned_json
from ms_llm.tune.values import show
from ms_llm.rundir import names

FORMAT = "ms_llm.sweep/1"


def format_table(records, keys, metric):
    head = ["#"] + list(keys) + ["final val_loss", "best val_loss", "tokens/s", "diverged", "stopped at", "wall",
                                "trial"]
    if metric == "loss":
        head.insert(len(keys) + 1, "final loss")
    rows = []
    for i, r in enumerate(records, 1):
        row = [str(i) if r["metric"] is not None else "-"] + [show(r["values"].get(k)) for k in keys]
        if metric == "loss":
            row.append(num(r["final_loss"]))
        row += [num(r["final_val_loss"]), num(r["best_val_loss"]),
                f"{r['tokens_per_s']:,.0f}" if r["tokens_per_s"] else "-", "yes" if r["diverged"] else "no",
                str(r["stopped_at_step"]) if r["stopped_at_step"] else unfinished(r), duration(r["wall_s"]),
                r["name"]]
        rows.append(row)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    return "\n".join("  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip() for line in [head] + rows)


def unfinished(r):
    return {"finished": "-", "failed": "failed", "new": "not run"}.get(r["status"], r["status"])


def num(v):
    return f"{v:.4f}" if isinstance(v, (int, float)) else "-"


def duration(s):
    if not isinstance(s, (int, float)):
        return "-"
    m, s = divmod(int(round(s)), 60)
    return f"{m}:{s:02d}"


def sweep_document(spec, state, records, order, best, warnings, best_config):
    return {"format": FORMAT, "state": state, "updated": datetime.datetime.now().isoformat(timespec="seconds"),
            "spec": spec.to_dict(), "metric": spec.metric, "trials": records, "order": order,
            "best": dict(best, config=best_config) if best else None, "warnings": warnings}


def write_sweep_json(path, doc):
    atomic_write_bytes(path, (json.dumps(doc, indent=1, default=str, allow_nan=False) + "\n").encode())


def read_sweep_json(path):
    return read_versioned_json(path, FORMAT)


def write_best_config(spec, best, path):
    """The golden config with the best values: the config file, the sweep's --set, the best trial's values.
    The sweep's own economy (trial length, log and checkpoint intervals) is left out: train with the config's
    train.max_steps, as the golden run would."""
    from ms_llm.config import load_config, to_dict
    from ms_llm.tune.sweep.space import point_overrides

    base, overrides, note = spec.config, spec.overrides, ""
    if not os.path.isfile(base):  # --collect from another folder than the sweep ran in (a relative --config)
        base, overrides = os.path.join(best["run_dir"], names.CONFIG), []
        note = (f"# ({spec.config} is not reachable from here: this is the best trial's own config, with the "
                f"sweep's train.max_steps = {spec.steps})\n")
    cfg = load_config(base, overrides + point_overrides(best["values"]))
    value = f"{best['metric']:.4f}" if isinstance(best.get("metric"), (int, float)) else "?"
    head = [f"# Best trial of the sweep in {os.path.dirname(os.path.abspath(path))} ({best['name']}):",
            f"#   {spec.metric} {value} after {spec.steps} steps; trial directory {best['run_dir']}",
            f"# = {base}" + "".join(f" --set {o}" for o in overrides + point_overrides(best["values"])),
            f"# Train with: ms-llm train --config {path}", ""]
    text = "\n".join(head) + note + yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=None)
    atomic_write_bytes(path, text.encode("utf-8"))
    return path
