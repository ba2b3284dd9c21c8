"""One trial: its run directory, its command line, and where it stands (new, finished, stopped by the sweep,
failed, resumable from a checkpoint, or started without one).

The sweep's own notes on a trial (values, attempts, wall time, why it was stopped) go to `sweep_trial.json`
in the trial's run directory, written after each attempt (the trainer refuses a non-empty directory for a new
run), so a trial directory describes itself wherever it is copied.
"""
import json
import os
import sys
from dataclasses import dataclass

from ms_llm.checkpoint import store
from ms_llm.fileio import atomic_write_bytes
from ms_llm.tune.sweep.space import point_overrides, trial_name
from ms_llm.rundir import names

MARKER = "sweep_trial.json"


@dataclass
class Trial:
    values: dict
    run_dir: str
    overrides: list  # every --set of this trial: the user's, the sweep's, then the varied values

    @property
    def name(self):
        return os.path.basename(self.run_dir)


def make_trial(spec, values, trials_dir):
    return Trial(dict(values), os.path.join(trials_dir, trial_name(values)),
                 spec.overrides + spec.fixed + point_overrides(values))


def train_args(spec, trial, resume=False):
    """The `ms-llm train` arguments of a trial (after the program name)."""
    args = ["train", "--config", spec.config]
    for o in trial.overrides:
        args += ["--set", o]
    return args + ["--run-dir", trial.run_dir] + (["--resume"] if resume else [])


def local_command(spec, trial, resume=False):
    return [sys.executable, "-m", "ms_llm.cli"] + train_args(spec, trial, resume)


def read_marker(run_dir):
    try:
        with open(os.path.join(run_dir, MARKER), encoding="utf-8") as f:
            m = json.load(f)
        return m if isinstance(m, dict) else {}
    except (OSError, ValueError):
        return {}


def write_marker(run_dir, marker):
    if os.path.isdir(run_dir):
        atomic_write_bytes(os.path.join(run_dir, MARKER), json.dumps(marker, indent=1, default=str).encode())


def finished(run_dir):
    """True when the trainer wrote its final summary for all of train.max_steps."""
    try:
        with open(os.path.join(run_dir, names.RUN_INFO), encoding="utf-8") as f:
            final = json.load(f).get("final") or {}
    except (OSError, ValueError):
        return False
    from ms_llm.rundir.reader import read_config

    max_steps = (read_config(os.path.join(run_dir, names.CONFIG))[0].get("train") or {}).get("max_steps")
    return bool(final) and max_steps is not None and (final.get("steps") or 0) >= max_steps


def status(run_dir):
    """new | finished | stopped (by the sweep: diverged or behind) | failed | resumable | partial."""
    if not os.path.isdir(run_dir) or not os.listdir(run_dir):
        return "new"
    marker = read_marker(run_dir)
    if marker.get("stop"):
        return "stopped"
    if finished(run_dir):
        return "finished"
    if halted(run_dir):
        return "stopped"  # the trainer stopped it itself: every update was being skipped (non-finite)
    if store.list_checkpoints(store.rank_dir(run_dir, 0)):
        return "resumable"
    return "failed" if marker.get("failed") else "partial"


def halted(run_dir):
    from ms_llm.rundir.reader import read_jsonl

    records, _ = read_jsonl(os.path.join(run_dir, names.METRICS))
    return any(r.get("event") == "halted" for r in records)
