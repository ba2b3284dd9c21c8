"""A run's configuration history: config.yaml (what the first process ran) and config.resume_<n>.yaml (what the
process that resumed at step n ran), and the keys each resume changed. Pure Python over the run directory; the
rule that ties a change to the curve is rules/history.py."""
import os
from dataclasses import dataclass

from ms_llm.rundir import names

SPEED = ("context.", "data.num_workers", "monitor.")           # change how fast a step runs, not what it computes
BOOKKEEPING = ("checkpoint.", "train.log_interval", "train.eval_interval", "train.eval_steps", "train.stop_at_step",
               "data.source")                                  # change what is written, not the step


@dataclass
class Change:
    key: str
    before: object
    after: object

    @property
    def kind(self):
        """"training" (what a step computes), "speed" or "bookkeeping"."""
        if self.key.startswith(SPEED):
            return "speed"
        if self.key.startswith(BOOKKEEPING):
            return "bookkeeping"
        return "training"

    def text(self):
        return f"{self.key} {show(self.before)} → {show(self.after)}"


@dataclass
class Resume:
    step: int
    path: str          # the config the resumed process ran with
    changes: list      # [Change] against the config before it

    def of_kind(self, *kinds):
        return [c for c in self.changes if c.kind in kinds]


def show(v):
    if isinstance(v, float):
        return f"{v:.4g}"
    return "null" if v is None else str(v)


def config_files(run_dir):
    """[(step, path)]: config.yaml at 0, then each config.resume_<n>.yaml by step."""
    first = os.path.join(run_dir, names.CONFIG)
    return ([(0, first)] if os.path.isfile(first) else []) + [(step, os.path.join(run_dir, name))
                                                              for step, name in names.resume_configs(run_dir)]


def resumes(run):
    """[Resume] of the run, oldest first, each with the keys it changed (every key: a change is evidence, whatever
    it is). Remembered on the run object."""
    memo = getattr(run, "_resumes", None)
    files = config_files(run.path)
    if memo is not None and memo[0] == files:
        return memo[1]
    from ms_llm.rundir.reader import changed, flatten, read_config

    out, before = [], None
    for step, path in files:
        config, _ = read_config(path)
        flat = flatten(config)
        if before is not None and step > 0:
            out.append(Resume(step, path, [Change(k, a, b) for k, a, b in changed(before, flat)]))
        elif before is None and step > 0:  # config.yaml missing: nothing to compare with
            out.append(Resume(step, path, []))
        before = flat
    run._resumes = (files, out)
    return out

