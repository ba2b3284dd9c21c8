"""Where a logged interval goes: the console line, metrics.jsonl, MindSpore Insight summaries and (optionally)
TensorBoard event files and experiment trackers (monitor.trackers: ms_llm/monitor/trackers/)."""
import json
import math
import os
import threading
import time

from ms_llm.rundir import names

SUMMARY_SCALARS = ("loss", "lr", "grad_norm", "loss_scale", "tokens_per_s", "mfu", "mem_gib", "val_loss", "aux_loss")
ROUTER_PREFIX = "moe/"  # per-layer router health of an MoE run (ms_llm.train.loop.router_stats): also scalars


def format_duration(s):
    s = int(max(0, s))
    return f"{s // 3600}h{s // 60 % 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def format_line(r, max_steps):
    """`step 200/2000 | loss 2.4312 | lr 9.80e-04 | ... | data 2%` from a metrics record."""
    if "val_loss" in r:
        return f"step {r['step']}/{max_steps} | val_loss {r['val_loss']:.4f} | {r['val_tokens']:,} tokens"
    if "event" in r:
        return f"step {r['step']}/{max_steps} | " + " | ".join(f"{k} {v}" for k, v in r.items()
                                                        if k not in ("step", "time", "elapsed_s"))
    if "tasks" in r:  # lm-eval tasks evaluated during training (ms_llm.eval.hook)
        return f"step {r['step']}/{max_steps} | " + " | ".join(task_summary(r, t) for t in r["tasks"]) + \
            f" | {r.get('duration_s', 0):.1f} s"
    parts = [f"step {r['step']}/{max_steps}", f"loss {r['loss']:.4f}", f"lr {r['lr']:.2e}",
             f"grad_norm {r['grad_norm']:.3f}", f"scale {r['loss_scale']:g}", f"skipped {r['skipped']}",
             f"{r['tokens_per_s']:,.0f} tok/s", f"mfu {100 * r['mfu']:.1f}%", f"mem {r['mem_gib']:.2f} GiB",
             f"data {100 * r['data_wait_frac']:.0f}%"]
    if r.get("ms_per_step"):
        parts += [f"{r['ms_per_step']:,.0f} ms/step", f"ETA {format_duration(r['eta_s'])}"]
    if isinstance(r.get("aux_loss"), (int, float)):
        parts.append(f"aux {r['aux_loss']:.4f}")
    return " | ".join(parts)


def task_summary(r, task):
    """`shakespeare_cloze acc 0.4120 acc_norm 0.4120 (chance 0.25)`: a task's scores in a task record."""
    scores = [f"{k.split('/', 1)[1]} {v:.4f}" for k, v in r.items() if k.startswith(task + "/")
              and not k.endswith(("/chance", "/docs")) and isinstance(v, (int, float))]
    chance = r.get(f"{task}/chance")
    return f"{task} {' '.join(scores[:4])}" + (f" (chance {chance:.2f})" if chance is not None else "")


def scalar_values(record):
    """{tag: value} of a record for Insight / TensorBoard: the SUMMARY_SCALARS, an MoE run's router fields
    (moe/<layer>/<field>; each expert's share as moe/<layer>/share/<expert>), and a task record's scores."""
    out = {k: record[k] for k in SUMMARY_SCALARS
           if isinstance(record.get(k), (int, float)) and math.isfinite(record[k])}
    for task in record.get("tasks") or ():  # lm-eval scores: <task>/<metric> (and its chance level)
        out.update({k: v for k, v in record.items() if k.startswith(task + "/") and not k.endswith("/docs")
                    and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)})
    for key, value in record.items():
        if not key.startswith(ROUTER_PREFIX):
            continue
        if isinstance(value, list):
            out.update({f"{key}/{i}": v for i, v in enumerate(value) if isinstance(v, (int, float))})
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[key] = value
    return out


def _clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # JSON has no NaN/Inf; keep them readable instead of invalid
    return v


class MetricsWriter:
    """Writes records on rank 0 only; other ranks print their lines to their own (msrun) log."""

    def __init__(self, run_dir, rank, max_steps, monitor=None, echo=print, t_start=None):
        """`monitor`: the config's monitor section (summary, tensorboard switches); None: neither. `t_start`: the
        Unix time `elapsed_s` counts from (this process's start of training; default: now)."""
        self.rank, self.max_steps, self.echo = rank, max_steps, echo
        self.t_start = time.time() if t_start is None else t_start
        self.jsonl = open(os.path.join(run_dir, names.METRICS), "a", encoding="utf-8") if rank == 0 else None
        self.sinks = []  # scalar writers: .scalars(step, {name: value}), .close()
        if rank == 0 and monitor is not None and monitor.summary:
            from ms_llm.monitor.summary import InsightSummary

            self.sinks.append(InsightSummary(os.path.join(run_dir, names.SUMMARY)))
        if rank == 0 and monitor is not None and monitor.tensorboard:
            from ms_llm.monitor.tensorboard import TensorBoardWriter

            self.sinks.append(TensorBoardWriter(os.path.join(run_dir, names.TENSORBOARD)))
        self.trackers = []  # each gets every record, in its own thread (.record(record), .close())
        if rank == 0 and monitor is not None and monitor.trackers:
            from ms_llm.monitor.trackers import open_trackers

            self.trackers = open_trackers(monitor.trackers, run_dir, monitor.tracker_project, log=echo)
        self.lock = threading.Lock()  # records also come from the upload thread (checkpoint/remote/uploads.py)

    def write(self, record, echo=True):
        """One record: a log interval, an evaluation or an event. Each carries `time` (Unix seconds) and
        `elapsed_s` (since this process started training), stamped here when the caller did not."""
        if "time" not in record:
            now = time.time()
            record = {**record, "time": round(now, 3), "elapsed_s": round(now - self.t_start, 3)}
        if echo:
            self.echo(format_line(record, self.max_steps) if "step" in record else json.dumps(record))
        with self.lock:
            if self.jsonl is None:
                return
            self.jsonl.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")
            self.jsonl.flush()
            if self.sinks and "step" in record:
                scalars = scalar_values(record)
                if scalars:
                    for sink in self.sinks:
                        sink.scalars(record["step"], scalars)
            for tracker in self.trackers:
                tracker.record(dict(record))

    def close(self):
        """Close the files; the trackers then send what is queued, the report and the run's files (in that
        order: the report is written by the last hook, before the writer closes)."""
        with self.lock:
            if self.jsonl is not None:
                self.jsonl.close()
                self.jsonl = None
            for sink in self.sinks:
                sink.close()
            self.sinks = []
            trackers, self.trackers = self.trackers, []
        for tracker in trackers:
            tracker.close()
