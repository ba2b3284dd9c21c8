"""The per-step extras a config asks for, built as trainer hooks (ms_llm.train.loop.hooks) by the entry point:
the training loop itself knows none of them, and `ms_llm.train` never imports `ms_llm.debug` or `ms_llm.eval`."""
import os
import time

from ms_llm.train.loop.hooks import Hook
from ms_llm.rundir import names


def hooks_for(cfg):
    mon, hooks = cfg.monitor, []
    if mon.profile is not None:
        from ms_llm.monitor.profile import ProfileWindow

        hooks.append(ProfileWindow(mon.profile))
    if mon.nan_check:
        from ms_llm.debug.training_hooks import NanWatch

        hooks.append(NanWatch())
    if mon.tensor_stats is not None:
        from ms_llm.debug.training_hooks import TensorStats

        hooks.append(TensorStats(mon.tensor_stats))
    if cfg.train.anomaly is not None:
        from ms_llm.train.loop.anomaly_guard import AnomalyRollback

        hooks.append(AnomalyRollback(cfg.train.anomaly))
    if mon.telemetry_interval_s:
        hooks.append(Telemetry(mon.telemetry_interval_s))
    if cfg.eval.tasks:  # before the report refresh, so that a refreshed report has the evaluation's numbers
        from ms_llm.eval.hook import TaskEval

        hooks.append(TaskEval(cfg.eval))
    if mon.report:
        hooks.append(ReportRefresh())
    if mon.diagnose or cfg.train.stop_on:
        from ms_llm.diagnose.live import LiveDiagnosis

        hooks.append(LiveDiagnosis(cfg.train.stop_on))
    return hooks


class Telemetry(Hook):
    """Device telemetry (temperature, power, memory, utilisation) in a background thread on each node's first
    rank, into <run>/telemetry.jsonl (rank 0) or telemetry_rank_<r>.jsonl."""

    def __init__(self, interval_s):
        self.interval_s, self.sampler = interval_s, None

    def start(self, run):
        from ms_llm.monitor.telemetry import TelemetrySampler

        rank = run.session.rt.rank
        name = names.telemetry(rank)
        if rank == 0 or os.environ.get("DEVICE_ID") == "0":  # one sampler per node: the tools see all its devices
            self.sampler = TelemetrySampler(os.path.join(run.run_dir, name), self.interval_s,
                                            run.session.rt.device_target).start()

    def finish(self, run):
        if self.sampler is not None:
            self.sampler.stop()
            self.sampler = None


class ReportRefresh(Hook):
    """Rewrites <run>/report.html at evaluations and at the end (rank 0), so a run on ModelArts can be watched
    from its OBS copy. An evaluation refreshes it only when the last refresh is at least `BUDGET` times its own
    cost ago (and a minute), which keeps the report under 2% of the run's time; the end always does. A report
    that cannot be written is a warning, never the end of a run. Each refresh is recorded as a `report` event with
    its duration (the run's wall-time accounting)."""

    BUDGET = 50

    def __init__(self):
        self.last, self.cost = None, 0.0

    def after_eval(self, run, step, val_loss):
        if self.last is None or time.monotonic() - self.last >= max(60.0, self.BUDGET * self.cost):
            self.write(run, step)

    def done(self, run, summary):
        self.write(run, summary.get("steps"))

    def write(self, run, step):
        if not run.session.rt.is_main:
            return
        t0 = time.monotonic()
        try:
            from ms_llm.diagnose.engine import findings
            from ms_llm.report import write_report

            write_report([run.run_dir], os.path.join(run.run_dir, names.REPORT), diagnose=findings)
        except Exception as e:  # noqa: BLE001 (a report must never end a training run)
            run.log(f"warning: report.html not refreshed ({type(e).__name__}: {e})")
        self.last, self.cost = time.monotonic(), time.monotonic() - t0
        if isinstance(step, int):
            run.writer.write({"step": step, "event": "report", "duration_s": round(self.cost, 4)}, echo=False)
