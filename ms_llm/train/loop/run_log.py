"""Where a run's lines go: the console, and the run directory's logs/.

Rank 0's console is also written to `logs/train.log`, and every rank writes its own `logs/rank_<r>.log`
(other ranks print to msrun's worker log as before). Lines said before the run directory exists are kept and
written once it does. Progress: a tqdm bar on a terminal; otherwise (msrun, ModelArts, a redirected run) a plain
progress line every `progress_s` seconds with the ETA."""
import os
import sys
import time

from ms_llm.monitor.metrics import format_duration
from ms_llm.rundir import names


class RunLog:
    def __init__(self, echo, rank, progress_s=30.0):
        self.rank, self.progress_s = rank, progress_s
        self.echo = echo if rank == 0 else (lambda msg: print(f"[rank {rank}] {msg}", flush=True))
        self.files, self.early = [], []
        self.bar = None
        self.last_progress = time.monotonic()

    def __call__(self, msg):
        (self.bar.write if self.bar is not None else self.echo)(msg)
        self._to_files(msg)

    def to_files(self, msg):
        """Only into logs/ (e.g. the traceback behind the one-paragraph error the console shows)."""
        self._to_files(msg)

    def _to_files(self, msg):
        if self.files:
            for f in self.files:
                f.write(msg + "\n")
                f.flush()
        else:
            self.early.append(msg)

    def open_files(self, run_dir):
        logs = os.path.join(run_dir, names.LOGS)
        os.makedirs(logs, exist_ok=True)
        files = [names.rank_log(self.rank)] + ([names.TRAIN_LOG] if self.rank == 0 else [])
        self.files = [open(os.path.join(logs, n), "a", encoding="utf-8") for n in files]
        for msg in self.early:
            self._to_files(msg)
        self.early = []

    def start_progress(self, total, start, enabled):
        """A tqdm bar when rank 0 writes to a terminal and the config allows it; else plain progress lines."""
        if enabled and self.rank == 0 and sys.stdout.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=start, unit="step", dynamic_ncols=True, leave=False)

    def progress(self, done, total, record_eta=None, step_s=None):
        if self.bar is not None:
            self.bar.update(1)
            return
        now = time.monotonic()
        if self.rank != 0 or now - self.last_progress < self.progress_s or step_s is None:
            return
        self.last_progress = now
        eta = step_s * (total - done)
        self.echo(f"progress: step {done}/{total} ({100 * done / total:.0f}%), {1000 * step_s:.0f} ms/step, "
                  f"ETA {format_duration(eta)}")

    def close(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        for f in self.files:
            f.close()
        self.files = []
