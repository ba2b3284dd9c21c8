"""What a tracker is sent, from the run directory and the metrics records: one mapping for every tracker, so that
what MLflow and SwanLab hold can be compared with metrics.jsonl key by key."""
import json
import math
import os

from ms_llm.rundir.names import run_config_path
from ms_llm.rundir.reader import flatten
from ms_llm.rundir import names

SKIP = ("step", "time")  # the step is the x axis; the Unix time the tracker's own timestamp


def metrics_of(record):
    """{name: value} of one metrics.jsonl record: every number in it but `step` and `time` (a list, e.g. an MoE
    layer's expert shares, as name/0, name/1, ...). A training record's names are its keys; an evaluation's are
    its `val_*` keys and eval/<key> for the rest (its duration); an event's are <event>/<key>."""
    if not isinstance(record.get("step"), int):
        return {}
    if "event" in record:
        prefix = f"{record['event']}/"
    elif "val_loss" in record:
        prefix = "eval/"
    else:
        prefix = ""
    out = {}
    for key, value in record.items():
        if key in SKIP:
            continue
        name = key if prefix == "eval/" and key.startswith("val_") else prefix + key
        if isinstance(value, list):
            out.update({f"{name}/{i}": float(v) for i, v in enumerate(value) if number(v)})
        elif number(value):
            out[name] = float(value)
    return out


def number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def event_of(record):
    """(tag name, text) of an event record, or None: event/<step>/<event> → its other fields as JSON."""
    if "event" not in record or not isinstance(record.get("step"), int):
        return None
    rest = {k: v for k, v in record.items() if k not in ("step", "time", "event")}
    return f"event/{record['step']:08d}/{record['event']}", json.dumps(rest, default=str)[:5000]


def params_of(run_dir):
    """The resolved config the run is training with (the newest config*.yaml), flattened: {"train.lr": "0.001"}."""
    import yaml

    with open(run_config_path(run_dir), encoding="utf-8") as f:
        config = yaml.safe_load(f) or {}
    return {k: param_text(v) for k, v in flatten(config).items()}


def param_text(v):
    if v is None:
        return "null"
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v if isinstance(v, str) else json.dumps(v)


def run_name(run_dir):
    return os.path.basename(os.path.abspath(run_dir).rstrip(os.sep))


def resumed_step(run_dir):
    """The step a resumed run went on from: its last `resume` event in metrics.jsonl (None: not resumed)."""
    step = None
    try:
        with open(os.path.join(run_dir, names.METRICS), encoding="utf-8") as f:
            for line in f:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if r.get("event") == "resume":
                    step = r.get("step")
    except OSError:
        pass
    return step


STATE = names.TRACKERS


def read_state(run_dir):
    try:
        with open(os.path.join(run_dir, STATE), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def write_state(run_dir, tracker, fields):
    """Record a tracker's run id in <run>/trackers.json (read back when the run is resumed)."""
    from ms_llm.fileio import atomic_write_bytes

    state = read_state(run_dir)
    state[tracker] = dict(state.get(tracker) or {}, **fields)
    atomic_write_bytes(os.path.join(run_dir, STATE), json.dumps(state, indent=1).encode())


def finished(run_dir):
    """Whether the run wrote its final summary (run_info.json 'final'): the tracker run ends as finished."""
    try:
        with open(os.path.join(run_dir, names.RUN_INFO), encoding="utf-8") as f:
            return "final" in json.load(f)
    except (OSError, ValueError):
        return False


ARTIFACTS = (names.REPORT, names.CONFIG, names.RUN_INFO, names.METRICS)
