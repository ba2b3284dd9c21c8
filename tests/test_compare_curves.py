"""`ms-llm compare-curves A B`: the regression gate. Synthetic runs (tests/synthetic_run.py) with known
differences, golden files, and the refusals."""
import json
import math

import pytest

from ms_llm.cli import main
from ms_llm.rundir.curves import Curve, compare
from synthetic_run import make_run


def cli(*argv):
    """ms-llm in-process; the exit code whether returned or raised (compare-curves raises SystemExit(1))."""
    try:
        return main([str(a) for a in argv])
    except SystemExit as e:
        return e.code


def test_same_run_is_identical_and_exits_0(tmp_path, capsys):
    a = make_run(tmp_path / "a", steps=500, seed=3)
    b = make_run(tmp_path / "b", steps=500, seed=3)
    assert cli("compare-curves", a, b, "--json") == 0
    out = capsys.readouterr().out
    assert "first step that differs at all: none" in out and "within tolerance at all 50 common steps" in out
    res = json.loads(out.strip().splitlines()[-1])
    assert res["max_abs_diff"] == 0 and res["first_part_step"] is None and not res["parted"]


def test_changed_learning_rate_parts_and_exits_1(tmp_path, capsys):
    a = make_run(tmp_path / "base", steps=500)
    b = make_run(tmp_path / "lr3", steps=500, lr=3e-3)
    assert cli("compare-curves", b, a, "--json") == 1
    out = capsys.readouterr().out
    res = json.loads(out.strip().splitlines()[-1])
    # the synthetic loss is 1.8 + 2 exp(-step (1 + 300 lr) / 250): recompute where 2% is first exceeded
    first = next(s for s in range(10, 501, 10)
                 if abs(2 * math.exp(-s * 1.9 / 250) - 2 * math.exp(-s * 1.3 / 250)) > 0.02 * (1.8 + 2 * math.exp(
                     -s * 1.3 / 250)) + 0.03)  # + the noise of both curves (σ 0.01 each)
    assert res["parted"] and res["first_part_step"] <= first
    assert f"PARTED at step {res['first_part_step']}" in out
    assert res["max_abs_diff"] > 0.1


def test_tolerance_is_atol_plus_rtol_times_reference():
    a = Curve("a", "loss", {10: 2.0, 20: 1.5, 30: 1.0})
    b = Curve("b", "loss", {10: 2.0, 20: 2.0, 30: 1.0 + 1e-9})  # exact binary values: the boundary is exact
    c = compare(a, b, rtol=0.25, atol=0.0)  # |1.5 - 2.0| = 0.5 <= 0.25 x |B| = 0.5: on the boundary, within
    assert not c.parted and c.first_diff == 20 and c.max_abs == (-0.5, 20) and c.max_rel == (0.25, 20)
    assert compare(a, b, rtol=0.24, atol=0.0).first_part == 20
    assert compare(a, b, rtol=0.0, atol=0.0).first_part == 20
    assert compare(a, b, rtol=0.0, atol=0.5).first_part is None
    assert compare(a, b, rtol=0.125, atol=0.25).first_part is None  # 0.25 + 0.125 x 2.0 = 0.5


def test_nan_parts_from_numbers_but_not_from_nan():
    a = Curve("a", "loss", {10: 2.0, 20: math.nan, 30: math.nan})
    b = Curve("b", "loss", {10: 2.0, 20: math.nan, 30: 1.0})
    c = compare(a, b, rtol=0.5)
    assert c.first_diff == 30 and c.first_part == 30 and c.max_abs[0] == math.inf


def test_golden_round_trip_and_gate(tmp_path, capsys):
    a = make_run(tmp_path / "a", steps=300, nan_at=200)
    golden = tmp_path / "golden.json"
    assert cli("compare-curves", a, "--save-golden", golden) == 0
    saved = json.loads(golden.read_text())
    assert saved["metric"] == "loss" and saved["values"]["200"] == "nan" and len(saved["values"]) == 30
    assert cli("compare-curves", a, golden) == 0
    assert "identical at every common step" in capsys.readouterr().out
    # a hand-written golden (plain step → value) works too, and a shifted curve fails the gate
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({k: (v * 1.1 if isinstance(v, float) else v) for k, v in saved["values"].items()}))
    assert cli("compare-curves", a, plain) == 1


def test_val_loss_compares_the_evaluations(tmp_path, capsys):
    """Another seed moves the evaluations by noise (within the 2% default: exit 0); a 3x LR parts them (exit 1)."""
    a = make_run(tmp_path / "a", steps=1000, eval_interval=250)
    b = make_run(tmp_path / "b", steps=1000, eval_interval=250, seed=9)
    assert cli("compare-curves", a, b, "--metric", "val_loss", "--json") == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["common_steps"] == 4 and res["metric"] == "val_loss"
    assert 0 < res["max_abs_diff"] < 0.02 * 2.4 and not res["parted"]
    c = make_run(tmp_path / "c", steps=1000, eval_interval=250, lr=3e-3)
    assert cli("compare-curves", c, a, "--metric", "val_loss", "--json") == 1
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["parted"] and res["first_part_step"] == 250


@pytest.mark.parametrize("setup, message", [
    (lambda a, t: ["compare-curves", a, t / "missing"], "does not exist"),
    (lambda a, t: ["compare-curves", a, a, "--metric", "perplexity"], "Metrics it has: data_wait_frac"),
    (lambda a, t: ["compare-curves", a, a, "--rtol", "-1"], "must be a finite number >= 0"),
    (lambda a, t: ["compare-curves", a], "needs two curves"),
    (lambda a, t: ["compare-curves", a, write(t / "g.json", {"metric": "val_loss", "values": {"1": 2}})],
     "holds the 'val_loss' curve"),
    (lambda a, t: ["compare-curves", a, write(t / "g.json", {"ten": 2.0})], "is not step → number"),
    (lambda a, t: ["compare-curves", a, write(t / "g.json", {"7": 2.0})], "no step in common"),
    (lambda a, t: ["compare-curves", a, write(t / "g.json", "[1, 2]", raw=True)], "holds a JSON list"),
    (lambda a, t: ["compare-curves", a, write(t / "g.json", "{", raw=True)], "is not a readable JSON file"),
    (lambda a, t: ["compare-curves", a, "--save-golden", t / "no" / "g.json"], "does not exist"),
])
def test_bad_input_is_one_paragraph(tmp_path, capsys, setup, message):
    a = make_run(tmp_path / "a", steps=100, telemetry=False)
    assert cli(*setup(a, tmp_path)) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1


def write(path, obj, raw=False):
    path.write_text(obj if raw else json.dumps(obj))
    return str(path)
