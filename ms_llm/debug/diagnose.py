"""`ms-llm diagnose RUN`: symptoms in a run's metrics → evidence → likely causes → actions.

Each rule (diagnose_loss.py, diagnose_system.py) reads the parsed run (`ms_llm.debug.runs.Run`) and returns a `Finding` or None. The
thresholds are module constants, each documented (with the reason for its value) in docs/debugging.md; they
were set so that healthy runs — the quickstart's 2,000 steps, whose grad norm doubles and whose loss scale
grows as it should, and fp16 runs with the usual occasional overflow — produce no finding at all.
"""
from ms_llm.debug.diagnose_common import SEVERITY_ORDER, memory_limit_gib
from ms_llm.debug.diagnose_loss import rule_divergence, rule_labels, rule_nonfinite, rule_not_falling, rule_spikes
from ms_llm.debug.diagnose_system import (rule_always_clipped, rule_data_wait, rule_events,
                                          rule_loss_scale, rule_low_mfu, rule_memory, rule_stats, rule_uneven)
from ms_llm.debug.runs import load_run
from ms_llm.errors import UserError


def diagnose(run_dir, device_memory=None):
    """(run, findings) for the run in `run_dir`; findings sorted errors first. Bad input is a UserError."""
    run = load_run(run_dir)
    if not run.train and not run.evals:
        raise UserError(f"'{run_dir}/metrics.jsonl' holds no training records ({run.bad_lines} unreadable line(s)). "
                        f"The run stopped before its first log interval (train.log_interval = "
                        f"{run.cfg('train.log_interval', '?')} steps) or the file is damaged; look at the run's "
                        f"logs/ and the console output of 'ms-llm train' for the error.")
    limit = memory_limit_gib(device_memory, run)
    found = {}
    for rule in RULES:
        for f in rule(run, found, limit) or []:
            found[f.id] = f
    return run, sorted(found.values(), key=lambda f: SEVERITY_ORDER[f.severity])


def exit_code(findings):
    return 1 if any(f.severity != "info" for f in findings) else 0


RULES = [rule_nonfinite, rule_divergence, rule_not_falling, rule_labels, rule_spikes, rule_data_wait, rule_uneven,
         rule_low_mfu, rule_loss_scale, rule_memory, rule_always_clipped, rule_stats, rule_events]


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
