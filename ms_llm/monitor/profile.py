"""The profiler window (`monitor.profile`) and the Top-N operator table the tuning method starts from."""
import csv
import glob
import os


class ProfileWindow:
    """Collects a `mindspore.Profiler` trace for steps [start_step, stop_step) and prints the top operators."""

    def __init__(self, start_step, stop_step, output_dir, device_target, log=print, top=10):
        self.start, self.stop, self.output_dir = start_step, stop_step, output_dir
        self.device_target, self.log, self.top = device_target, log, top
        self.profiler = None
        self.table = None

    def before_step(self, step):
        """`step` is 0-based: the number of steps already done."""
        if step == self.start and self.profiler is None:
            import mindspore as ms
            from mindspore.profiler import ProfilerActivity

            activities = [ProfilerActivity.CPU]
            if self.device_target == "Ascend":
                activities.append(ProfilerActivity.NPU)
            elif self.device_target == "GPU":
                activities.append(ProfilerActivity.GPU)
            os.makedirs(self.output_dir, exist_ok=True)
            self.profiler = ms.Profiler(output_path=self.output_dir, activities=activities)
            self.log(f"profiler: recording steps {self.start + 1}..{self.stop} into {self.output_dir}")

    def after_step(self, step_done):
        if self.profiler is not None and step_done >= self.stop:
            self.finish(step_done - self.start)

    def finish(self, steps):
        if self.profiler is None:
            return
        self.profiler.stop()
        self.profiler.analyse()
        self.profiler = None
        rows = top_operators(self.output_dir, max(1, steps), self.top)
        self.table = rows
        if rows:
            self.log(format_top_table(rows, steps))
        else:
            self.log(f"profiler: trace written to {self.output_dir} (no operator statistics found to summarise)")


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
