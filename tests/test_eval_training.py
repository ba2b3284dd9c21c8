"""Evaluation during training (the eval: section, ms_llm/eval/hook.py) on one tiny run: the shared accumulation-2 run
of conftest (ACCUM2) again, with the bundled demo task every 20 steps. Its records, its cost in the wall-time
accounting, its report panel, and that evaluating changes nothing the run trains."""
import json

import pytest

from conftest import ACCUM2, tiny_train_args, train_ok
from ms_llm.cli import main

pytestmark = pytest.mark.slow
EVAL = ["--set", "eval.tasks=[shakespeare_cloze]", "--set", "eval.interval=20", "--set", "eval.limit=40",
        "--set", "monitor.report=true"]


@pytest.fixture(scope="module")
def eval_run(dataset, tmp_path_factory):
    run = tmp_path_factory.mktemp("eval_training") / "run"
    proc = train_ok(*tiny_train_args(dataset, run, *ACCUM2, *EVAL))
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return run, proc.stdout, [r for r in records if "tasks" in r]


def test_the_task_is_evaluated_before_training_every_interval_and_at_the_end(eval_run):
    _, stdout, tasks = eval_run
    assert [r["step"] for r in tasks] == [0, 20, 40, 60]
    for r in tasks:
        assert r["tasks"] == ["shakespeare_cloze"] and r["shakespeare_cloze/docs"] == 40
        assert r["shakespeare_cloze/chance"] == 0.25 and 0 <= r["shakespeare_cloze/acc"] <= 1
        assert r["duration_s"] > 0 and r["elapsed_s"] > 0 and r["time"] > 1e9
    assert "step 20/60 | shakespeare_cloze acc " in stdout and "(chance 0.25)" in stdout


def test_evaluating_changes_nothing_the_run_trains(eval_run, accum2_run, capsys):
    """Every step's loss and every validation loss, bit for bit, against the same run without evaluation."""
    run, _, _ = eval_run
    assert main(["compare-curves", str(run), str(accum2_run[0]), "--rtol", "0"]) == 0
    assert main(["compare-curves", str(run), str(accum2_run[0]), "--rtol", "0", "--metric", "val_loss"]) == 0
    assert main(["compare-curves", str(run), str(run), "--metric", "shakespeare_cloze/acc"]) == 0


def test_requests_longer_than_the_context_are_cut_and_said_once(eval_run):
    _, stdout, _ = eval_run  # the demo's 64 characters against a context of 32
    assert stdout.count("longer than the model's context (32 tokens") == 1


def test_the_wall_time_accounting_and_the_report_show_the_evaluations(eval_run):
    from ms_llm.rundir.reader import load_run
    from ms_llm.rundir.walltime import account

    run, _, tasks = eval_run
    acc = account(load_run(str(run)))
    assert acc["phases"]["task evaluation"] == pytest.approx(sum(r["duration_s"] for r in tasks), abs=1e-3)
    assert sum(acc["phases"].values()) + sum(acc["hooks"].values()) <= acc["wall_s"] * 1.001
    assert "task_shakespeare_cloze" in (run / "report.html").read_text()
