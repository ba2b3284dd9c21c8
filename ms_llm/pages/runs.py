"""A run directory read for the report: the parsed run (ms_llm.rundir.reader) plus telemetry, and its curves
as numpy arrays on a chosen x axis.

Runs made by older versions lack `time`, `ms_per_step` and event records; every accessor here returns an
empty curve for a missing field instead of failing, so a report of an old run simply has fewer panels.
"""
import os

import numpy as np

from ms_llm.rundir.reader import is_foreign_path, is_run_dir, load_run, read_jsonl
from ms_llm.rundir.walltime import TIMING_EVENTS
from ms_llm.errors import UserError
from ms_llm.rundir import names

ALIGNS = ("step", "tokens")


class RunData:
    def __init__(self, path):
        self.path = path
        if is_foreign_path(path):  # another framework's log or folder of worker logs (ms_llm.rundir.foreign)
            self.run = load_run(path)
            self.telemetry = []
            self._curves, self._tables, self._events = {}, {}, None
            return
        if not os.path.isdir(path):
            raise UserError(f"run directory '{path}' does not exist{' (it is a file)' if os.path.exists(path) else ''}."
                            f" Pass the folder a training run wrote (the --run-dir of 'ms-llm train'); "
                            f"'ms-llm runs' lists the runs under ./runs.")
        if not is_run_dir(path) and not os.path.isfile(os.path.join(path, names.METRICS)):
            raise UserError(f"'{path}' is not a run directory: it holds no config.yaml, run_info.json or "
                            f"metrics.jsonl. Pass the folder a training run wrote (the --run-dir of 'ms-llm train').")
        self.run = load_run(path, need_metrics=False)
        self.telemetry, bad = read_jsonl(os.path.join(path, names.TELEMETRY))
        self.run.bad_lines += bad
        self._curves = {}  # (key, records, factor) -> (steps, values): panels and event markers reuse curves
        self._tables = {}  # id(records) -> (steps, deduplicated records)
        self._events = None

    @property
    def name(self):
        return self.run.name

    @property
    def tokens_per_step(self):
        """Tokens consumed per optimizer step (global batch × sequence length), None when the config lacks them."""
        if not (self.run.given("train.global_batch_size") and self.run.given("model.seq_length")):
            return None
        return self.run.cfg("train.global_batch_size") * self.run.cfg("model.seq_length")

    def scale(self, align):
        """Factor from steps to the x axis: 1 for steps, tokens per step for tokens (None: cannot align)."""
        return 1 if align == "step" else self.tokens_per_step

    def curve(self, key, records=None, factor=1.0):
        """(steps, values) of `key` over the run's log records, sorted by step; NaN for non-finite values.

        A resumed run can log a step twice (the steps between its last checkpoint and the preemption are
        trained again): the later record wins, as it is the one the run continued from.
        """
        cache_key = (key, id(records), factor)
        if cache_key not in self._curves:
            self._curves[cache_key] = self._curve(key, records, factor)
        return self._curves[cache_key]

    def _table(self, records):
        """(steps, records) with one record per step, the later one winning, in step order."""
        if id(records) not in self._tables:
            last = {r["step"]: r for r in records}
            steps = sorted(last)
            self._tables[id(records)] = (np.array(steps, dtype=np.float64), [last[s] for s in steps])
        return self._tables[id(records)]

    def _curve(self, key, records, factor):
        steps, recs = self._table(self.run.train if records is None else records)
        raw = [r.get(key) for r in recs]
        try:
            values = np.array(raw, dtype=np.float64)  # None (key absent) becomes NaN
        except (TypeError, ValueError):  # a string where a number belongs: that point is absent
            values = np.array([v if isinstance(v, (int, float)) else None for v in raw], dtype=np.float64)
        nan = np.flatnonzero(np.isnan(values))
        absent = [i for i in nan if not isinstance(raw[i], float)]  # a logged NaN stays (a gap in the line)
        keep = np.ones(len(values), dtype=bool)
        keep[absent] = False
        steps, values = steps[keep], values[keep] * factor
        values[~np.isfinite(values)] = np.nan
        return steps, values

    def nonfinite_steps(self, key):
        """Steps whose logged `key` is NaN or Inf (drawn as markers, since a line cannot show them)."""
        steps, values = self.curve(key)
        return [int(s) for s in steps[np.isnan(values)]]

    def ms_per_step(self):
        """ms/step as logged, or derived from tokens/s for runs that predate the field."""
        steps, ms = self.curve("ms_per_step")
        if len(steps) or not self.tokens_per_step:
            return steps, ms
        steps, tps = self.curve("tokens_per_s")
        with np.errstate(divide="ignore", invalid="ignore"):
            return steps, np.where(tps > 0, 1000.0 * self.tokens_per_step / tps, np.nan)

    def events(self):
        """Event records (resume, preempted, checkpoint, nonfinite, ...), plus each NaN/Inf loss as a
        `nonfinite` event for runs that logged the value but not the event."""
        if self._events is None:
            self._events = self._collect_events()
        return self._events

    def _collect_events(self):
        out = [dict(e) for e in self.run.events if e.get("event") not in TIMING_EVENTS]
        seen = {e["step"] for e in out if e.get("event") == "nonfinite"}
        out += [{"step": s, "event": "nonfinite", "detail": "loss is NaN/Inf"} for s in self.nonfinite_steps("loss")
                if s not in seen]
        return sorted(out, key=lambda e: e["step"])

    def profile_window(self):
        """(start, stop) steps of the profiled window, from its events or else from the config; None when the
        run was not profiled."""
        starts = [e["step"] for e in self.run.events if e.get("event") == "profile_start"]
        stops = [e["step"] for e in self.run.events if e.get("event") == "profile_stop"]
        if starts:
            return starts[0], (stops[0] if stops else starts[0])
        start, stop = self.run.cfg("monitor.profile.start_step"), self.run.cfg("monitor.profile.stop_step")
        if isinstance(start, int) and isinstance(stop, int):
            return start, stop
        return None


def load_runs(paths, align="step"):
    if align not in ALIGNS:
        raise UserError(f"--align = '{align}' is not one of {', '.join(ALIGNS)}. Use 'step' (default) or 'tokens' "
                        f"(x = step × global batch × sequence length, for runs with different batch sizes).")
    if not paths:
        raise UserError("report needs at least one run directory, e.g. 'ms-llm report runs/quickstart'.")
    runs = [RunData(p) for p in paths]
    if align == "tokens":
        missing = [r.path for r in runs if not r.tokens_per_step]
        if missing:
            raise UserError(f"--align tokens needs train.global_batch_size and model.seq_length from each run's "
                            f"config.yaml, and {', '.join(missing)} has none. Use --align step for these runs.")
    return runs
