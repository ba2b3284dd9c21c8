"""What the loop does on which step, in one object: `Cadence.at(done)` after each optimizer step says whether this
step logs, evaluates, saves and reads the steps' update codes back (the halt check). The stop is not a cadence: it is
decided every step (ms_llm/train/loop/stop.py); the profiler's window is its hook's (ms_llm/monitor/profile.py)."""
from typing import NamedTuple

HALT_CHECK_EVERY = 8  # steps between reads of the update codes at most: each read is a host sync


class Due(NamedTuple):
    halt_check: bool  # read back the codes of the steps since the last check (ms_llm.train.loop.skipped_steps)
    log: bool  # write the interval's metrics record
    eval: bool  # validation loss (the last step evaluates after the loop)
    save: bool  # a checkpoint (the last step saves after the loop)


class Cadence:
    def __init__(self, train, checkpoint):
        self.max_steps = train.max_steps
        self.log_every, self.eval_every = train.log_interval, train.eval_interval
        self.halt_every = min(train.log_interval, HALT_CHECK_EVERY)
        self.save_every = checkpoint.save_interval

    def at(self, done):
        """What is due after optimizer step `done` (1-based)."""
        last = done == self.max_steps
        return Due(halt_check=done % self.halt_every == 0 or last,
                   log=done % self.log_every == 0 or last,
                   eval=bool(self.eval_every) and done % self.eval_every == 0 and not last,
                   save=bool(self.save_every) and done % self.save_every == 0 and not last)
