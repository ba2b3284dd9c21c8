"""Per-step extras handed to the trainer from outside (profiler window, NaN watch, tensor statistics, anomaly
rollback, report refresh, telemetry): the loop calls them at fixed points and knows nothing else about them,
so `ms_llm.train` never imports `ms_llm.debug`. The entry point builds them from the config
(`ms_llm.run_hooks.hooks_for`)."""
import time
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class TrainingRun:
    """What a hook may use: the session (model, step, data), where the run writes, and how it logs."""
    session: Any
    run_dir: str
    writer: Any  # monitor.metrics.MetricsWriter: records go to the console, metrics.jsonl and the summaries
    log: Callable
    ckpt_rank: int
    extra: dict = field(default_factory=dict)  # what hooks add to the run's final summary (run_info.json)
    stop_reason: str = None  # set by a hook to end the run after this step, with a checkpoint (train.stop_on)


class Hook:
    """Every method is optional; `step` is the number of optimizer steps done before the current one."""

    def start(self, run):
        pass

    def before_step(self, run, step, batches):
        pass

    def after_step(self, run, step, out, batches):
        pass

    def after_log(self, run, record):
        pass

    def after_eval(self, run, step, val_loss):
        pass

    def finish(self, run):
        """Training is over (completed or stopped): close what the hook holds; fill `run.extra`."""

    def done(self, run, summary):
        """After the final summary is written (run_info.json): e.g. the last report refresh."""


def per_step(hooks):
    """The hooks with work of their own at every step (a `Hook`'s before_step and after_step do nothing): the loop
    calls only these each step, so a run without them runs nothing of the hooks' in a step."""
    return [h for h in hooks if any(getattr(type(h), m, None) not in (None, getattr(Hook, m))
                                    for m in ("before_step", "after_step"))]


def call(hooks, method, *args, times=None):
    """Call `method` on every hook that has it (a hook need not subclass Hook: the monitor's profiler window,
    which may not import ms_llm.train, implements only what it uses). `times`: a dict that gets the seconds of
    each call added under the hook's class name (the run's wall-time accounting)."""
    for h in hooks:
        fn = getattr(h, method, None)
        if fn is not None:
            if times is None:
                fn(*args)
                continue
            t0 = time.perf_counter()
            try:
                fn(*args)
            finally:
                name = type(h).__name__
                times[name] = times.get(name, 0.0) + time.perf_counter() - t0
