"""Schedule and optimizer mistakes, injected through the config, each named first where the curve shows it:

    (n) a warmup longer than the run         → slow progress, the warmup first; config_warmup is a finding
    (o) a decay that ends long before the run → slow progress, the early decay first
    (p) a weight decay of 30                 → a stalled loss, the weight decay first
    (q) Adam's eps = 0.1                     → slow progress, eps first (its size against the RMS gradient)

Each runs 200 steps of the tiny model, without validation; ms-llm diagnose judges the curve against the data's unigram entropy.
"""
import pytest

from faultkit import NO_EVAL, alarms, diagnose, finding, first_cause, sets, tiny_cfg, train

pytestmark = pytest.mark.slow  # every fault here is injected into a training run

RUN = sets("train.max_steps=200", *NO_EVAL)  # no validation: every rule here reads the training curve


@pytest.mark.parametrize("name, overrides, symptom, words, fix", [
    ("n_warmup", ("train.warmup_steps=10000",), "slow_progress", ("warmup longer than the run",),
     "--set train.warmup_steps=4"),
    ("o_decay", ("train.decay_steps=20",), "slow_progress", ("decay ended at step 20",),
     "--set train.decay_steps=null"),
    ("p_weight_decay", ("train.weight_decay=30",), "loss_plateau", ("weight decay",),
     "--set train.weight_decay=0.1"),
    ("q_eps", ("train.eps=0.1",), "slow_progress", ("eps = 0.1",), "--set train.eps=1e-8"),
])
def test_schedule_and_optimizer_mistakes_are_named_first(dataset, tmp_path, name, overrides, symptom, words, fix):
    train(tiny_cfg(dataset, *RUN, *sets(*overrides)), tmp_path / name)
    found = diagnose(tmp_path / name)
    f = first_cause(found, symptom, *words, confidence="high")
    assert f.actions[0] == fix or f.actions[0].startswith(fix + " "), f.actions
    assert any("unigram entropy" in e for e in f.evidence), f.evidence  # judged against the reference
    config = [x for x in found if x.id.startswith("config_")]
    assert config and config[0].severity == "warning", [(x.id, x.severity) for x in found]
    assert any("the curve shows the effect" in e for e in config[0].evidence)
    assert {x.id for x in alarms(found)} <= {symptom, config[0].id, "throughput_uneven"}, [x.id for x in found]
    assert "always_clipped" not in {x.id for x in alarms(found)}
    assert finding(found, symptom).severity in ("warning", "error")
