"""SIGTERM / SIGINT / SIGHUP during training: finish the step, save, log, exit 0. A second signal aborts at once.

Cluster schedulers (ModelArts, Slurm, Kubernetes) send SIGTERM and wait a grace period before SIGKILL;
the first signal only sets a flag the training loop reads after each step. Checkpoint writes are atomic,
so aborting on the second signal can leave a temporary file but never a damaged checkpoint.

SIGHUP is a closed terminal (an ssh session that dropped, a closed window): the run stops as for SIGTERM, and since
the terminal is gone, its console output goes to /dev/null from then on (a write to a hung-up terminal fails with
EIO, which would end the run before its checkpoint); the run directory's logs/ keep every line.
"""
import os
import signal


class Preemption:
    SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

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
        if signum == signal.SIGHUP:
            detach_from_terminal()
        self.log(f"received {signal.Signals(signum).name}: finishing this step, then saving and exiting "
                 f"(send it again to abort immediately)")

    @property
    def requested(self):
        return self.signum is not None


def detach_from_terminal():
    """Point stdout and stderr at /dev/null (the terminal hung up: writing to it would fail)."""
    import sys

    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    for fd in (1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
