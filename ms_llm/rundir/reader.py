"""Reading run directories back: one run (for `diagnose`), all runs under a folder (`ms-llm runs`), and the
differences between two runs (`ms-llm runs --diff A B`). Pure Python over the files the trainer writes. A log
file, or a folder of another framework's worker logs, is read into the same Run by ms_llm.rundir.foreign."""
import contextlib
import contextvars
import json
import math
import os
import statistics
from dataclasses import dataclass, field

import yaml

from ms_llm.errors import UserError
from ms_llm.fileio import typed
from ms_llm.rundir.names import run_config_path
from ms_llm.rundir.walltime import account, duration, shares

# Values the metrics writer stores as strings because JSON has no NaN/Inf (see monitor/metrics.py).
NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf,
             "NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
TEXT_KEYS = {"event", "reason", "name", "kind", "flag", "detail", "op"}  # never converted to numbers


@dataclass
class Run:
    path: str
    config: dict = field(default_factory=dict)  # the resolved config as nested dicts ({} when absent)
    config_note: str = ""  # why config.yaml could not be read with this version, if so
    info: dict = field(default_factory=dict)
    train: list = field(default_factory=list)  # log-interval records (have "loss")
    evals: list = field(default_factory=list)  # {"step", "val_loss", ...}
    task_evals: list = field(default_factory=list)  # {"step", "tasks", "<task>/<metric>", ...} (ms_llm.eval.hook)
    events: list = field(default_factory=list)  # {"step", "event", ...}
    stats: list = field(default_factory=list)  # stats.jsonl records
    bad_lines: int = 0  # unparseable lines (a crash can leave a truncated last line)
    skipped: dict = field(default_factory=dict)  # another framework's log: lines left out, by reason
    lacks: list = field(default_factory=list)  # another framework's log: [(field, why the log lacks it)]

    @property
    def name(self):
        return os.path.basename(os.path.normpath(self.path))

    @property
    def final(self):
        return self.info.get("final") or {}

    @property
    def settings(self):
        """The run's config as the typed schema (ms_llm.config.schema.Config): the run's values where they read as
        this version's schema says, the schema's defaults for the rest. Every reader of a setting goes through here
        (or `cfg`), so no reader restates a default of its own."""
        key = id(self.config)
        if getattr(self, "_settings", (None,))[0] != key:
            from ms_llm.config.loader import SECTIONS
            from ms_llm.config.schema import Config

            self._settings = (key, Config(**{name: self.section(name) for name in SECTIONS}))
        return self._settings[1]

    def cfg(self, dotted):
        """`run.cfg("train.clip_grad")`: a setting by dotted key, typed (`settings`); None where the schema's value is
        null or an optional section is off, and, for a log of another framework (which states only some settings),
        where the log does not state it: no reader takes ms_llm's default for a setting another framework ran with.
        (An ms_llm run's config.yaml is resolved through the schema: it states every setting.)"""
        if self.foreign and not self.given(dotted):
            return None
        node = self.settings
        for key in dotted.split("."):
            node = getattr(node, key, None)
            if node is None:
                return None
        return node

    def given(self, dotted):
        """Whether the run's own config states `dotted` (a log of another framework states only some settings; an
        ms_llm run's config.yaml states every one)."""
        node = self.config
        for key in dotted.split("."):
            if not isinstance(node, dict) or node.get(key) is None:
                return False
            node = node[key]
        return True

    def section(self, name):
        """Section `name` of the run's config as its typed dataclass: the run's values where they read as this
        version's schema says, the schema's defaults for the rest (a config an older version wrote still reads,
        and no reader restates a default of its own)."""
        from ms_llm.config.loader import SECTIONS, build_section

        readable = {}
        for key, value in (self.config.get(name) or {}).items():
            try:
                build_section(name, SECTIONS[name], {key: value})
                readable[key] = value
            except (UserError, TypeError, ValueError):
                pass
        return build_section(name, SECTIONS[name], readable)

    @property
    def token_loss(self):
        """Whether the logged loss is next-token cross-entropy (nats per token), of which ln(vocab), the unigram
        entropy and "natural text never gets this low" are levels. A preference objective's loss is not: DPO's
        -log σ(β·margin) nears 0 on pairs it separates, IPO's starts at 1/(2β)² (25 at β 0.1), so no rule may
        read those levels into it."""
        return not (self.cfg("finetune.preference") or self.cfg("data.format") == "preference"
                    or any("rewards/margins" in r for r in self.train))

    @property
    def max_steps(self):
        return self.cfg("train.max_steps") or self.info.get("max_steps")  # a log without a config says it

    @property
    def foreign(self):
        """Whether the run was read from another framework's log (run.info names the framework)."""
        return "framework" in self.info

    @property
    def steps_done(self):
        steps = [r["step"] for r in self.train + self.evals + self.events + self.task_evals
                 if isinstance(r.get("step"), int)]
        return self.final.get("steps") or (max(steps) if steps else 0)

    @property
    def data_parallel(self):
        return self.cfg("parallel_config.data_parallel") or (self.info.get("parallel") or {}).get("data_parallel") or 1

    @property
    def accumulation(self):
        """Micro-batches accumulated per optimizer step = global / (micro × data-parallel)."""
        micro, glob = self.cfg("train.micro_batch_size"), self.cfg("train.global_batch_size")
        if not micro or not glob:
            return 1
        return max(1, glob // (micro * self.data_parallel))

    @property
    def status(self):
        if not self.final:
            return "running-or-crashed"  # the trainer writes `final` into run_info.json as its last act
        if self.max_steps and (self.final.get("steps") or self.max_steps) < self.max_steps:
            return "stopped"  # preempted or train.stop_at_step; a resumed run rewrites `final` when it ends
        return "finished"


def is_run_dir(path):
    return os.path.isfile(os.path.join(path, "config.yaml")) or os.path.isfile(os.path.join(path, "run_info.json"))


# The reader `--format` forces for paths that are not run directories (ms_llm.rundir.foreign.FORMATS); the
# commands set it around everything they read, so the report's diagnosis reads the log as the curves do.
LOG_FORMAT = contextvars.ContextVar("log_format", default=None)


@contextlib.contextmanager
def log_format(fmt):
    token = LOG_FORMAT.set(fmt)
    try:
        yield
    finally:
        LOG_FORMAT.reset(token)


def is_foreign_path(path):
    """A path load_run reads with another framework's reader: a file, or a folder that is no run directory."""
    return os.path.isfile(path) or (os.path.isdir(path) and not is_run_dir(path)
                                    and not os.path.isfile(os.path.join(path, "metrics.jsonl")))


def load_run(path, need_metrics=True):
    """Everything a run directory holds, parsed; a log file or a folder of worker logs of Megatron-LM,
    MindSpeed-LLM, MindFormers or torchtitan goes to their reader (ms_llm.rundir.foreign). Bad input (no
    directory, no metrics) is a UserError."""
    if is_foreign_path(path):
        from ms_llm.rundir.foreign import load_foreign
        from ms_llm.rundir.foreign.detect import log_files

        if os.path.isfile(path) or log_files(path) or LOG_FORMAT.get() not in (None, "auto"):
            try:
                return load_foreign(path, Run(path=path), LOG_FORMAT.get())
            except UserError:
                if need_metrics or os.path.isfile(path):
                    raise
    if not os.path.isdir(path):
        raise UserError(f"run directory '{path}' does not exist{' (it is a file)' if os.path.exists(path) else ''}. "
                        f"Pass the folder a training run wrote (the --run-dir of 'ms-llm train'); "
                        f"'ms-llm runs' lists the runs under ./runs.")
    metrics = os.path.join(path, "metrics.jsonl")
    if need_metrics and not os.path.isfile(metrics):
        what = "a run directory" if is_run_dir(path) else ("not a run directory (no config.yaml or run_info.json), "
                                                            "nor a folder of training logs (no *.log)")
        raise UserError(f"'{path}' has no metrics.jsonl, so there is nothing to diagnose; it is {what}. The trainer "
                        f"writes metrics.jsonl at the first log interval (train.log_interval steps): a run that "
                        f"stopped before that has no metrics yet. Check the path, or look at the run's logs/.")
    run = Run(path=path)
    run.config, run.config_note = read_config(run_config_path(path))
    run.info = typed(read_json(os.path.join(path, "run_info.json")), INFO_TYPES)
    records, run.bad_lines = read_jsonl(metrics)
    run.bad_lines += add_records(run, records)
    run.stats, bad = read_jsonl(os.path.join(path, "stats.jsonl"))
    run.bad_lines += bad
    return run


def read_config(path):
    """The config as nested dicts, through the typed loader so defaults fill keys an older run lacked.
    A config the current schema rejects (a renamed key) still comes back raw, with the reason."""
    if not os.path.isfile(path):
        return {}, "no config.yaml"
    from ms_llm.config import load_config, to_dict

    try:
        return to_dict(load_config(path, validate=False)), ""
    except UserError as e:
        try:
            with open(path, encoding="utf-8") as f:
                raw = yaml.safe_load(f)
        except (OSError, yaml.YAMLError):
            raw = None
        return (raw if isinstance(raw, dict) else {}), str(e)


def read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except (OSError, ValueError, RecursionError):
        return {}
    return obj if isinstance(obj, dict) else {}


NUMBER = (int, float)
# The types run_info.json's readers take its values in (rundir/writer.py and the trainer's final summary write them
# so). A value of another type (a hand edit, a damaged copy) is left out, as if the file did not state it: the run
# still reads, and no rule meets a string where it compares numbers. Keys not listed are kept as they are.
INFO_TYPES = {
    "start_time": str, "command": str, "host": str, "platform": str, "git_revision": str, "run_dir": str,
    "max_steps": int, "versions": {"*": str}, "device": {"target": str, "cpu_count": int, "cann_home": str},
    "parallel": {"*": int}, "dataset": dict,
    "final": {"final_val_loss": NUMBER, "steps": int, "skipped_steps": int, "compile_s": NUMBER,
              "peak_mem_gib": NUMBER, "parameters": int, "param_digest": str, "run_dir": str, "checkpoint": str},
}


def read_jsonl(path):
    """(records, number of unparseable lines); a missing file is no records."""
    records, bad, _ = read_jsonl_from(path, 0, whole_lines=False)
    return records, bad


def read_jsonl_from(path, offset, whole_lines=True):
    """(records, unparseable lines, the offset after the last line read) from byte `offset` on: a file another
    process is still appending to is read on where the last call stopped (with `whole_lines`, a last line without
    its newline yet is left for the next call)."""
    if not os.path.isfile(path):
        return [], 0, offset
    records, bad = [], 0
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    if whole_lines:
        data = data[:data.rfind(b"\n") + 1]
    for line in data.decode("utf-8", errors="replace").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            r = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(r, dict):
            records.append({k: (NONFINITE[v] if isinstance(v, str) and v in NONFINITE and k not in TEXT_KEYS
                                else v) for k, v in r.items()})
        else:
            bad += 1
    return records, bad, offset + len(data)


# The values the trainer writes as numbers (monitor/metrics.py, the trainer's events): a record holding another type
# for one of them is counted as a bad line, like a line that is not JSON.
NUMERIC_KEYS = frozenset((
    "loss", "lr", "grad_norm", "loss_scale", "skipped_interval", "skipped", "tokens_per_s", "tokens_per_s_per_device",
    "mfu", "mem_gib", "data_wait_frac", "time", "elapsed_s", "ms_per_step", "eta_s", "val_loss", "val_tokens",
    "duration_s", "since_step", "to_step", "lr_scale", "until_step", "steps", "signal"))


def _number(v):
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))


def add_records(run, records):
    """File metrics.jsonl records into the run's lists, as load_run does; returns the number of bad ones."""
    bad = 0
    for r in records:
        if not isinstance(r.get("step"), int) or isinstance(r.get("step"), bool):
            bad += 1  # every trainer record has an integer step
        elif any(k in NUMERIC_KEYS and not _number(v) for k, v in r.items()):
            bad += 1  # a damaged or edited line: a rule adding up losses or steps would meet a string or a list
        elif "event" in r:
            run.events.append(r)
        elif "tasks" in r:
            run.task_evals.append(r)
        elif "val_loss" in r:
            run.evals.append(r)
        elif "loss" in r:
            run.train.append(r)
    return bad


# --- ms-llm runs: the table --------------------------------------------------------------------------

def find_runs(root, max_depth=3):
    """Run directories under `root` (itself included), not descending into a run."""
    if not os.path.isdir(root):
        raise UserError(f"'{root}' is not a directory. 'ms-llm runs DIR' lists the runs under DIR "
                        f"(default ./runs); pass the folder your --run-dir paths live in.")
    found = []
    for here, dirs, _ in os.walk(root):
        depth = os.path.relpath(here, root).count(os.sep) + (here != root)
        if is_run_dir(here):
            found.append(here)
            dirs[:] = []
        elif depth >= max_depth:
            dirs[:] = []
        dirs.sort()
    return found


def summarize(run, root=None):
    """One row of the `ms-llm runs` table (also the --json form)."""
    finite = [r["val_loss"] for r in run.evals if _finite(r.get("val_loss"))]
    tok = [r["tokens_per_s"] for r in run.train if _finite(r.get("tokens_per_s"))]
    final_val = run.final.get("final_val_loss")
    acc = account(run)
    return {
        "name": os.path.relpath(run.path, root) if root else run.name,
        "start_time": run.info.get("start_time"),
        "arch": run.cfg("model.arch"), "layers": run.cfg("model.num_layers"), "hidden": run.cfg("model.hidden_size"),
        "params": run.final.get("parameters"),
        "steps": run.steps_done, "max_steps": run.max_steps,
        "best_val_loss": min(finite) if finite else None,
        "final_val_loss": final_val if _finite(final_val) else None,
        "tokens_per_s": statistics.median(tok[1:] or tok) if tok else None,  # first interval includes warm-up
        "status": run.status,
        "wall_s": acc["wall_s"] if acc else None,
        "time_shares": {label: round(share, 4) for label, _, share, _ in shares(acc)} if acc else None,
    }


def list_runs(root):
    rows = [summarize(load_run(p, need_metrics=False), root) for p in find_runs(root)]
    return sorted(rows, key=lambda r: (r["start_time"] or "", r["name"]))


def format_table(rows):
    head = ["run", "started", "model", "steps", "best val", "final val", "tok/s", "status", "wall", "where the time went"]
    body = [[r["name"], (r["start_time"] or "-").replace("T", " ")[:16], _model(r),
             f"{r['steps']}/{r['max_steps'] or '?'}", _num(r["best_val_loss"]), _num(r["final_val_loss"]),
             f"{r['tokens_per_s']:,.0f}" if r["tokens_per_s"] is not None else "-", r["status"],
             duration(r["wall_s"]) if r.get("wall_s") else "-", _time(r.get("time_shares"))] for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    return "\n".join("  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip() for line in [head] + body)


def _model(r):
    parts = [r["arch"] or "?", f"{r['layers']}L" if r["layers"] else "", f"h{r['hidden']}" if r["hidden"] else ""]
    if r["params"]:
        n = r["params"]
        parts.append(f"{n / 1e3:.0f}K" if n < 1e6 else f"{n / 1e6:.1f}M" if n < 1e9 else f"{n / 1e9:.2f}B")
    return " ".join(p for p in parts if p)


SHORT = {"training": "steps", "data wait": "data", "evaluation": "eval", "task evaluation": "tasks",
         "checkpoints": "ckpt",
         "tensor statistics": "stats", "NaN check": "nan", "profiler window": "profile", "anomaly guard": "anomaly",
         "the rest": "rest"}


def _time(time_shares, least=0.05):
    """'steps 61% eval 30% compile 8%': the phases of at least `least` of the wall time, largest first."""
    if not time_shares:
        return "-"
    top = sorted(((v, k) for k, v in time_shares.items() if v >= least), reverse=True)
    return " ".join(f"{SHORT.get(k, k)} {100 * v:.0f}%" for v, k in top) or "-"


def _num(v):
    return f"{v:.4f}" if v is not None else "-"


def _finite(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# --- ms-llm runs --diff A B --------------------------------------------------------------------------

ENV_KEYS = ("versions", "device", "host", "platform", "git_revision", "parallel")


def diff_runs(path_a, path_b):
    """{"config": [(key, a, b)], "environment": [...], "results": [...]}: what differs between two runs."""
    a, b = (load_run(p, need_metrics=False) for p in (path_a, path_b))
    for run in (a, b):
        if not is_run_dir(run.path):
            raise UserError(f"'{run.path}' is not a run directory (no config.yaml or run_info.json). "
                            f"--diff compares two folders written by 'ms-llm train'.")
    env_a = flatten({k: a.info.get(k) for k in ENV_KEYS if k in a.info})
    env_b = flatten({k: b.info.get(k) for k in ENV_KEYS if k in b.info})
    sa, sb = summarize(a), summarize(b)
    results = [(k, sa[k], sb[k]) for k in ("steps", "best_val_loss", "final_val_loss", "tokens_per_s", "status")
               if sa[k] != sb[k]]
    return {"a": path_a, "b": path_b, "config": changed(flatten(a.config), flatten(b.config)),
            "environment": changed(env_a, env_b), "results": results}


def flatten(d, prefix=""):
    """Nested sections → {"section.key": value}; a None or empty nested section stays one key."""
    out = {}
    for k, v in (d or {}).items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


MISSING = "(absent)"


def changed(fa, fb):
    return [(k, fa.get(k, MISSING), fb.get(k, MISSING)) for k in sorted(set(fa) | set(fb))
            if fa.get(k, MISSING) != fb.get(k, MISSING)]


def format_diff(d):
    lines = [f"A = {d['a']}", f"B = {d['b']}"]
    for section in ("config", "environment", "results"):
        rows = d[section]
        lines.append(f"\n{section}: " + ("no differences" if not rows else f"{len(rows)} difference(s)"))
        if rows:
            w = max(len(k) for k, _, _ in rows)
            lines += [f"  {k.ljust(w)}  A: {_show(va)}  |  B: {_show(vb)}" for k, va, vb in rows]
    return "\n".join(lines)


def _show(v):
    if isinstance(v, float):
        return f"{v:.6g}"
    return "null" if v is None else str(v)
