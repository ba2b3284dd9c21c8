"""The loss before any update: the trainer records the first step's loss as `initial_loss`, and a
start far from ln(vocab) is named as the start (initialisation or output scale), not blamed on the optimizer. One
judgement, shared by `ms-llm diagnose` and `ms-llm debug overfit` (ms_llm.rundir.start)."""
import math

from ms_llm.debug.overfit import report
from ms_llm.rundir.start import judge_start
from ms_llm.train.loop.meter import IntervalMeter
from test_diagnose import VOCAB, finding, healthy, ids, train_only, write_run


def bad_start_curve(start=30.0):
    """init_std = 1.0: the loss starts at 30 and comes down to the usual curve; the first interval's mean is 20."""
    recs = healthy()
    for r in train_only(recs):
        r["loss"] = max(r["loss"], start * math.exp(-r["step"] / 60))
        r["grad_norm"] = 3.0 if r["step"] < 300 else r["grad_norm"]
    recs[0]["initial_loss"] = start
    return recs


def test_a_start_far_above_ln_v_is_the_start_not_the_learning_rate(tmp_path):
    run = write_run(tmp_path / "init", bad_start_curve(), ["model.init_std=1.0", "model.hidden_size=128"])
    found = ids(run)
    assert "divergence" not in found, found  # the old answer: "above the uniform loss at step 50, LR too high"
    f = finding(run, "bad_start")
    assert f.severity == "error" and "before any update" in f.symptom and "not the optimizer" in f.symptom
    assert "model.init_std = 1" in f.causes[0] and f.confidence == "high"
    assert any("initial_loss" in e and "30" in e for e in f.evidence)
    assert any("not the cause" in e for e in f.evidence)
    assert f.actions[0] == "--set model.init_std=0.02 (now 1)"


def test_without_initial_loss_the_old_reading_stands(tmp_path):
    recs = bad_start_curve()
    del recs[0]["initial_loss"]  # a run from before the field: the first record is an interval mean
    run = write_run(tmp_path / "old", recs, ["model.init_std=1.0"])
    assert "bad_start" not in ids(run)


def test_a_normal_start_is_no_finding_and_a_climb_above_it_is_still_divergence(tmp_path):
    recs = healthy()
    recs[0]["initial_loss"] = math.log(VOCAB) + 0.02
    assert ids(write_run(tmp_path / "ok", recs)) == set()
    for r in train_only(recs):
        if r["step"] > 600:
            r["loss"] = min(6.0, 2.4 + 0.02 * (r["step"] - 600))
    assert "divergence" in ids(write_run(tmp_path / "div", recs, ["train.lr=3e-2"]))


def test_a_start_above_ln_v_from_loaded_weights_blames_the_weights(tmp_path):
    recs = bad_start_curve(start=12.0)
    f = finding(write_run(tmp_path / "ft", recs, ["checkpoint.load_weights=/models/x.ckpt"]), "bad_start")
    assert "loaded weights do not fit" in f.causes[0], f.causes


def test_a_fresh_start_far_below_ln_v_is_not_a_mean_cross_entropy(tmp_path):
    recs = healthy()
    recs[0]["initial_loss"] = 1.0  # ln 66 = 4.19: a fresh model cannot do that
    f = finding(write_run(tmp_path / "low", recs), "bad_start")
    assert "far below" in f.symptom and "not the mean token cross-entropy" in f.causes[0]
    assert "bad_start" not in ids(write_run(tmp_path / "loaded", recs, ["checkpoint.load_weights=/m.ckpt"]))


def test_overfit_and_diagnose_judge_the_start_with_one_implementation():
    start = judge_start(30.0, VOCAB)
    assert start.verdict == "above" and 6 < start.logit_spread < 8
    r = report([30.0] + [0.01] * 20, 0.01, 0.0, [], 0.1, 1e-3, VOCAB)
    assert start.text() in r["suspects"]  # the very sentence, not a second reasoning
    assert judge_start(math.log(VOCAB), VOCAB).verdict == "ok"
    assert judge_start(float("nan"), VOCAB) is None and judge_start(4.0, None) is None


def test_the_meter_puts_initial_loss_startup_and_interval_time_in_the_first_record_only():
    m = IntervalMeter(256, 1e6, 1e12, 1, 0, 30, t_start=0.0)
    m.startup_s = 1.5
    m.first_step(3.0, initial_loss=4.2)
    m.hook_s["TensorStats"] = 0.25
    for _ in range(10):
        m.add((4.0, 1.0, 0, 65536.0))
    first = m.record(10, 1e-3, 0.5)
    assert first["initial_loss"] == 4.2 and first["compile_s"] == 3.0 and first["startup_s"] == 1.5
    assert first["hooks_s"] == {"TensorStats": 0.25} and first["interval_s"] >= 0
    for _ in range(10):
        m.add((3.9, 1.0, 0, 65536.0))
    second = m.record(20, 1e-3, 0.5)
    assert not {"initial_loss", "compile_s", "startup_s", "hooks_s"} & set(second)
    resumed = IntervalMeter(256, 1e6, 1e12, 1, 100, 300, t_start=0.0)
    resumed.first_step(2.0)  # a resumed process: its first step is not before any update
    resumed.add((3.0, 1.0, 0, 65536.0))
    assert "initial_loss" not in resumed.record(101, 1e-3, 0.5)
