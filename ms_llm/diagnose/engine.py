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

from ms_llm.diagnose import registry
from ms_llm.diagnose.common import SEVERITY_ORDER, memoised, memory_limit_gib
from ms_llm.diagnose.rules.device import rule_logs, scan_logs
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
    return run, apply_rules(run, None, memory_limit_gib(device_memory, run))


def apply_rules(run, rules=None, limit=None):
    """The findings of `rules` (default: every registered rule, registry.ordered_rules) on a parsed run: each rule
    sees the findings of the rules it reads (they ran before it); then the findings that explain others lead them
    (compose) and the whole is put in order (ordered). The engine's core, also what the live diagnosis runs at every
    check (ms_llm/diagnose/live.py)."""
    found = {}
    with memoised():
        for r in rules if rules is not None else registry.ordered_rules():
            fn = r.fn if isinstance(r, registry.Rule) else r
            try:
                new = fn(run, found, limit) or []
            except (TypeError, ZeroDivisionError) as e:
                if not run.foreign:
                    raise
                # another framework's log leaves settings out: the rule says so once (diagnose's "not judged")
                run.lacks.append((fn.__name__, f"it reads a setting this log does not state ({e})"))
                continue
            for f in new:
                found[f.id] = f
    return ordered(compose(found))


def compose(found):
    """Apply what findings say about each other: a finding another supersedes is withdrawn (an empty loss mask
    explains a loss near zero better than the label rules' causes); a finding another explains gets that cause first,
    its action first and the line that ties them (Finding.explains). No rule edits another rule's finding."""
    for f in list(found.values()):
        for fid in f.supersedes:
            found.pop(fid, None)
    for f in reversed(list(found.values())):  # the first finding to explain another leads it (engine.ordered)
        for e in f.explains:
            target = found.get(e.target)
            if target is None or target is f:
                continue
            if target.causes and e.key and e.key in target.causes[0]:
                continue  # it names the setting first itself
            if not target.causes or target.causes[0] != e.cause:
                keep = [c for c in target.causes if c != e.cause and not (e.key and e.key in c)]
                target.causes[:] = [e.cause] + keep
            if e.action and e.action not in target.actions:
                target.actions.insert(0, e.action)
            if e.line and e.line not in target.evidence:
                target.evidence.append(e.line)
    return list(found.values())


ROOT_CAUSES = ("resume_", "config_", "bisected")  # findings that name a setting as the cause of others', in order


def ordered(findings):
    """What explains what decides the order: a finding that explains others comes right before them, and its group
    takes the severity of the most severe finding in it (a setting that explains a NaN stands with the NaN, first);
    groups in order of severity, within a severity the groups led by a setting first, then in the order of the
    rules."""
    ids = {f.id: i for i, f in enumerate(findings)}
    parent = {}
    for f in findings:
        for e in f.explains:
            if e.target in ids and e.target != f.id and e.target not in parent:
                parent[e.target] = f.id

    def root(fid, seen=()):
        p = parent.get(fid)
        return fid if p is None or p in seen else root(p, seen + (fid,))

    groups = {}
    for f in findings:
        groups.setdefault(root(f.id), []).append(f)
    by_id = {f.id: f for f in findings}

    def group_key(rid):
        worst = min(SEVERITY_ORDER[f.severity] for f in groups[rid])
        kind = next((i for i, p in enumerate(ROOT_CAUSES) if rid.startswith(p)), len(ROOT_CAUSES))
        return worst, kind, ids[rid]

    out = []
    for rid in sorted(groups, key=group_key):
        lead = by_id[rid]
        out.append(lead)
        out += sorted((f for f in groups[rid] if f is not lead), key=lambda f: (SEVERITY_ORDER[f.severity], ids[f.id]))
    return out


def exit_code(findings):
    return 1 if any(f.severity != "info" for f in findings) else 0


def rules(live=None, leave_out=()):
    """The registered rules in the order they run; `live`: only those the live diagnosis runs at that moment
    (registry.CHEAP at log intervals, or every rule but the OFFLINE ones at evaluations)."""
    out = registry.ordered_rules()
    if live == registry.CHEAP:
        out = [r for r in out if r.live == registry.CHEAP]
    elif live == registry.EVAL:
        out = [r for r in out if r.live != registry.OFFLINE]
    return [r for r in out if r.name not in leave_out]


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
