"""Running one rung: `ms-llm train` in a process of its own (msrun with one worker per rank for a multi-rank rung),
its console output in LADDER/logs/<rung>.log, a progress line with the rung's and the whole ladder's ETA while it
trains, and Ctrl-C handled as the sweep does: the rung gets one SIGTERM (the trainer finishes the step, saves a
checkpoint and exits), so the next `ms-llm debug ladder` resumes it.

A process of its own per rung, not the ladder's: each rung's peak memory is its own process's, a rung that crashes
does not take the ladder with it, and every rung starts from a fresh MindSpore context.
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

from ms_llm.tune.ladder.plan import train_command
from ms_llm.tune.sweep.runner import CatchesStopSignals, child_setup, last_error
from ms_llm.tune.sweep.progress import MetricsView, last_step

POLL_S = 1.0
PROGRESS_S = 20.0


def repo_train_py():
    """train.py, the msrun entry, beside the ms_llm package (a source checkout or an editable install)."""
    import ms_llm

    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(ms_llm.__file__))), "train.py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clock(seconds):
    if seconds is None:
        return "?"
    m, s = divmod(int(round(max(0.0, seconds))), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Interrupted(Exception):
    pass


class Launcher(CatchesStopSignals):
    """Runs rungs one at a time; `eta(rung_left_s)` is the ladder's estimate of everything after the rung."""

    def __init__(self, logs_dir, echo, what="ladder", unit="rung"):
        self.logs_dir, self.echo, self.what, self.unit = logs_dir, echo, what, unit
        self.proc, self.signals, self.interrupted = None, 0, 0

    def on_signal(self, signum, frame):
        self.interrupted += 1
        if self.interrupted == 1:
            self.echo(f"\n{self.what}: {signal.Signals(signum).name} received: the running {self.unit} finishes its "
                      f"step, saves a checkpoint and stops (send it again to abort it without one)")
        else:
            self.echo(f"{self.what}: second signal: aborting the running {self.unit} now")
        self.forward()

    def forward(self):
        """Bring the rung's SIGTERM count up to the ladder's signal count (at most 2: the trainer saves on the
        first, aborts on the second). The whole process group: under msrun every worker must see it."""
        while self.proc is not None and self.proc.poll() is None and self.signals < min(self.interrupted, 2):
            self.signals += 1
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                return

    def run(self, rung_name, config_path, run_dir, ranks, resume, steps, eta):
        """Train one rung; returns (exit code, wall seconds, log path, the error paragraph or None)."""
        if self.interrupted:
            raise Interrupted()
        os.makedirs(self.logs_dir, exist_ok=True)
        log_path = os.path.join(self.logs_dir, f"{rung_name}.log")
        msrun_logs = os.path.join(self.logs_dir, f"{rung_name}-msrun")
        if ranks == 1:
            cmd = [sys.executable, "-m", "ms_llm.cli"] + train_command(config_path, run_dir, 1, resume)[1:]
        else:
            cmd = train_command(config_path, run_dir, ranks, resume, local=True, log_dir=msrun_logs,
                                port=free_port(), train_py=repo_train_py())
        env = dict(os.environ, GLOG_v=os.environ.get("GLOG_v", "3"),
                   PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
        with open(log_path, "a", encoding="utf-8") as log:
            log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n")
            log.flush()
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                         preexec_fn=child_setup(None))
        self.signals = 0
        t0 = last_print = time.monotonic()
        view = MetricsView(run_dir)
        try:
            while self.proc.poll() is None:
                time.sleep(POLL_S)
                self.forward()
                if time.monotonic() - last_print >= PROGRESS_S:
                    last_print = time.monotonic()
                    self.progress(view, steps, time.monotonic() - t0, eta)
            code = self.proc.returncode
        finally:
            self.proc = None
        wall = time.monotonic() - t0
        error = None
        if code != 0:
            error = rung_error(log_path, msrun_logs if ranks > 1 else None)
        if self.interrupted:
            raise Interrupted()
        return code, wall, log_path, error

    def progress(self, view, steps, elapsed, eta):
        run = view.refresh()
        step = last_step(run) if run is not None and run.train else 0
        last = run.train[-1] if step else {}
        if step:  # the trainer's own estimate of what is left of the rung, plus its final evaluation and save
            left = last.get("eta_s") if step > 1 else None  # the first step (the compile) is not timed
            where = f"step {step}/{steps}"
        else:
            left, where = None, "starting (compiling)"
        rest = eta(left, elapsed)
        self.echo(f"  {where}, {clock(elapsed)} so far, {self.unit} ETA {clock(left) if left is not None else '?'}"
                  + (f"; {self.what} ETA ~{clock(rest)}" if rest is not None else ""))


def rung_error(log_path, msrun_logs=None):
    """The error paragraph of a failed rung: a worker's under msrun (rank 0 first), else the rung's log."""
    if msrun_logs and os.path.isdir(msrun_logs):
        for name in sorted(f for f in os.listdir(msrun_logs) if f.startswith("worker_")):
            err = last_error(os.path.join(msrun_logs, name))
            if err.startswith("error:") or "Error" in err:
                return err
    return last_error(log_path)


def move_aside(run_dir, aside_dir, echo):
    """A rung that started and stopped before its first checkpoint: kept under interrupted/, never deleted."""
    os.makedirs(aside_dir, exist_ok=True)
    name = os.path.basename(run_dir)
    k = 1
    while os.path.exists(os.path.join(aside_dir, f"{name}-{k}")):
        k += 1
    dest = os.path.join(aside_dir, f"{name}-{k}")
    shutil.move(run_dir, dest)
    echo(f"  an earlier attempt stopped before its first checkpoint; moved to {dest}, starting again")
    return dest
