"""SIGTERM / SIGINT during training: finish the step, save, log, exit 0. A second signal aborts at once.

Cluster schedulers (ModelArts, Slurm, Kubernetes) send SIGTERM and wait a grace period before SIGKILL;
the first signal only sets a flag the training loop reads after each step. Checkpoint writes are atomic,
so aborting on the second signal can leave a temporary file but never a damaged checkpoint.
"""
import os
import signal


class Preemption:
    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, log=print):
        self.log = log
        self.signum = None
        self._previous = {}

    def __enter__(self):
        for s in self.SIGNALS:
            try:
                self._previous[s] = signal.signal(s, self._handle)
            except ValueError:  # not the main thread: leave signals to the caller
                pass
        return self

    def __exit__(self, *exc):
        for s, h in self._previous.items():
            signal.signal(s, h)
        return False

    def _handle(self, signum, frame):
        if self.signum is not None:
            os._exit(128 + signum)  # second signal: stop now (saved checkpoints are complete or absent)
        self.signum = signum
        self.log(f"received {signal.Signals(signum).name}: finishing this step, then saving and exiting "
                 f"(send it again to abort immediately)")

    @property
    def requested(self):
        return self.signum is not None
