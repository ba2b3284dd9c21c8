"""The diagnosis while the run runs (ms_llm/diagnose/live.py): the hook the entry point hands the trainer, driven
here by a synthetic run directory that grows record by record as a training run's does (MetricsWriter appends,
the hook reads on). A finding new since the last check prints once and is an event; every prefix of a healthy
run stays silent; train.stop_on asks the trainer to stop; a check with nothing new costs nothing."""
import json
import math
import os
import types

import pytest

from ms_llm.config import load_config, save_config
from ms_llm.diagnose.live import BUDGET, LiveDiagnosis
from ms_llm.monitor.metrics import MetricsWriter
from test_diagnose import VOCAB, healthy, write_dataset


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MS_LLM_CACHE", str(tmp_path / "cache"))


class Training:
    """What the trainer gives a hook (ms_llm.train.loop.hooks.TrainingRun), over a run directory it fills record by
    record: log lines are collected."""

    def __init__(self, path, overrides=()):
        os.makedirs(path)
        data = write_dataset(os.path.join(os.path.dirname(path), "_data"))
        cfg = load_config(None, [f"model.vocab_size={VOCAB}", "train.max_steps=2000", "train.log_interval=50",
                                 "train.eval_interval=500", f"data.dataset_dir={data}", *overrides])
        save_config(cfg, os.path.join(path, "config.yaml"))
        with open(os.path.join(path, "run_info.json"), "w") as f:
            json.dump({"device": {"target": "CPU", "cpu_count": 2}, "parallel": {"world_size": 1}}, f)
        self.lines = []
        self.run_dir, self.stop_reason = str(path), None
        self.writer = MetricsWriter(str(path), 0, 2000, echo=lambda *_: None)
        self.session = types.SimpleNamespace(rt=types.SimpleNamespace(is_main=True), n_params=804224)
        self.log = self.lines.append

    def feed(self, hook, records):
        """Write the records as the loop does and call the hook where the loop calls it; returns the step at which
        the hook first asked to stop, or None."""
        hook.start(self)
        for r in records:
            self.writer.write(r)
            if "loss" in r:
                hook.after_log(self, r)
            elif "val_loss" in r:
                hook.after_eval(self, r["step"], r["val_loss"])
            if self.stop_reason:
                return r["step"]
        return None

    def events(self, kind):
        with open(os.path.join(self.run_dir, "metrics.jsonl")) as f:
            return [r for r in map(json.loads, f) if r.get("event") == kind]


def diverging(onset=650):
    recs = healthy()
    for r in recs:
        if r["step"] > onset and "loss" in r:
            r["loss"] = min(6.0, 2.4 + 0.02 * (r["step"] - onset))
    return recs


def test_a_new_finding_prints_once_with_its_first_cause_and_action_and_is_an_event(tmp_path):
    from ms_llm.diagnose.engine import diagnose

    t = Training(tmp_path / "run", ["train.lr=3e-2"])
    assert t.feed(LiveDiagnosis(budget=0), diverging()) is None  # no stop_on: it only reports
    heads = [l for l in t.lines if l.startswith("diagnose: [") and "; divergence)" in l]
    assert len(heads) == 1, t.lines  # once, at the first check that sees it: a log interval, before the evaluation
    onset = next(f for f in diagnose(t.run_dir)[1] if f.id == "divergence").steps[0]
    seen = int(heads[0].split("(step ")[1].split(";")[0])
    assert onset < seen < 1000 and seen - onset <= 5 * 50, (onset, seen)  # the trailing median's 3-5 records
    i = next(i for i, l in enumerate(t.lines) if "divergence)" in l)
    assert t.lines[i].startswith("diagnose: [error] ")
    assert t.lines[i + 1].startswith("diagnose:   first cause: learning rate (LR) too high")
    assert t.lines[i + 2].startswith("diagnose:   action: --set train.lr=")
    events = t.events("diagnosis")
    assert [e["id"] for e in events if e["id"] == "divergence"] == ["divergence"]
    e = next(e for e in events if e["id"] == "divergence")
    assert e["step"] == seen and e["severity"] == "error" and e["cause"].startswith("learning rate (LR) too high")


def test_stop_on_error_asks_the_trainer_to_stop_with_the_finding_as_the_reason(tmp_path):
    t = Training(tmp_path / "run", ["train.lr=3e-2"])
    stopped = t.feed(LiveDiagnosis(stop_on=["error"], budget=0), diverging())
    assert stopped is not None and 650 < stopped < 1000
    assert "train.stop_on = ['error']" in t.stop_reason and "(divergence)" in t.stop_reason
    quiet = Training(tmp_path / "warn", ["train.lr=3e-2"])
    assert quiet.feed(LiveDiagnosis(stop_on=["error"]), healthy()) is None  # nothing of that severity


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("fp16", [False, True])
def test_every_prefix_of_a_healthy_run_is_silent(tmp_path, seed, fp16):
    t = Training(tmp_path / "run", ["precision.compute_dtype=float16"] if fp16 else [])
    t.feed(LiveDiagnosis(budget=0), healthy(seed=seed, fp16=fp16))  # a check at every log interval
    assert not [l for l in t.lines if l.startswith("diagnose:")], t.lines
    assert t.events("diagnosis") == []
    assert len(t.events("diagnose")) == 4  # the checks at the evaluations, with their cost


def test_a_check_with_nothing_new_costs_nothing_and_the_budget_spaces_the_cheap_ones(tmp_path):
    t = Training(tmp_path / "run")
    hook = LiveDiagnosis(budget=0)
    t.feed(hook, healthy()[:3])
    assert hook.check(t, 100, []) is False  # no record since the last check: no work, no cost
    hook.after_eval(t, 100, 3.0)  # writes what the checks so far cost
    n = len(t.events("diagnose"))
    hook.after_eval(t, 100, 3.0)
    assert len(t.events("diagnose")) == n == 1  # an evaluation with nothing new costs and writes nothing
    hook.budget, hook.last_cost = BUDGET, 1.0  # the last check was expensive: the next waits for the budget
    hook.last_check = __import__("time").perf_counter()
    t.writer.write(dict(healthy()[3], step=150), echo=False)
    hook.after_log(t, {"step": 150})
    assert hook.pending  # not checked yet: the next check the budget allows (or the next evaluation) reads it
    hook.after_eval(t, 150, 3.0)
    assert not hook.pending and len(t.events("diagnose")) == n + 1


def test_only_the_first_rank_diagnoses(tmp_path):
    t = Training(tmp_path / "run", ["train.lr=3e-2"])
    t.session.rt.is_main = False
    t.feed(LiveDiagnosis(stop_on=["error"]), diverging())
    assert not t.lines and t.stop_reason is None


def test_the_live_diagnosis_costs_show_in_the_wall_time_accounting(tmp_path):
    from ms_llm.rundir.reader import load_run
    from ms_llm.rundir.walltime import account, shares

    t = Training(tmp_path / "run")
    recs = healthy()
    for r in recs:  # the timing fields the meter writes
        r.update(time=1.8e9 + r["step"] * 0.05, elapsed_s=r["step"] * 0.05)
        if "loss" in r:
            r.update(interval_s=2.5, startup_s=1.0)
    hook = LiveDiagnosis(budget=0)
    t.feed(hook, recs)
    hook.finish(t)
    events = t.events("diagnose")
    assert sum(e["checks"] for e in events) == 40 + 4  # every log interval and every evaluation, all accounted
    acc = account(load_run(t.run_dir))
    assert math.isclose(acc["hooks"]["LiveDiagnosis"], sum(e["duration_s"] for e in events), rel_tol=1e-6)
    assert "live diagnosis" in [label for label, *_ in shares(acc)]
