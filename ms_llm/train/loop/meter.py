"""The timing of one log interval: step time, tokens/s, MFU, data wait, elapsed time and ETA.

Evaluations and checkpoint saves are paused out of the interval, so tokens/s measures training alone; the first
step of a process (which compiles the graphs) is timed on its own and reported as compile_s, with the time from the
start of the process to the start of training (startup_s) and, on a fresh run, the loss of that first step
(initial_loss: computed before any update). Each record also carries the interval's measured time (interval_s: the
steps, their data wait and the hooks they call) and the seconds the hooks took in it (hooks_s, per hook), so that
where a run's wall time went can be accounted from metrics.jsonl (ms_llm.rundir.walltime)."""
import contextlib
import time

import numpy as np


def as_floats(out):
    return tuple(x if isinstance(x, (int, float)) else float(x.asnumpy()) for x in out)


class IntervalMeter:
    def __init__(self, tokens_per_step, flops_per_token, peak_flops, world_size, start_step, max_steps, t_start=None):
        self.tokens_per_step, self.flops_per_token = tokens_per_step, flops_per_token
        self.peak_flops, self.world_size = peak_flops, world_size
        self.start_step, self.max_steps = start_step, max_steps
        self.t_start = time.time() if t_start is None else t_start  # elapsed_s counts from here
        self.pending = []  # step outputs of the interval (tensors until the interval's one host sync)
        self.skipped = 0  # skipped updates since the run began (carried through checkpoints)
        self.compile_s = None
        self.startup_s = None  # seconds from entering the trainer to the start of training (this process)
        self.initial_loss = None  # the first step's loss on a fresh run: before any update
        self.last_step_s = None
        self.begin()

    def begin(self):
        self.t0, self.paused_s, self.wait_s, self.timed = time.perf_counter(), 0.0, 0.0, 0
        self.hook_s = {}  # hook class name -> seconds spent in its calls during the interval

    @contextlib.contextmanager
    def waiting(self):
        """Around fetching a step's batches: the data share of step time."""
        t = time.perf_counter()
        yield
        self.wait_s += time.perf_counter() - t

    @contextlib.contextmanager
    def paused(self):
        """Around work that is not training (evaluation, checkpoints): left out of the interval's time."""
        t = time.perf_counter()
        yield
        self.paused_s += time.perf_counter() - t

    def first_step(self, compile_s, initial_loss=None):
        self.compile_s = compile_s
        self.initial_loss = initial_loss
        self.begin()

    def add(self, out, timed=True):
        self.pending.append(out)
        self.timed += timed

    def step_s(self):
        """Seconds per step so far in this interval (the last interval's before any step was timed)."""
        elapsed = time.perf_counter() - self.t0 - self.paused_s
        return elapsed / self.timed if self.timed else self.last_step_s

    def record(self, step, lr, memory_gib):
        """The interval's metrics record (the only host sync in the interval); starts the next interval."""
        rows = [as_floats(o) for o in self.pending]
        clean = [r[1] for r in rows if not r[2]]
        n_skipped = int(sum(bool(r[2]) for r in rows))  # code 1: non-finite gradients, 2: anomaly guard
        self.skipped += n_skipped
        elapsed = time.perf_counter() - self.t0 - self.paused_s
        step_s = elapsed / self.timed if self.timed and elapsed > 0 else 0.0
        self.last_step_s = step_s or self.last_step_s
        tok_s = self.tokens_per_step / step_s if step_s else 0.0
        now = time.time()
        record = {"step": step, "loss": float(np.mean([r[0] for r in rows])), "lr": lr,
                  "grad_norm": float(np.mean(clean)) if clean else float("nan"), "loss_scale": rows[-1][3],
                  "skipped_interval": n_skipped, "skipped": self.skipped, "tokens_per_s": tok_s,
                  "mfu": self.flops_per_token * tok_s / self.world_size / self.peak_flops,
                  "mem_gib": memory_gib,
                  "data_wait_frac": min(1.0, self.wait_s / elapsed) if elapsed > 0 else 0.0,
                  "ms_per_step": 1000 * step_s, "eta_s": step_s * (self.max_steps - step),
                  "time": round(now, 3), "elapsed_s": round(now - self.t_start, 3), "interval_s": round(elapsed, 4)}
        hooks = {k: round(v, 4) for k, v in self.hook_s.items() if v >= 1e-4}
        if hooks:
            record["hooks_s"] = hooks
        anomalies = int(sum(r[2] == 2 for r in rows))
        if anomalies:
            record["anomaly_skips"] = anomalies
        if self.compile_s is not None and step - self.start_step <= len(rows):
            record["compile_s"] = self.compile_s
            if self.startup_s is not None:
                record["startup_s"] = round(self.startup_s, 3)
            if self.initial_loss is not None:
                record["initial_loss"] = self.initial_loss
        self.pending.clear()
        self.begin()
        return record

    def host_state(self):
        """What a checkpoint keeps so that a resumed run logs exactly the lines an uninterrupted one would."""
        return {"skipped": self.skipped, "pending": [as_floats(o) for o in self.pending]}

    def restore(self, host):
        self.skipped = host.get("skipped", 0)
        self.pending = [tuple(x) for x in host.get("pending", [])]
