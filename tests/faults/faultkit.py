"""Helpers of the fault suite: a tiny config, an in-process training run with the entry point's hooks, and the
diagnosis of a run directory. Faults are injected through config values or by patching code in-process (the
compile cache is off, since a cached graph of the unpatched code would hide a patch)."""
import contextlib
import os
import subprocess
import sys

from conftest import ROOT, tiny_train_args
from ms_llm.config import load_config

SHAKESPEARE = os.path.join(ROOT, "configs", "shakespeare_char.yaml")
QUIET = ("--set", "monitor.report=false", "--set", "monitor.summary=false")  # not under test here, and cost time
# validation off, not even at the end, for runs whose assertions never read it (the evaluation graph's compile is a
# second of each run): faultkit.train checks that such a run evaluated nothing
NO_EVAL = ("train.eval_interval=0", "train.eval_steps=0")


def tiny_cfg(dataset, *overrides):
    args = tiny_train_args(dataset, "unused", "--set", "context.compile_cache=false", *QUIET, *overrides)
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    return load_config(SHAKESPEARE, sets)


def sets(*pairs):
    """sets("train.lr=1e-5", ...) → ("--set", "train.lr=1e-5", ...)"""
    return tuple(x for p in pairs for x in ("--set", p))


def train(cfg, run_dir, extra_hooks=()):
    """Runs whose assertions never read validation turn it off (train.eval_steps=0): its graph's compile is a
    second of each run. Such a run must then have evaluated nothing, not even at its end."""
    from ms_llm.run_hooks import hooks_for
    from ms_llm.train.trainer import run

    summary = run(cfg, run_dir=str(run_dir), echo=lambda *a: None, hooks=hooks_for(cfg) + list(extra_hooks))
    if not cfg.train.eval_steps:
        with open(os.path.join(str(run_dir), "metrics.jsonl"), encoding="utf-8") as f:
            assert not any('"val_loss"' in line for line in f), "a run with train.eval_steps=0 evaluated"
    return summary


def resume(cfg, run_dir, extra_hooks=()):
    """Resume the run in `run_dir` with `cfg` (the config a resume with --set overrides runs)."""
    from ms_llm.run_hooks import hooks_for
    from ms_llm.train.trainer import run

    return run(cfg, run_dir=str(run_dir), resume=True, echo=lambda *a: None, hooks=hooks_for(cfg) + list(extra_hooks))


@contextlib.contextmanager
def busy_process():
    """Another process keeping one core busy (a shared host) for as long as the block runs."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def diagnose(run_dir, **kw):
    from ms_llm.diagnose.engine import diagnose as diag

    return diag(str(run_dir), **kw)[1]


def alarms(findings):
    """Findings that fail the exit code (notes left out)."""
    return [f for f in findings if f.severity != "info"]


def finding_text(findings):
    return " | ".join(f"{f.id}: {f.symptom} {' '.join(f.causes)}" for f in findings)


def finding(findings, fid):
    match = [f for f in findings if f.id == fid]
    assert match, f"no {fid} finding: {finding_text(findings)}"
    return match[0]


def first_cause(findings, fid, *words, confidence=None):
    """The finding `fid`, after checking that its first cause holds every word (case-insensitive) and, when
    given, has that confidence."""
    f = finding(findings, fid)
    text = f.causes[0].lower()
    assert all(w.lower() in text for w in words), (words, f.causes)
    if confidence:
        assert f.confidence == confidence, (confidence, f.causes[0])
    return f
