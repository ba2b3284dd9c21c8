"""The profiler window (`monitor.profile`) and the Top-N operator table the tuning method starts from."""
import csv
import glob
import os


class ProfileWindow:
    """A trainer hook: a `mindspore.profiler.profile` trace of steps [start_step, stop_step), the top-10 operator
    table at its end (printed and kept in run_info.json), and the window marked in the metrics
    (`profile_start` / `profile_stop` events) so that its slower steps are not read as an anomaly."""

    def __init__(self, profile_cfg, top=10):
        self.cfg, self.top = profile_cfg, top
        self.prof = self.table = self.output_dir = None
        self.started = 0

    def start(self, run):
        self.output_dir = self.cfg.output_dir or os.path.join(run.run_dir, "profile", f"rank_{run.session.rt.rank}")
        self.stop_step = min(self.cfg.stop_step, run.session.cfg.train.max_steps)

    def before_step(self, run, step, batches):
        if step != self.cfg.start_step or self.prof is not None:
            return
        from mindspore.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

        target = run.session.rt.device_target
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.NPU] if target == "Ascend" else
                                               [ProfilerActivity.GPU] if target == "GPU" else [])
        os.makedirs(self.output_dir, exist_ok=True)
        steps = self.stop_step - step
        self.prof = profile(activities=activities, schedule=schedule(wait=0, warmup=0, active=steps, repeat=1),
                            on_trace_ready=tensorboard_trace_handler(self.output_dir))
        self.prof.start()
        self.started, self.steps_seen = step, 0
        run.writer.write({"step": step, "event": "profile_start", "until_step": self.stop_step}, echo=False)
        run.log(f"profiler: recording steps {step + 1}..{self.stop_step} into {self.output_dir}")

    def after_step(self, run, step, out, batches):
        if self.prof is None:
            return
        self.prof.step()
        self.steps_seen += 1
        if step + 1 >= self.stop_step:
            self.end(run, step + 1)

    def finish(self, run):
        if self.prof is not None:  # the run ended inside the window
            self.end(run, self.started + self.steps_seen)
        if self.table:
            run.extra["profile_top_ops"] = [{"op": op, "ms_per_step": ms_, "calls_per_step": c, "share": sh}
                                            for op, ms_, c, sh in self.table]

    def end(self, run, done):
        self.prof.stop()
        self.prof = None
        steps = max(1, done - self.started)
        run.writer.write({"step": done, "event": "profile_stop", "steps": steps}, echo=False)
        rows = top_operators(self.output_dir, steps, self.top)
        self.table = rows
        if rows:
            run.log(format_top_table(rows, steps))
        else:
            run.log(f"profiler: trace written to {self.output_dir} (no operator statistics found to summarise)")


def top_operators(output_dir, steps, top=10):
    """[(op_type, ms_per_step, calls_per_step, share)] from the profiler's per-op-type statistics."""
    files = sorted(glob.glob(os.path.join(output_dir, "**", "op_statistic*.csv"), recursive=True)) or \
        sorted(glob.glob(os.path.join(output_dir, "**", "cpu_op_type_info_*.csv"), recursive=True))
    if not files:
        return []
    totals = {}
    with open(files[-1], newline="") as f:
        for r in csv.DictReader(f):
            op = r.get("op_type") or r.get("OP Type") or r.get("Type")
            t = float(r.get("total_compute_time") or r.get("Total Time(us)") or 0.0)
            if "Total Time(us)" in r:
                t /= 1000.0
            calls = float(r.get("type_occurrences") or r.get("Count") or 0.0)
            prev = totals.get(op, (0.0, 0.0))
            totals[op] = (prev[0] + t, prev[1] + calls)
    grand = sum(t for t, _ in totals.values()) or 1.0
    rows = sorted(((op, t / steps, c / steps, t / grand) for op, (t, c) in totals.items()), key=lambda r: -r[1])
    return rows[:top]


def format_top_table(rows, steps):
    lines = [f"top {len(rows)} operators over {steps} profiled steps (device time per step):",
             f"  {'operator':<26}{'ms/step':>9}{'calls/step':>12}{'share':>8}"]
    for op, ms_, calls, share in rows:
        lines.append(f"  {op:<26}{ms_:>9.2f}{calls:>12.0f}{100 * share:>7.1f}%")
    return "\n".join(lines)
