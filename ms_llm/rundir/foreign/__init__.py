"""Other frameworks' training logs read as ms_llm runs: `load_foreign(path)` returns the same
`ms_llm.rundir.reader.Run` that a run directory gives, so `diagnose`, `report` and `compare-curves` read it
unchanged. One reader per framework (megatron.py, also MindSpeed-LLM; mindformers.py; torchtitan.py), one module
that finds the files and the format (detect.py); docs/foreign_logs.md lists the formats and versions.

The Run also says what the reader left out (`run.skipped`: lines by reason) and what the log lacks
(`run.lacks`: [(field, why)], which needs.py turns into "rule X needs Y" lines)."""
import os
from collections import Counter

from ms_llm.errors import UserError
from ms_llm.rundir.foreign.assemble import build, world_size
from ms_llm.rundir.foreign.detect import FORMATS, READERS, detect, log_files
from ms_llm.rundir.foreign.logtext import logical_lines, physical_lines


def load_foreign(path, run, fmt=None):
    """`run` (an empty ms_llm.rundir.reader.Run, which load_run hands in) filled with the run in the log file or
    folder of worker logs `path`, read by the `fmt` reader (None or "auto": detected). Bad input is a UserError."""
    if fmt not in (None, *FORMATS):
        raise UserError(f"--format {fmt}: not one of {', '.join(FORMATS)}.")
    files = log_files(path)
    if not files:
        raise UserError(f"'{path}' has no log files (*.log, *.txt, *.out, worker_K.log) and no metrics.jsonl: it is "
                        f"not a run directory, nor a folder of training logs. Pass a run directory (the --run-dir of "
                        f"'ms-llm train'), a training log, or the folder msrun/torchrun wrote the worker logs to.")
    counts = Counter()
    physical = {}
    for f in files:
        try:
            physical[f] = physical_lines(f, counts)
        except OSError as e:
            counts[f"files not readable ({type(e).__name__})"] += 1
    name = detect(physical, path) if fmt in (None, "auto") else fmt
    reader = READERS[name]
    lines = []
    for f in files:
        if f in physical:
            lines += logical_lines(physical[f], reader.starts, reader.complete, reader.begins_line, counts,
                                   getattr(reader, "ends", None))
    p = reader.read(lines, counts)
    p.info["format"] = name
    add_config_files(p, name, files)
    if not p.train and not p.evals:
        raise UserError(f"'{path}' read as {reader.TITLE}: no training line in {len(files)} file(s) "
                        f"({sum(len(v) for v in physical.values())} lines). {reader.TITLE}'s line looks like "
                        f"{EXAMPLES[name]}; force another reader with --format, or pass the log of the rank that "
                        f"printed the loss.")
    return build(p, run, [os.path.relpath(f, path) if os.path.isdir(path) else f for f in files])


EXAMPLES = {"megatron": "' iteration 10/ 100 | ... | lm loss: 3.2E+00 | ... |'",
            "mindformers": "'{ Epoch:[  1/  1], step:[ 10/100], loss: 3.210, per_step_time: 512ms, ...'",
            "torchtitan": "'step: 10  loss:  3.2100  memory: ...GiB(..%)  tps: ...'"}


def add_config_files(p, name, files):
    """The config beside the logs, where the log itself has none: MindFormers' YAML, torchtitan's TOML."""
    if name == "mindformers" and not p.config:
        from ms_llm.rundir.foreign import mindformers

        path, raw = mindformers.find_yaml(files)
        if path:
            p.config, p.config_notes = mindformers.config_from_yaml(path, raw, p.info.get("steps_per_epoch"))
            p.config_source = shown(path) if p.config else ""
    elif name == "torchtitan":
        from ms_llm.rundir.foreign import torchtitan

        path = torchtitan.find_toml(files)
        if path:
            raw, note = torchtitan.load_toml(path)
            if raw is None:
                p.config_notes.append(note)
                return
            ranks = {r for r, _, _ in p.train}
            p.config, p.config_notes = torchtitan.config_from_toml(raw, world_size(p, ranks, {}))
            p.config_source = shown(path)


def shown(path):
    rel = os.path.relpath(path)
    return rel if not rel.startswith("..") else path


def describe(run):
    """The first line of `diagnose`/`report`/`compare-curves` on a foreign run: what read it and how much."""
    info = run.info
    files = info.get("files") or []
    ranks = info.get("ranks") or []
    parts = [f"{len(files)} file(s)", f"{len(run.train)} training records", f"{len(run.evals)} evaluations",
             f"{len(run.events)} events"]
    if len(ranks) > 1:
        parts.append(f"ranks {min(ranks)}-{max(ranks)}, rank {info.get('rank_read')} read")
    skipped = getattr(run, "skipped", None) or {}
    joined = skipped.get("wrapped lines joined")
    if joined:
        parts.append(f"{joined} wrapped lines joined")
    left = [f"{n} {what}" for what, n in skipped.items() if what not in ("other lines (not metrics)",
                                                                        "wrapped lines joined")]
    if left:
        parts.append("left out: " + ", ".join(left))
    other = skipped.get("other lines (not metrics)")
    if other:
        parts.append(f"{other} other lines (not metrics)")
    version = f" ({info['version']})" if info.get("version") else ""
    config = (f"; config from {info['config_source']}" if info.get("config_source") else "; no config")
    return f"read as a {info.get('framework')} log{version}: " + ", ".join(parts) + config


__all__ = ["FORMATS", "READERS", "describe", "load_foreign"]
