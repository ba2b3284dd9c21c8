"""Where the wall time went: the accounting of ms_llm.rundir.walltime from what the trainer measured,
`ms-llm diagnose` naming a phase that takes a large share (with its key) and a run slower than a benchmark of its
config on this machine, the stacked bar of the report and the column of `ms-llm runs`. Synthetic runs."""
import json
import os

import pytest

from ms_llm.cli import main
from ms_llm.report import write_report
from ms_llm.rundir.reader import list_runs, load_run
from ms_llm.rundir.walltime import account, shares
from test_diagnose import finding, healthy, ids, write_run

STEP_S = 0.05  # seconds per training step


def timed(steps=2000, interval=50, eval_every=500, eval_s=0.5, ckpt_every=0, ckpt_s=0.2, hooks=None,
          startup=2.0, compile_s=3.0, first_eval_s=None, ms_per_step=None):
    """healthy() with the trainer's timing fields: each interval takes interval x STEP_S (1% of it waiting for
    data), evaluations and checkpoints their duration_s, `hooks` {name: seconds per record}."""
    out, elapsed = [], compile_s
    for r in healthy(steps=steps, interval=interval, eval_interval=eval_every):
        if "loss" in r:
            span = interval * STEP_S + sum((hooks or {}).values())
            elapsed += span
            r.update(interval_s=span, data_wait_frac=0.01, elapsed_s=elapsed, time=1.8e9 + elapsed,
                     ms_per_step=ms_per_step or 1000 * STEP_S, eta_s=0.0)
            if hooks:
                r["hooks_s"] = dict(hooks)
            if r["step"] == interval:
                r.update(compile_s=compile_s, startup_s=startup)
            out.append(r)
            if ckpt_every and r["step"] % ckpt_every == 0:
                elapsed += ckpt_s
                out.append({"step": r["step"], "event": "checkpoint", "duration_s": ckpt_s, "elapsed_s": elapsed,
                            "time": 1.8e9 + elapsed})
        else:
            d = first_eval_s if first_eval_s and not any("val_loss" in x for x in out) else eval_s
            elapsed += d
            out.append(dict(r, duration_s=d, elapsed_s=elapsed, time=1.8e9 + elapsed))
    return out


def test_the_accounting_closes_on_what_was_measured(tmp_path):
    run = load_run(write_run(tmp_path / "a", timed(ckpt_every=500, hooks={"TensorStats": 0.1})))
    acc = account(run)
    p = acc["phases"]
    assert acc["measured"] and acc["processes"] == 1
    assert acc["wall_s"] == pytest.approx(2.0 + 3.0 + 40 * (2.5 + 0.1) + 4 * 0.5 + 4 * 0.2)
    assert p["startup"] == 2.0 and p["compile"] == 3.0 and p["evaluation"] == pytest.approx(2.0)
    assert p["checkpoints"] == pytest.approx(0.8) and acc["hooks"]["TensorStats"] == pytest.approx(4.0)
    assert p["data wait"] == pytest.approx(40 * 2.6 * 0.01)
    assert p["training"] == pytest.approx(40 * 2.6 * 0.99 - 4.0)
    assert acc["rest_s"] == pytest.approx(0.0, abs=1e-6)
    assert sum(share for _, _, share, _ in shares(acc)) == pytest.approx(1.0)


def test_a_resumed_run_adds_its_processes(tmp_path):
    first = [r for r in timed() if r["step"] <= 1000]
    second = [dict(r, elapsed_s=r["elapsed_s"] - first[-1]["elapsed_s"] + 3.0) for r in timed() if r["step"] > 1000]
    second.insert(0, {"step": 1000, "event": "resume", "from": 1000, "elapsed_s": 0.0,
                      "time": second[0]["time"] - second[0]["elapsed_s"]})
    second[1].update(compile_s=3.0, startup_s=1.0)
    acc = account(load_run(write_run(tmp_path / "r", first + second)))
    assert acc["processes"] == 2 and acc["phases"]["compile"] == 6.0 and acc["phases"]["startup"] == 3.0
    assert acc["wall_s"] == pytest.approx(first[-1]["elapsed_s"] + 2.0 + second[-1]["elapsed_s"] + 1.0)


def test_a_healthy_timed_run_is_quiet(tmp_path):
    run = write_run(tmp_path / "ok", timed(first_eval_s=8.0, hooks={"TensorStats": 0.02}))
    assert ids(run) == set()


def test_evaluation_taking_half_the_time_is_named_with_its_keys(tmp_path):
    run = write_run(tmp_path / "eval", timed(eval_every=50, eval_s=3.0), ["train.eval_interval=50",
                                                                          "train.eval_steps=200"])
    assert ids(run) == {"wall_time"}
    f = finding(run, "wall_time")
    assert f.symptom.startswith("evaluation takes 55% of the time the run spends training")
    assert "train.eval_interval / train.eval_steps" in f.symptom
    assert "train.eval_interval = 50 steps" in f.causes[0] and f.confidence == "high"
    assert f.actions[0].startswith("--set train.eval_interval=") and int(f.actions[0].split("=")[1].split()[0]) >= 1000
    assert any("one evaluation costs as much as 61 steps" in e for e in f.evidence), f.evidence


def test_tensor_statistics_every_step_are_counted_per_probe_not_per_log_record(tmp_path):
    """A log record's hooks_s sums the probes of its interval (50 at every = 1): the evidence and the cause both
    price one probe, 2.0 s / 50 = 0.04 s = 0.81 steps of 49 ms (the training time less the data wait), not the
    record's 40 steps."""
    run = write_run(tmp_path / "stats", timed(hooks={"TensorStats": 2.0}), ["monitor.tensor_stats.every=1"])
    f = finding(run, "wall_time")
    assert f.symptom.startswith("tensor statistics takes") and "monitor.tensor_stats" in f.symptom
    assert any("2000 time(s) in 40 log records, 2 s per record (median; 0.04 s each)" in e for e in f.evidence), \
        f.evidence
    assert any("one tensor statistics costs as much as 0.81 steps" in e for e in f.evidence), f.evidence
    assert "each probe costs about 0.81 steps" in f.causes[0]
    assert f.actions[0] == "--set monitor.tensor_stats.every=20 (statistics about 5% of the time)"


def test_synchronous_checkpoints_are_named_with_async_save_first(tmp_path):
    run = write_run(tmp_path / "ckpt", timed(ckpt_every=50, ckpt_s=2.0), ["checkpoint.save_interval=50"])
    f = finding(run, "wall_time")
    assert "checkpoints" in f.symptom and "checkpoint.save_interval = 50" in f.causes[0]
    assert f.actions[0] == "--set checkpoint.async_save=true (write in the background)"


def test_a_profiled_window_is_a_note_and_a_one_off_eval_compile_is_no_alarm(tmp_path):
    recs = timed(first_eval_s=30.0)
    for r in recs:
        if r.get("step") in (100, 150) and "loss" in r:
            r["hooks_s"] = {"ProfileWindow": 40.0}
            r["interval_s"] += 40.0
    found = {f.id: f for f in __import__("ms_llm.diagnose.engine", fromlist=["x"]).diagnose(
        write_run(tmp_path / "prof", recs, ["monitor.profile.start_step=60", "monitor.profile.stop_step=150"]))[1]}
    assert "wall_time" not in found
    assert found["wall_time_profile"].severity == "info"


def write_benchmark(run, ms_per_step, **extra):
    with open(os.path.join(run, "benchmark.json"), "w") as f:
        json.dump(dict({"ms_per_step": ms_per_step, "tokens_per_s": 768 / ms_per_step * 1000, "steps": 20}, **extra),
                  f)


def test_a_run_slower_than_this_machine_runs_its_config(tmp_path):
    sets = ["context.num_threads=1"]
    info = {"device": {"target": "CPU", "cpu_count": 16}}
    run = write_run(tmp_path / "t1", timed(ms_per_step=200.0), sets, info=info)
    note = finding(run, "speed_settings")  # no benchmark yet: a note, with the command that measures
    assert note.severity == "info" and "context.num_threads = 1 of the host's 16 cores" in note.symptom
    assert "--steps 20 --set context.num_threads=null --output" in note.actions[0]
    write_benchmark(run, 40.0)
    f = finding(run, "slower_than_machine")
    assert f.severity == "warning" and f.symptom.startswith("5.0x slower per step")
    assert "context.num_threads = 1 of the host's 16 cores" in f.causes[0] and f.confidence == "high"
    assert f.actions[0] == "--set context.num_threads=null"
    write_benchmark(run, 180.0)  # this machine is no faster: nothing to say
    assert "slower_than_machine" not in ids(run) and "speed_settings" not in ids(run)


def test_slower_with_no_setting_to_blame_points_at_the_environment(tmp_path):
    run = write_run(tmp_path / "env", timed(ms_per_step=150.0), info={"device": {"target": "CPU", "cpu_count": 16}})
    write_benchmark(run, 50.0)
    f = finding(run, "slower_than_machine")
    assert any("OMP_NUM_THREADS" in c for c in f.causes[:2]), f.causes


def test_diagnose_refuses_a_missing_benchmark_file(tmp_path, capsys):
    run = write_run(tmp_path / "x", timed())
    assert main(["diagnose", run, "--benchmark", str(tmp_path / "nope.json")]) == 2
    assert "--benchmark" in capsys.readouterr().err


def test_runs_and_the_report_show_where_the_time_went(tmp_path, capsys):
    run = write_run(tmp_path / "eval", timed(eval_every=50, eval_s=3.0), ["train.eval_interval=50"])
    row = list_runs(str(tmp_path))[0]
    assert row["time_shares"]["evaluation"] == pytest.approx(120 / (5 + 100 * 1.0 + 120), abs=1e-3)
    assert main(["runs", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "where the time went" in out.splitlines()[0] and "eval 53% steps 44%" in out
    html = open(write_report(run, str(tmp_path / "r.html"), diagnose=False), encoding="utf-8").read()
    assert 'class="timebar"' in html and 'title="evaluation: 120.0 s (53.3%)"' in html
    assert "train.eval_interval / train.eval_steps" in html


def test_each_process_compiling_its_first_evaluation_is_no_alarm(tmp_path):
    """The clean resumed run: 4 evaluations of 4 batches, the first of each process compiling its graph (2 of 4)."""
    recs = timed(steps=200, interval=10, eval_every=50, eval_s=0.3, first_eval_s=20.0)
    first = [r for r in recs if r["step"] <= 100]
    second = [dict(r, elapsed_s=r["elapsed_s"] - first[-1]["elapsed_s"] + 3.0) for r in recs if r["step"] > 100]
    for r in second:
        if "val_loss" in r and r["step"] == 150:  # the second process compiles its evaluation again
            r["elapsed_s"] += 19.7
            r["duration_s"] = 20.0
    run = write_run(tmp_path / "resumed", first + second, ["train.max_steps=200", "train.log_interval=10",
                                                           "train.eval_interval=50", "train.warmup_steps=5"])
    assert "wall_time" not in ids(run)
    assert finding(write_run(tmp_path / "every5", timed(steps=200, interval=10, eval_every=10, eval_s=0.6,
                                                          first_eval_s=20.0),
                             ["train.max_steps=200", "train.log_interval=10", "train.eval_interval=10"]),
                   "wall_time").symptom.startswith("evaluation takes")
