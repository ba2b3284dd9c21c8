"""Sweeps on clusters: `--print-commands` prints each trial's launch command instead of running it (a local
`ms-llm train`, an `msrun` line for an Ascend node, or a ModelArts job's boot command), and `--collect DIR`
builds the results from run directories however they were run.

One-at-a-time decides its next trials from the results of the previous ones, so `--print-commands` prints the
trials that are due now: copy their run directories back into SWEEP_DIR/trials/ (or let them write there), and
the same command prints the next batch; `--collect` writes the table, sweep.json, page and best config.
"""
import os
import shlex

from ms_llm.rundir.reader import find_runs, flatten, load_run
from ms_llm.errors import UserError
from ms_llm.tune.sweep import output
from ms_llm.tune.sweep import trial as tr
from ms_llm.tune.sweep.results import trial_result
from ms_llm.tune.sweep.space import Spec
from ms_llm.tune.sweep.strategy import STRATEGIES, best_of
from ms_llm.rundir import names

LAUNCHERS = ("local", "msrun", "modelarts")
# keys that differ between runs by construction, not because a hyperparameter was varied
NOT_VARIED = ("checkpoint.strategy_dir", "context.num_threads", "context.device_id", "checkpoint.remote_dir",
              "checkpoint.auto_resume")


class Due(Exception):
    """Raised by the planning pass at the first stage with trials not yet done."""

    def __init__(self, trials):
        super().__init__()
        self.trials = trials


def due_trials(spec, sweep_dir):
    """The trials to run next: every missing one for a grid, the first unfinished stage for one-at-a-time."""
    trials_dir = os.path.join(sweep_dir, "trials")

    def run_points(points):
        trials = [tr.make_trial(spec, p, trials_dir) for p in points]
        missing = [t for t in trials if tr.status(t.run_dir) not in ("finished", "stopped")]
        if missing:
            raise Due(list({t.name: t for t in missing}.values()))
        return [trial_result(t.run_dir, t.values, spec.metric) for t in trials]

    try:
        STRATEGIES[spec.strategy](spec, run_points, lambda *_: None)
    except Due as d:
        return d.trials
    return []


def command(spec, t, launcher, workers, remote_root):
    args = tr.train_args(spec, t, resume=tr.status(t.run_dir) == "resumable")
    if launcher == "local":
        return shlex.join(["python", "-m", "ms_llm.cli"] + args)
    if launcher == "msrun":
        return shlex.join(["msrun", f"--worker_num={workers}", f"--local_worker_num={workers}", "--master_port=8118",
                           "--join=True", f"--log_dir={os.path.join(t.run_dir, 'msrun_logs')}", "train.py"] + args[1:])
    # ModelArts: the job's boot file is train.py; --train_url makes the remote copy (checkpoints, metrics, config)
    # with auto-resume, so a restarted job continues; download it into trials/<name> for --collect.
    boot = [a for a in args[1:] if a not in ("--resume",)]
    i = boot.index("--run-dir")
    boot = boot[:i] + boot[i + 2:] + [f"--train_url={remote_root.rstrip('/')}/{t.name}"]
    return shlex.join(["python", "train.py"] + boot)


def print_commands(spec, sweep_dir, launcher, workers, remote_root, echo=print):
    if launcher not in LAUNCHERS:
        raise UserError(f"--launcher {launcher!r} is not one of {', '.join(LAUNCHERS)}.")
    if launcher == "modelarts" and not remote_root:
        raise UserError("--launcher modelarts needs --remote-root obs://BUCKET/PATH: each trial's job copies its "
                        "checkpoints and metrics to REMOTE_ROOT/<trial>, which you download for --collect.")
    if workers < 1:
        raise UserError(f"--workers {workers} must be at least 1 (ranks per trial under msrun).")
    from ms_llm.tune.sweep.run import open_sweep_dir

    doc = open_sweep_dir(spec, sweep_dir, lambda *_: None)
    path = os.path.join(sweep_dir, "sweep.json")
    if doc is None:  # a record of the plan, so --collect knows which keys were varied
        output.write_sweep_json(path, output.sweep_document(spec, "planned", [], [], None, [], None))
    from ms_llm.tune.sweep.rules import plan_warnings

    for w in plan_warnings(spec):
        echo(f"# guide check: {w}")
    due = due_trials(spec, sweep_dir)
    if not due:
        echo(f"# every trial of this sweep is done: ms-llm sweep --collect {shlex.quote(sweep_dir)}")
        return 0
    echo(f"# {len(due)} trial(s) due now ({spec.strategy}); when they are done (run directories under "
         f"{os.path.join(sweep_dir, 'trials')}), run this command again for the next ones, or "
         f"'ms-llm sweep --collect {sweep_dir}' for the results")
    for t in due:
        echo(command(spec, t, launcher, workers, remote_root))
    return 0


def collect(sweep_dir, metric=None, echo=print):
    """Results of the run directories under `sweep_dir` (the sweep's own spec when it has sweep.json, else the
    config keys that differ between the runs are taken as the varied keys)."""
    from ms_llm.tune.sweep.run import finish

    doc = output.read_sweep_json(os.path.join(sweep_dir, "sweep.json")) if os.path.isdir(sweep_dir) else None
    runs = [p for p in find_runs(sweep_dir) if os.sep + "interrupted" + os.sep not in p + os.sep]
    if not runs:
        raise UserError(f"--collect {sweep_dir}: no run directories under it (folders with config.yaml or "
                        f"run_info.json). Point it at the sweep directory, or at a folder holding the trials' runs.")
    if doc and doc.get("spec"):
        spec = Spec(**doc["spec"])
        spec.metric = metric or spec.metric
    else:
        spec = inferred_spec(runs, metric or "val_loss")
    keys = list(spec.vary)
    records = []
    for path in runs:
        flat = flatten(load_run(path, need_metrics=False).config)
        records.append(trial_result(path, {k: flat.get(k) for k in keys}, spec.metric))
    best = best_of(records)
    order = (doc or {}).get("order") or []
    if spec.strategy == "collected":
        spec.config = os.path.join(best["run_dir"], names.CONFIG) if best else spec.config
    echo(f"collected {len(records)} run(s) under {sweep_dir}; varied: {', '.join(keys) or 'nothing'}")
    finish(spec, sweep_dir, records, best, order, [], echo, state="collected")
    return 0


def inferred_spec(runs, metric):
    flats = [flatten(load_run(p, need_metrics=False).config) for p in runs]
    keys = sorted({k for f in flats for k in f if any(f.get(k) != g.get(k) for g in flats)} - set(NOT_VARIED))
    vary = {}
    for k in keys:
        vals = []
        for f in flats:
            if f.get(k) not in vals:
                vals.append(f.get(k))
        vary[k] = vals
    steps = max((f.get("train.max_steps") or 0) for f in flats)
    return Spec(config=os.path.join(runs[0], names.CONFIG), overrides=[], vary=vary, strategy="collected",
                steps=steps, metric=metric)
