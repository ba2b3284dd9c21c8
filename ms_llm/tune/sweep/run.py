"""`ms-llm sweep`: plan, run (or resume), rank and write up a sweep. The sweep directory holds

    sweep.json          spec, every trial's results, the one-at-a-time order, the best trial, warnings
    trials/<name>/      one ordinary run directory per trial (ms-llm runs / report / diagnose work on them)
    logs/<name>.log     each trial's console output
    best_config.yaml    the golden config with the best values, ready for ms-llm train
    sweep_report.html   the results table, the metric against each varied key, the curves overlaid
    interrupted/        attempts that stopped before their first checkpoint (kept, not deleted)
"""
import datetime
import os
import shlex

from ms_llm.errors import UserError
from ms_llm.tune import folder_lock
from ms_llm.tune.sweep import output
from ms_llm.tune.sweep import rules
from ms_llm.tune.sweep.results import ranked
from ms_llm.tune.sweep.runner import Runner, SweepInterrupted
from ms_llm.tune.sweep.space import Spec
from ms_llm.tune.sweep.strategy import STRATEGIES

LOCK = "sweep.lock"


def default_sweep_dir(config):
    stem = os.path.splitext(os.path.basename(config))[0]
    return os.path.join("runs", f"sweep-{stem}-{datetime.datetime.now():%Y%m%d-%H%M%S}")


def open_sweep_dir(spec, sweep_dir, echo):
    """Create the sweep directory, or check that the one given holds this same sweep (then it is resumed)."""
    path = os.path.join(sweep_dir, "sweep.json")
    if os.path.isfile(path):
        doc = output.read_sweep_json(path)
        if doc is None:
            raise UserError(f"--sweep-dir {sweep_dir}: its sweep.json is unreadable or not an ms_llm sweep. Choose "
                            f"another --sweep-dir.")
        old = Spec(**doc["spec"]) if isinstance(doc.get("spec"), dict) else None
        ident = spec.identity()
        diff = [k for k in ident if old is None or old.identity().get(k) != ident[k]]
        diff = [k for k in diff if k != "fixed"] or diff  # `fixed` follows from --steps and --set: name the cause
        if diff:
            was = old.identity() if old else {}
            raise UserError(f"--sweep-dir {sweep_dir} holds another sweep ({', '.join(diff)} differ: "
                            + "; ".join(f"{k} was {was.get(k)!r}, now {ident[k]!r}" for k in diff[:3])
                            + "). A sweep resumes only with the same config file (and content), --set and --steps; "
                              "choose a new --sweep-dir for a new sweep.")
        changed = [k for k in ("vary", "strategy", "rounds", "halving", "metric")
                   if getattr(old, k) != getattr(spec, k)]
        done = sum(1 for t in doc.get("trials") or [] if t.get("status") in ("finished", "stopped"))
        echo(f"resuming the sweep in {sweep_dir}: {done} trial(s) already done are not run again"
             + (f" (plan changed: {', '.join(changed)}; trials at the same values are reused)" if changed else ""))
        return doc
    if os.path.isdir(sweep_dir) and os.listdir(sweep_dir):
        raise UserError(f"--sweep-dir {sweep_dir} exists and is not a sweep directory (no sweep.json). Nothing was "
                        f"changed; choose a new or empty folder.")
    os.makedirs(sweep_dir, exist_ok=True)
    return None


def run_sweep(spec, sweep_dir, parallel, echo=print, argv=None):
    """Run the sweep; returns the exit code (0 done, 130 interrupted: run the same command to resume)."""
    if parallel < 1:
        raise UserError(f"--parallel {parallel} must be at least 1 (trials at once).")
    open_sweep_dir(spec, sweep_dir, echo)
    with folder_lock.held(sweep_dir, LOCK, "--sweep-dir", "its trials save a checkpoint"):
        return sweep(spec, sweep_dir, parallel, echo, argv)


def sweep(spec, sweep_dir, parallel, echo, argv):
    warnings = rules.plan_warnings(spec)
    for w in warnings:
        echo(f"guide check: {w}")
    runner = Runner(spec, sweep_dir, parallel, echo)
    path = os.path.join(sweep_dir, "sweep.json")
    progress = lambda order=(): output.write_sweep_json(  # noqa: E731 (written after every trial)
        path, output.sweep_document(spec, "running", ranked(list(runner.records.values())), list(order), None,
                                    warnings, None))
    runner.on_result = lambda rec: progress()
    progress()
    echo(f"sweep: {spec.strategy} over {', '.join(spec.vary)}, {spec.steps} steps per trial, metric {spec.metric}, "
         f"{parallel} at a time; directory {sweep_dir}")
    try:
        with runner:
            best, order = STRATEGIES[spec.strategy](spec, runner.run_points, echo)
    except SweepInterrupted:
        records = ranked(list(runner.records.values()))
        output.write_sweep_json(path, output.sweep_document(spec, "interrupted", records, [], None, warnings, None))
        echo(f"sweep interrupted: {sum(r['status'] == 'finished' for r in records)} trial(s) finished; stopped trials "
             f"saved a checkpoint. Resume with:\n  {resume_command(argv, sweep_dir)}")
        return 130
    finish(spec, sweep_dir, list(runner.records.values()), best, order, warnings, echo)
    return 0


def resume_command(argv, sweep_dir):
    argv = list(argv or [])
    if "--sweep-dir" not in argv and not any(a.startswith("--sweep-dir=") for a in argv):
        argv += ["--sweep-dir", sweep_dir]
    return "ms-llm " + shlex.join(argv)


def finish(spec, sweep_dir, records, best, order, warnings, echo, state="done"):
    """Rank, write sweep.json, the best config and the page, print the table."""
    records = ranked(records)
    best_config = None
    if best is not None:
        warnings = warnings + rules.edge_notes(spec, best)
        best_config = output.write_best_config(spec, best, os.path.join(sweep_dir, "best_config.yaml"))
    doc = output.sweep_document(spec, state, records, order, best, warnings, best_config)
    output.write_sweep_json(os.path.join(sweep_dir, "sweep.json"), doc)
    page = None
    try:
        from ms_llm.tune.page import write_sweep_page

        page = write_sweep_page(doc, os.path.join(sweep_dir, "sweep_report.html"))
    except UserError as e:
        echo(f"warning: sweep_report.html not written: {e}")
    echo("")
    echo(output.format_table(records, list(spec.vary), spec.metric))
    for step in order:
        echo(f"order: round {step['round']}, {step['key']}: best {step['best']}")
    for w in warnings:
        echo(f"note: {w}")
    if best is None:
        echo("no trial finished with a value of the metric: nothing is best (see the table and the logs).")
    else:
        from ms_llm.tune.values import show

        echo(f"best: {', '.join(f'{k}={show(v)}' for k, v in best['values'].items())} ({spec.metric} "
             f"{best['metric']:.4f}); config: {best_config}")
    echo(f"sweep.json: {os.path.join(sweep_dir, 'sweep.json')}" + (f"; page: {page}" if page else ""))
    return doc
