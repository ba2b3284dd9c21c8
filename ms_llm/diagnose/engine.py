"""`ms-llm diagnose RUN`: symptoms in a run's metrics → evidence → likely causes → actions.

Each rule reads the parsed run (`ms_llm.rundir.reader.Run`) and the findings of the rules before it, and returns a
list of `Finding`s or None:

  rules/loss.py            the loss before any update, NaN/Inf, divergence, suspicious labels, spikes
  rules/regularisation.py  validation flat at the context-free level: dropout, weight decay, capacity, frozen parts
  rules/progress.py        progress against references (ln V, unigram entropy, sibling runs; references.py)
  rules/generalisation.py  validation rising / gap widening (with the best step and epochs), distribution shift
                           between the splits, validation leaking training text
  rules/system.py          throughput, loss scale, memory, clipping, tensor-statistics flags, events
  rules/wall_time.py       where the wall time went (rundir/walltime.py), speed against a benchmark of the config
  rules/device.py          temperature, host contention, unsupported operators and OOM in logs/, speedup
  rules/schedule.py        schedule and optimizer settings: findings when the curve shows them, else notes
  rules/moe.py             mixture of experts: router collapse, dead experts, dropped tokens, aux loss too weak/strong
  rules/finetune.py        fine-tuning: a mask that keeps no tokens, prompts in the loss, drift from the base model
  rules/preference.py      preference optimisation (DPO/IPO/SimPO): likelihood displacement, pairs too easy, flat
                           margins, a reference that is not the policy's start
  rules/remote.py          checkpoints that never reached checkpoint.remote_dir (the upload events)
  rules/tasks.py           lm-eval tasks evaluated during training: validation loss falling, task accuracy at chance

Causes carry a confidence (common.cause) from the evidence for them (causes.py). The thresholds
are module constants, each documented (with the reason for its value) in docs/debugging.md; they were set so that
healthy runs produce no finding at all.
"""
import os

from ms_llm.diagnose.common import SEVERITY_ORDER, memoised, memory_limit_gib
from ms_llm.diagnose.rules.bisected import rule_bisected
from ms_llm.diagnose.rules.device import rule_logs, rule_speedup, rule_temperature, scan_logs
from ms_llm.diagnose.rules.finetune import rule_finetune
from ms_llm.diagnose.rules.generalisation import rule_generalisation, rule_leakage
from ms_llm.diagnose.rules.history import rule_resume
from ms_llm.diagnose.rules.measured import rule_measured
from ms_llm.diagnose.rules.loss import rule_divergence, rule_labels, rule_nonfinite, rule_spikes, rule_start
from ms_llm.diagnose.rules.moe import rule_moe
from ms_llm.diagnose.rules.preference import rule_preference
from ms_llm.diagnose.rules.progress import rule_progress, rule_siblings
from ms_llm.diagnose.rules.regularisation import rule_underfitting
from ms_llm.diagnose.rules.remote import rule_remote_copies
from ms_llm.diagnose.rules.schedule import rule_schedule
from ms_llm.diagnose.rules.tasks import rule_tasks
from ms_llm.diagnose.rules.system import (rule_always_clipped, rule_data_wait, rule_events, rule_loss_scale,
                                          rule_low_mfu, rule_memory, rule_memory_growth, rule_stats, rule_uneven)
from ms_llm.diagnose.rules.wall_time import rule_machine_speed, rule_wall_time
from ms_llm.rundir.reader import load_run
from ms_llm.errors import UserError


def diagnose(run_dir, device_memory=None, logs=None, benchmark=None):
    """(run, findings) for the run in `run_dir`; findings sorted errors first. Bad input is a UserError. A run
    that died before its first log interval is still diagnosed when its logs (also `logs`, e.g. msrun's
    --log_dir) name the error (an unsupported operator, out of memory). `benchmark`: an `ms-llm benchmark` result
    of the run's config (default: RUN/benchmark.json when present)."""
    if benchmark is not None and not os.path.isfile(benchmark):
        raise UserError(f"--benchmark '{benchmark}' is not a file. Pass the JSON that 'ms-llm benchmark --config "
                        f"RUN/config.yaml --steps 20 --output FILE' wrote.")
    if logs is not None and not os.path.isdir(logs):
        raise UserError(f"--logs '{logs}' is not a directory. Pass the folder holding the run's worker logs (msrun's "
                        f"--log_dir).")
    try:
        run = load_run(run_dir)
    except UserError:
        if not os.path.isdir(run_dir):
            raise
        run = load_run(run_dir, need_metrics=False)
        run.extra_logs = logs
        if not any(scan_logs(run, logs).values()):
            raise
        return run, sorted(rule_logs(run, {}, None), key=lambda f: SEVERITY_ORDER[f.severity])
    run.extra_logs = logs
    run.benchmark_path = benchmark
    if not run.train and not run.evals:
        if any(scan_logs(run, logs).values()):
            return run, sorted(rule_logs(run, {}, None), key=lambda f: SEVERITY_ORDER[f.severity])
        raise UserError(f"'{run_dir}/metrics.jsonl' holds no training records ({run.bad_lines} unreadable line(s)). "
                        f"The run stopped before its first log interval (train.log_interval = "
                        f"{run.cfg('train.log_interval')} steps) or the file is damaged; look at the run's "
                        f"logs/ and the console output of 'ms-llm train' for the error.")
    return run, apply_rules(run, RULES, memory_limit_gib(device_memory, run))


def apply_rules(run, rules, limit=None):
    """The findings of `rules` on a parsed run, in order (the engine's core, also what the live diagnosis runs at
    every check: ms_llm/diagnose/live.py)."""
    found = {}
    with memoised():
        for rule in rules:
            for f in rule(run, found, limit) or []:
                found[f.id] = f
    return ordered(found.values())


ROOT_CAUSES = ("config_", "resume_")  # findings that name a setting as the cause of others'


def ordered(findings):
    """Errors first; within a severity, the findings that name a setting (config_*, resume_*) before the symptoms
    they explain; otherwise in rule order."""
    return sorted(findings, key=lambda f: (SEVERITY_ORDER[f.severity], not f.id.startswith(ROOT_CAUSES)))


def exit_code(findings):
    return 1 if any(f.severity != "info" for f in findings) else 0


RULES = [rule_start, rule_nonfinite, rule_divergence, rule_moe, rule_underfitting, rule_progress, rule_siblings,
         rule_labels, rule_finetune, rule_preference, rule_generalisation, rule_leakage, rule_tasks, rule_spikes,
         rule_resume, rule_data_wait, rule_uneven, rule_temperature, rule_low_mfu, rule_loss_scale, rule_memory,
         rule_memory_growth, rule_always_clipped, rule_stats, rule_logs, rule_speedup, rule_wall_time,
         rule_machine_speed, rule_measured, rule_bisected, rule_schedule, rule_events, rule_remote_copies]


def format_report(run_dir, run, findings):
    head = (f"diagnose {run_dir}: {len(run.train)} log records, {len(run.evals)} evaluations, "
            f"{len(run.events)} events, steps {run.steps_done}/{run.max_steps or '?'}")
    if not findings:
        return head + "\nno findings"
    lines = [head]
    for f in findings:
        lines += [f"\n[{f.severity}] {f.symptom}", "  evidence:"] + [f"    - {e}" for e in f.evidence]
        lines += ["  likely causes:"] + [f"    {i}. {c}" for i, c in enumerate(f.causes, 1)]
        lines += ["  actions:"] + [f"    - {a}" for a in f.actions]
    return "\n".join(lines)


def findings(run_dir):
    """The findings of `ms-llm diagnose RUN` (what the report shows beside the curves)."""
    return diagnose(run_dir, None)[1]
