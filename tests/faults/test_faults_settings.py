"""Faults an engineer sees in the config before looking at a curve, each injected through one config
value into a short run of the tiny model and named first by `ms-llm diagnose`, with the reference it is judged
against; and the diagnosis while the run runs:

    (aa) model.vocab_size = 4096 on data of 60 ids   → config_vocab: the start at ln 4096 and the head's FLOPs
    (ab) train.lr = 0.1 (100x the recipes' for the size) → the LR first; the loss bounces at the context-free level
    (ac) no warmup at train.lr = 0.3                   → divergence, "no warmup at a high LR" first
    (ad) model.seq_length = 8 on samples of 32         → config_context_short: 73% of every sample cut away
    (ae) model.dropout = 0.9, validated every 100      → dropout first (not the split; the issue's measured case)
    (af) monitor.tensor_stats.every = 1 on a clean run → no explosion from a record the run recovers from
    (ag) train.lr = 1 with train.stop_on = [error]     → the live warning at the first log interval, the run stopped
                                                         there with a checkpoint and the finding as the reason
"""
import json

import pytest

from faultkit import NO_EVAL, alarms, diagnose, finding, finding_text, sets, tiny_cfg, train

pytestmark = pytest.mark.slow  # every fault here is injected into a training run


def headline(found):
    a = alarms(found)
    assert a, "no alarm"
    return a[0]


def test_aa_a_vocabulary_far_larger_than_the_data_is_named_from_the_start_and_the_head(dataset, tmp_path):
    train(tiny_cfg(dataset, *sets("model.vocab_size=4096", "train.max_steps=40", *NO_EVAL)),
          tmp_path / "run")
    found = diagnose(tmp_path / "run")
    f = headline(found)
    assert f.id == "config_vocab", finding_text(found)
    assert "4,096" in f.causes[0] and f.confidence == "high"
    assert any("manifest.json max_token_id" in e for e in f.evidence)
    assert any("ln(4,096)" in e for e in f.evidence) and any("of each step's FLOPs" in e for e in f.evidence)


def test_ab_a_learning_rate_100x_the_recipes_is_named_first(dataset, tmp_path):
    train(tiny_cfg(dataset, *sets("train.lr=0.1", "train.max_steps=200", "train.eval_interval=50")), tmp_path / "run")
    found = diagnose(tmp_path / "run")
    # What the fault does in every run: the setting is named against the recipe. Whether the run also shows a
    # symptom (an alarm) depends on the machine's run; when it does, the setting leads it.
    lr = finding(found, "config_lr")
    assert "train.lr = 0.1" in lr.causes[0] and "100x" in lr.causes[0], finding_text(found)
    assert any("nanoGPT shakespeare-char 0.001" in e for e in lr.evidence)
    shown = alarms(found)
    assert not shown or "train.lr = 0.1" in shown[0].causes[0], finding_text(found)


def test_ac_no_warmup_at_a_high_learning_rate_is_named_in_the_divergence(dataset, tmp_path):
    train(tiny_cfg(dataset, *sets("train.lr=0.3", "train.warmup_steps=0", "train.max_steps=60",
                                  *NO_EVAL)), tmp_path / "run")
    found = diagnose(tmp_path / "run")
    # the combination first, then the divergence it explains, led by it
    assert [f.id for f in alarms(found)][:2] == ["config_warmup_none", "divergence"], finding_text(found)
    assert finding(found, "divergence").causes[0].startswith("no warmup at a high LR"), finding_text(found)
    assert finding(found, "config_warmup_none").severity == "warning"


def test_ad_a_context_shorter_than_the_samples_is_named(dataset, tmp_path):
    train(tiny_cfg(dataset, *sets("model.seq_length=8", "train.max_steps=40", *NO_EVAL)),
          tmp_path / "run")
    found = diagnose(tmp_path / "run")
    f = headline(found)
    assert f.id == "config_context_short" and "73%" in f.causes[0], finding_text(found)


def test_ae_dropout_09_validated_every_100_steps_is_named_first_not_the_split(dataset, tmp_path):
    train(tiny_cfg(dataset, *sets("model.dropout=0.9", "train.max_steps=200", "train.eval_interval=100")),
          tmp_path / "run")
    found = diagnose(tmp_path / "run")
    assert alarms(found), finding_text(found)
    for f in alarms(found):  # whatever else fires (a shift on the curve, a stall), dropout is its first cause
        assert "model.dropout = 0.9" in f.causes[0], (f.id, f.causes)
    f = finding(found, "config_dropout")
    assert any("Srivastava et al. 2014" in e for e in f.evidence)
    assert any("unigram entropy" in e for e in f.evidence)


def test_af_statistics_every_step_raise_no_explosion_on_a_healthy_run(dataset, tmp_path):
    train(tiny_cfg(dataset, *sets("monitor.tensor_stats.every=1", "train.max_steps=120", *NO_EVAL)),
          tmp_path / "run")
    found = diagnose(tmp_path / "run")
    # what every-step statistics cost is a true finding (wall_time); an explosion is not
    assert not [f for f in alarms(found) if f.id != "wall_time"], finding_text(found)
    flags = [json.loads(l) for l in open(tmp_path / "run" / "stats.jsonl") if '"exploding"' in l]
    if flags:
        assert finding(found, "stats_exploding").severity == "info"


def test_ag_the_live_diagnosis_warns_at_the_first_log_interval_and_stop_on_ends_the_run(dataset, tmp_path):
    from ms_llm.run_hooks import hooks_for
    from ms_llm.rundir.reader import load_run
    from ms_llm.rundir.walltime import account
    from ms_llm.train.trainer import run

    lines = []
    cfg = tiny_cfg(dataset, *sets("train.lr=1.0", "train.max_steps=100", "train.stop_on=[error]"))
    summary = run(cfg, run_dir=str(tmp_path / "run"), echo=lines.append, hooks=hooks_for(cfg))
    heads = [l for l in lines if l.startswith("diagnose: [error]")]
    assert heads and "(step 10; divergence)" in heads[0], lines
    i = lines.index(heads[0])
    assert lines[i + 1].startswith("diagnose:   first cause: learning rate (LR) too high")
    assert lines[i + 2].startswith("diagnose:   action: --set train.lr=")
    assert summary["steps"] == 10 and summary["checkpoint"].endswith("step_00000010.ckpt")
    assert any(l.startswith("stopped at step 10: train.stop_on") for l in lines)
    r = load_run(str(tmp_path / "run"))
    stop = [e for e in r.events if e["event"] == "stop_on"]
    assert stop and "(divergence)" in stop[0]["reason"]
    assert [e["id"] for e in r.events if e["event"] == "diagnosis"][:2] == ["config_lr", "divergence"]
    assert r.status == "stopped" and account(r)["hooks"].get("LiveDiagnosis", 0) > 0
