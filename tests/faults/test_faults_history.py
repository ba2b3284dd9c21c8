"""What changed between the segments of a resumed run: one run stopped at step 100, resumed (a copy
each) with one key changed, and `ms-llm diagnose` names the change first where the curve changes at step 100:

    (ba) train.lr 1e-3 → 5e-2 at the resume   → the loss jumps at 110: the change, not bad batches
    (bb) train.lr 1e-3 → 1e-5 at the resume   → the loss stalls from 100: the change
    (bc) train.weight_decay 0.1 → 30          → the loss rises from 100 to the context-free level: the change is the
                                                first cause of the plateau
"""
import shutil

import pytest

from faultkit import NO_EVAL, alarms, diagnose, finding, finding_text, resume, sets, tiny_cfg, train

pytestmark = pytest.mark.slow  # every fault here is injected into a training run

BASE = sets("train.max_steps=200", *NO_EVAL)  # no validation: the rules here read the training curve


@pytest.fixture(scope="module")
def stopped(dataset, tmp_path_factory):
    """The run stopped at step 100 (its checkpoint and metrics), trained once for the module."""
    run = tmp_path_factory.mktemp("history") / "base"
    train(tiny_cfg(dataset, *BASE, *sets("train.stop_at_step=100")), run)
    return run


def resumed(stopped, dataset, tmp_path, *change):
    run = tmp_path / "run"
    shutil.copytree(stopped, run)
    resume(tiny_cfg(dataset, *BASE, *sets(*change)), run)
    return diagnose(run)


def test_ba_a_spike_right_after_a_resume_that_raised_the_lr_names_the_change(stopped, dataset, tmp_path):
    found = resumed(stopped, dataset, tmp_path, "train.lr=5e-2")
    f = finding(found, "resume_change")
    assert f.severity in ("warning", "error") and "train.lr 0.001 → 0.05" in f.symptom, finding_text(found)
    assert f.causes[0].startswith("the resume at step 100 changed train.lr") and f.confidence == "high"
    assert any("the logged LR went" in e for e in f.evidence)
    for x in alarms(found):  # nothing blames bad batches (or anything else) first
        assert "train.lr" in x.causes[0], (x.id, x.causes)


def test_bb_a_resume_that_cut_the_lr_100x_stalls_and_names_the_change(stopped, dataset, tmp_path):
    found = resumed(stopped, dataset, tmp_path, "train.lr=1e-5", "train.min_lr=1e-6")
    f = finding(found, "resume_change")
    assert "train.lr 0.001 → 1e-05" in f.symptom and f.causes[0].startswith("the resume at step 100 changed"), \
        finding_text(found)
    assert alarms(found)[0].causes[0].startswith("the resume at step 100 changed train.lr")


def test_bc_a_weight_decay_raised_at_the_resume_is_the_first_cause_of_the_plateau(stopped, dataset, tmp_path):
    found = resumed(stopped, dataset, tmp_path, "train.weight_decay=30")
    head = alarms(found)[0]
    assert head.causes[0].startswith("the resume at step 100 changed train.weight_decay 0.1 → 30"), \
        finding_text(found)
    assert finding(found, "resume_change").severity == "warning"
