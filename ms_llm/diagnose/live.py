"""The diagnosis while the run runs: the same engine (engine.apply_rules) on the run directory as the trainer fills
it, handed to the loop as a hook by the entry point (ms_llm/run_hooks.py; ms_llm.train never imports diagnose).

- At every log interval the cheap rules (registered `live=CHEAP`: the loss, its start, NaN, divergence, spikes, what
  a resume changed, loss scale, memory growth, tensor-statistics flags, the settings) run on the records so far,
  unless the last check cost more than 1/BUDGET of the time since it (the checks then stay under ~2% of the run's
  time); at every evaluation all rules but the OFFLINE ones (they read other runs or whole log files).
- A finding of severity warning or error that is new since the last check (by id and severity) prints once, as
  `diagnose: [warning] <symptom>` with its first cause and first action, and is written to metrics.jsonl as a
  `diagnosis` event (the report and compare-curves draw it).
- With `train.stop_on: [error]` (or [warning, error]) a finding of that severity ends the run after this step, with
  a checkpoint, the finding as the reason (the trainer's `stop_on` event).
- The cost: the trainer leaves after_log out of the step time (so a check never makes a record look slow);
  the checks time themselves and write what they cost since the last such record as a `diagnose` timing event at
  each evaluation and at the end, which rundir/walltime.py counts as "live diagnosis". A check with no new record
  since the last one does nothing and costs nothing.

Only rank 0 diagnoses (metrics.jsonl is rank 0's); the stop it asks for is agreed by every rank in the trainer.
"""
import os
import time

from ms_llm.diagnose import engine, registry
from ms_llm.diagnose.common import memory_limit_gib
from ms_llm.rundir import names
from ms_llm.rundir.reader import add_records, load_run, read_jsonl_from

BUDGET = 50  # a log-interval check runs when the last one cost at most 1/50 of the time since it

OWN_EVENTS = ("diagnosis", "diagnose")      # the events this hook writes


class LiveRun:
    """A run directory read on as the trainer appends to it: each refresh parses only the new lines."""

    def __init__(self, path, parameters=None):
        self.run = load_run(path, need_metrics=False)
        self.run.running = True  # rules that would judge too early wait (rules/system.py telemetry_covers)
        self.run.parameters = parameters  # the model's size before run_info.json has its final summary
        self.offsets = {names.METRICS: 0, names.STATS: 0}
        self.run.train, self.run.evals, self.run.events, self.run.stats, self.run.task_evals = [], [], [], [], []
        self.refresh()

    def refresh(self):
        """Read what was appended since the last call; returns the number of new records."""
        new = 0
        for name in self.offsets:
            recs, bad, self.offsets[name] = read_jsonl_from(os.path.join(self.run.path, name), self.offsets[name])
            self.run.bad_lines += bad
            if name == names.METRICS:
                self.run.bad_lines += add_records(self.run, recs)
            else:
                self.run.stats += recs
            new += sum(r.get("event") not in OWN_EVENTS for r in recs)  # its own records are nothing new
        return new


class LiveDiagnosis:
    """The trainer hook (it needs no base class: ms_llm.train.loop.hooks.call calls the methods it has)."""

    def __init__(self, stop_on=(), echo=None, budget=BUDGET):
        self.stop_on = tuple(stop_on or ())
        self.budget = budget
        self.live = None
        self.reported = set()  # (finding id, severity) already printed
        self.last_check = self.last_cost = 0.0
        self.pending = False   # records arrived that no check has looked at yet
        self.spent, self.checks = 0.0, 0  # seconds and checks not yet written as a `diagnose` event
        self.limit = None
        self.echo = echo

    def start(self, run):
        if not run.session.rt.is_main:
            return
        self.live = LiveRun(run.run_dir, getattr(run.session, "n_params", None))
        self.limit = memory_limit_gib(None, self.live.run)
        self.last_check = time.perf_counter()

    def after_log(self, run, record):
        if self.live is None:
            return
        now = time.perf_counter()
        if self.last_cost and now - self.last_check < self.budget * self.last_cost:
            self.pending = True  # checked at the next interval the budget allows, or at the next evaluation
            return
        self.check(run, record["step"], engine.rules(live=registry.CHEAP))

    def after_eval(self, run, step, val_loss):
        if self.live is None:
            return
        self.check(run, step, engine.rules(live=registry.EVAL))
        self.write_cost(run, step)

    def write_cost(self, run, step):
        if self.checks:
            run.writer.write({"step": step, "event": "diagnose", "duration_s": round(self.spent, 4),
                              "checks": self.checks}, echo=False)
            self.spent, self.checks = 0.0, 0

    def check(self, run, step, chosen):
        """Diagnose the records so far; print and record what is new. False when there was nothing new to read."""
        t0 = time.perf_counter()
        if not self.live.refresh() and not self.pending:
            return False
        self.pending = False
        findings = engine.apply_rules(self.live.run, chosen, self.limit)
        for f in findings:
            if f.severity == "info" or (f.id, f.severity) in self.reported:
                continue
            self.reported.add((f.id, f.severity))
            self.report(run, step, f)
            if f.severity in self.stop_on and run.stop_reason is None:
                run.stop_reason = (f"train.stop_on = {list(self.stop_on)}: the diagnosis found [{f.severity}] "
                                   f"{f.symptom} ({f.id})")
        self.last_check = time.perf_counter()
        self.last_cost = self.last_check - t0
        self.spent += self.last_cost
        self.checks += 1
        return True

    def report(self, run, step, f):
        say = self.echo or run.log
        say(f"diagnose: [{f.severity}] {f.symptom} (step {step}; {f.id})")
        if f.causes:
            say(f"diagnose:   first cause: {f.causes[0]}")
        if f.actions:
            say(f"diagnose:   action: {f.actions[0]}")
        run.writer.write({"step": step, "event": "diagnosis", "id": f.id, "severity": f.severity,
                          "symptom": f.symptom, "cause": f.causes[0] if f.causes else "",
                          "action": f.actions[0] if f.actions else ""}, echo=False)

    def finish(self, run):
        if self.live is not None:  # the checks since the last evaluation (a run stopped early has no final one)
            self.write_cost(run, max([r["step"] for r in self.live.run.train] or [0]))
