"""Why a run ends before train.max_steps, decided and reported in one place.

- A signal (SIGTERM, SIGINT, SIGHUP: ms_llm/train/loop/preemption.py), a hook's `stop_reason` (train.stop_on) or
  train.stop_at_step: the step finishes, a checkpoint is saved, the stop is recorded and `run` returns.
- Updates that are all being skipped (ms_llm/train/loop/skipped_steps.py), read back every few steps: a checkpoint
  is saved, the halt recorded, and RunHalted raised with what was tried and what to do next.
- A background checkpoint save that failed: its error is raised at the step after.

Every rank stops at the same step: a stop any rank asks for stops them all.
"""
from ms_llm.train.loop.preemption import Preemption
from ms_llm.train.loop.skipped_steps import RunHalted, SkippedSteps
from ms_llm.train.setup.context import all_ranks_ok


class Stop:
    def __init__(self, trun, saver, checkpoint):
        """`checkpoint(step)`: save the step's checkpoint (the trainer's `save`)."""
        s = trun.session
        self.trun, self.saver, self.checkpoint, self.rt = trun, saver, checkpoint, s.rt
        self.stop_at_step = s.cfg.train.stop_at_step
        self.anomaly_guard = s.cfg.train.anomaly is not None
        self.skips = SkippedSteps(s.cfg.precision)
        self.skips.resume(float(s.step_fn.state.loss_scale.asnumpy()))
        self.unchecked = []  # (step, StepOutput) whose codes are not yet read back from the device
        self.preemption = Preemption(trun.log)
        self.step = None  # the step the run stopped after, once it has

    def __enter__(self):
        self.preemption.__enter__()
        return self

    def __exit__(self, *exc):
        return self.preemption.__exit__(*exc)

    def after_step(self, done, out):
        self.unchecked.append((done, out))
        if self.saver.error is not None:  # a background save failed: training stops here, with its error
            self.saver.check()

    def halt_if_stuck(self, done):
        """Stop a run whose updates are all being skipped: save, record, explain."""
        halt, self.unchecked = self.skips.check(self.unchecked), []
        if halt:
            self.checkpoint(done)
            self.saver.close()
            self.trun.writer.write({"step": done, "event": "halted", "reason": halt, "since_step": self.skips.first})
            raise RunHalted(halted_message(done, self.skips, halt, self.trun.run_dir, self.saver, self.anomaly_guard))

    def due(self, done):
        """Whether the run stops after step `done` (with a checkpoint). Asked every step, of every rank."""
        asked = self.preemption.signum is not None or self.trun.stop_reason is not None
        if agreed(self.rt, asked) or done == self.stop_at_step:
            self.step = done
        return self.step is not None

    def report(self):
        """The stop's event in metrics.jsonl and its line on the console."""
        done, signalled, reason = self.step, self.preemption.signum is not None, self.trun.stop_reason
        if reason is not None and not signalled:  # a hook's (train.stop_on)
            self.trun.writer.write({"step": done, "event": "stop_on", "reason": reason}, echo=False)
            self.trun.log(f"stopped at step {done}: {reason}; checkpoint saved.")
            return
        self.trun.writer.write({"step": done, "event": "preempted" if signalled else "stop_at_step",
                                "signal": self.preemption.signum or 0})
        self.trun.log(f"stopped at step {done} ({'signal' if signalled else 'train.stop_at_step'}); "
                      f"checkpoint saved. Resume with --resume (or checkpoint.auto_resume: true).")


def agreed(rt, requested):
    """All ranks stop at the same step: a stop any rank asks for (a signal, a hook's stop_reason) stops every rank."""
    if rt.world_size == 1:
        return requested
    return not all_ranks_ok(rt, not requested)


def halted_message(step, skips, reason, run_dir, saver, anomaly_guard):
    tried = "dynamic loss scaling" if skips.dynamic else "skipping the non-finite updates"
    if anomaly_guard:
        tried += " and the anomaly guard's rollbacks"
    return (f"training stopped at step {step}: every update since step {skips.first} was skipped; {reason}. Tried: "
            f"{tried}. No update was applied after step {skips.first - 1}, so the checkpoint just saved "
            f"({saver.last_path or 'see ' + run_dir + '/checkpoints'}) holds the last good weights. Find the first "
            f"module that goes non-finite with `ms-llm debug nan --run-dir {run_dir} --step {step}` (it replays the "
            f"next step from that checkpoint); docs/debugging.md walks the rest.")
