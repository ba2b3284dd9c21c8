"""Running trials: each an `ms-llm train` subprocess, K at a time, each pinned to its share of the cores; their
metrics.jsonl watched while they run; a diverging trial (or, with successive halving, one clearly behind) sent
SIGTERM, which makes the trainer finish the step, save a checkpoint, write a `preempted` record and exit 0.

An interrupted sweep (Ctrl-C, SIGTERM) stops its running trials the same way, so each leaves a checkpoint to
resume from. Trials run in their own session: a Ctrl-C at the terminal reaches the sweep only, and the sweep
sends each trial exactly one SIGTERM (a second one would abort the trial without its checkpoint). If the sweep
itself is killed (-9), the kernel sends each trial SIGTERM (PR_SET_PDEATHSIG), so none trains on unwatched.
"""
import os
import shutil
import signal
import subprocess
import time

from ms_llm.tune.sweep import trial as tr
from ms_llm.tune.sweep.results import trial_result
from ms_llm.tune.sweep.progress import MetricsView, behind, divergence, last_step, rung_steps, rung_value
from ms_llm.rundir import names

POLL_S = 1.0


class SweepInterrupted(Exception):
    pass


class Running:
    def __init__(self, trial, proc, slot, resumed, log_path):
        self.trial, self.proc, self.slot, self.resumed, self.log_path = trial, proc, slot, resumed, log_path
        self.t0 = time.monotonic()
        self.view = MetricsView(trial.run_dir)
        self.stop = None  # {"reason", "detail", "step"} once the sweep decided to stop it
        self.signals = 0  # SIGTERMs sent: the trainer saves on the first, aborts on the second
        self.rungs = set()


class CatchesStopSignals:
    """A context in which SIGINT and SIGTERM go to `self.on_signal` (between child processes too); the previous
    handlers come back on exit."""

    def __enter__(self):
        self.previous = {s: signal.signal(s, self.on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc):
        for s, h in self.previous.items():
            signal.signal(s, h)
        return False


class Runner(CatchesStopSignals):
    def __init__(self, spec, sweep_dir, parallel, echo, on_result=None):
        self.spec, self.echo, self.on_result = spec, echo, on_result or (lambda rec: None)
        self.trials_dir = os.path.join(sweep_dir, "trials")
        self.logs_dir = os.path.join(sweep_dir, "logs")
        self.aside_dir = os.path.join(sweep_dir, "interrupted")
        self.slots = core_slots(parallel)
        self.records = {}  # trial name -> sweep.json record
        self.attempted = set()  # trials started by this process (a failure is not retried until the next resume)
        self.rung_values = {}  # rung step -> {trial name: value}
        self.failures = {}  # trial name -> marker of a trial that failed before creating its run directory
        self.interrupted = 0  # signals received: 1 stops the trials with a checkpoint, 2 aborts them

    # -- what the strategies call -----------------------------------------------------------------------------

    def run_points(self, points):
        """Run (or reuse) the trials at `points` (dicts of varied values); their records, in the same order."""
        trials = [tr.make_trial(self.spec, p, self.trials_dir) for p in points]
        todo, seen = [], set()
        for t in trials:
            if t.name in seen:
                continue
            seen.add(t.name)
            st = tr.status(t.run_dir)
            if st in ("finished", "stopped") or (st == "failed" and t.name in self.attempted):
                if t.name not in self.records:
                    self.echo(f"trial {t.name}: {st} earlier, not run again")
                    self.record(t)
            else:
                todo.append(t)
        self.pool(todo)
        return [self.records[t.name] for t in trials]

    def record(self, t):
        rec = trial_result(t.run_dir, t.values, self.spec.metric)
        if t.name in self.failures and rec["status"] == "new":
            f = self.failures[t.name]
            rec.update(status="failed", stop_reason=f["failed"]["error"], wall_s=f["wall_s"])
        self.records[t.name] = rec
        if os.path.isfile(os.path.join(t.run_dir, names.METRICS)):
            view = MetricsView(t.run_dir).refresh()
            for rung in rung_steps(self.spec.steps):
                v = rung_value(view, rung) if view else None
                if v is not None:
                    self.rung_values.setdefault(rung, {})[t.name] = v
        self.on_result(rec)
        return rec

    # -- the pool -----------------------------------------------------------------------------------------------

    def pool(self, todo):
        pending, running, free = list(todo), {}, list(range(len(self.slots)))
        while pending or running:
            if self.interrupted:
                for r in running.values():
                    self.signal(r, times=min(self.interrupted, 2))
                pending = []
            while pending and free:
                t = pending.pop(0)
                slot = free.pop(0)
                running[slot] = self.start(t, slot)
            time.sleep(POLL_S if running else 0)
            for slot, r in list(running.items()):
                code = r.proc.poll()
                if code is None:
                    if not self.interrupted:
                        self.watch(r)
                    continue
                del running[slot]
                free.append(slot)
                self.finish(r, code)
        if self.interrupted:
            raise SweepInterrupted()

    def on_signal(self, signum, frame):
        self.interrupted += 1
        if self.interrupted == 1:
            self.echo(f"\nsweep: {signal.Signals(signum).name} received: the running trial(s) finish their step, save "
                      f"a checkpoint and stop (send it again to abort them without one)")
        else:
            self.echo("sweep: second signal: aborting the running trial(s) now")

    def start(self, t, slot):
        st = tr.status(t.run_dir)
        if st in ("partial", "failed"):  # started, never checkpointed: nothing to resume; kept aside, not deleted
            os.makedirs(self.aside_dir, exist_ok=True)
            k = 1
            while os.path.exists(os.path.join(self.aside_dir, f"{t.name}-{k}")):
                k += 1
            dest = os.path.join(self.aside_dir, f"{t.name}-{k}")
            shutil.move(t.run_dir, dest)
            self.echo(f"trial {t.name}: an earlier attempt stopped before its first checkpoint; moved to {dest}, "
                      f"starting again")
        resume = st == "resumable"
        cores = self.slots[slot]
        extra = []
        if len(self.slots) > 1 and not any(o.startswith("context.num_threads=") for o in t.overrides):
            extra = ["--set", f"context.num_threads={len(cores)}"]  # MindSpore's pool: the trial's share of the cores
        cmd = tr.local_command(self.spec, t, resume)
        cmd = cmd[:cmd.index("--run-dir")] + extra + cmd[cmd.index("--run-dir"):]
        os.makedirs(self.logs_dir, exist_ok=True)
        os.makedirs(self.trials_dir, exist_ok=True)
        log_path = os.path.join(self.logs_dir, f"{t.name}.log")
        env = dict(os.environ, GLOG_v=os.environ.get("GLOG_v", "3"))
        if len(self.slots) > 1:
            env.setdefault("DEVICE_ID", str(slot))  # on Ascend/GPU each parallel trial gets its own device
        with open(log_path, "a", encoding="utf-8") as log:
            log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n")
            log.flush()
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                    preexec_fn=child_setup(cores if len(self.slots) > 1 else None))
        self.attempted.add(t.name)
        where = f" on cores {','.join(map(str, cores))}" if len(self.slots) > 1 else ""
        self.echo(f"trial {t.name}: {'resuming from its checkpoint' if resume else 'started'}{where} (log {log_path})")
        return Running(t, proc, slot, resume, log_path)

    def watch(self, r):
        """Stop a running trial that diverged (diagnose's rule) or, with halving, fell clearly behind."""
        if r.signals:
            return
        run = r.view.refresh()
        if run is None or not run.train:
            return
        step = last_step(run)
        if step >= self.spec.steps:
            return  # past its last step: stopping it now would only cost the final evaluation
        found = divergence(run)
        if found is not None:
            self.stop(r, "diverged", found.symptom, step)
            return
        for rung in rung_steps(self.spec.steps):
            if rung in r.rungs:
                continue
            v = rung_value(run, rung)
            if v is None:
                continue
            r.rungs.add(rung)
            values = self.rung_values.setdefault(rung, {})
            others = [x for name, x in values.items() if name != r.trial.name]
            values[r.trial.name] = v
            verdict = behind(v, others) if self.spec.halving else None
            if verdict:
                self.stop(r, "behind", f"successive halving at step {rung}: {verdict}", step)
                return

    def stop(self, r, reason, detail, step):
        r.stop = {"reason": reason, "detail": detail, "detected_at_step": step}
        self.echo(f"trial {r.trial.name}: stopping early at step ~{step}: {detail}")
        self.signal(r)

    def signal(self, r, times=1):
        """Bring the trial's SIGTERM count up to `times` (never more: each one means something to the trainer)."""
        while r.signals < times:
            r.signals += 1
            try:
                r.proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                return

    def finish(self, r, code):
        t, wall = r.trial, time.monotonic() - r.t0
        marker = tr.read_marker(t.run_dir)
        marker.update(values=t.values, attempts=marker.get("attempts", 0) + 1,
                      wall_s=round(marker.get("wall_s", 0.0) + wall, 1), failed=None)
        if r.stop:
            view = MetricsView(t.run_dir).refresh()
            from ms_llm.tune.sweep.results import stopped_step

            r.stop["step"] = stopped_step(view) if view else r.stop["detected_at_step"]
            marker["stop"] = r.stop
        elif code != 0 and not (self.interrupted and r.signals):
            marker["failed"] = {"exit_code": code, "error": last_error(r.log_path), "log": r.log_path}
        tr.write_marker(t.run_dir, marker)
        if marker.get("failed") and not os.path.isdir(t.run_dir):  # refused before the run directory existed
            self.failures[t.name] = marker
        rec = self.record(t)
        if r.stop:
            self.echo(f"trial {t.name}: stopped at step {r.stop['step']} ({r.stop['reason']}) after {wall:.0f} s")
        elif marker.get("failed"):
            self.echo(f"trial {t.name}: failed (exit code {code}) after {wall:.0f} s: {marker['failed']['error']} "
                      f"(log {r.log_path})")
        elif rec["status"] != "finished":
            self.echo(f"trial {t.name}: interrupted at step {rec['steps']} after {wall:.0f} s; it resumes from its "
                      f"checkpoint when the sweep is run again")
        else:
            m = rec["metric"]
            self.echo(f"trial {t.name}: done in {wall:.0f} s, {self.spec.metric} "
                      f"{f'{m:.4f}' if m is not None else 'n/a'}" + (" (diverged)" if rec["diverged"] else ""))


def core_slots(parallel):
    """The cores of each of `parallel` slots: consecutive, disjoint shares of the cores this process may use."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux: no pinning, the thread count still divides the machine
        cores = list(range(os.cpu_count() or 1))
    n = len(cores)
    if parallel <= n:
        return [cores[i * n // parallel:(i + 1) * n // parallel] for i in range(parallel)]
    return [[cores[i % n]] for i in range(parallel)]  # more trials than cores: one core each, shared


def child_setup(cores):
    def setup():
        try:
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except OSError:
            pass
        if cores:
            try:
                os.sched_setaffinity(0, cores)
            except (AttributeError, OSError):
                pass
    return setup


def last_error(log_path):
    """The trial's error paragraph (the CLI prints `error: ...`), else its last line."""
    try:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            lines = [ln.rstrip() for ln in f if ln.strip()]
    except OSError:
        return "no log"
    errors = [ln for ln in lines if ln.startswith(("error:", "Traceback")) or "Error" in ln.split(":")[0]]
    return (errors[-1] if errors else lines[-1] if lines else "no output")[:300]
