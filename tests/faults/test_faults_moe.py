"""Mixture-of-experts faults, injected through the config, each named first by `ms-llm diagnose`; and a healthy MoE
run (8 experts, top-2, the default aux loss) that raises no alarm and records its router health:

    (moe-a) router collapse: a router that starts at zero (every expert tied), no balancing loss
                                                   → moe_router_collapse, the zero init first
    (moe-b) dead experts: 32 experts, top-1, a router initialised 150x wider than the rest, no balancing loss
                                                   → moe_dead_experts, the wide init first
    (moe-c) heavy token dropping: capacity_factor 0.5  → moe_tokens_dropped, the capacity below 1 first
    (moe-d) aux coefficient too small: 1e-5 with a router initialised 15x wider
                                                   → moe_aux_too_small, the coefficient first
    (moe-e) aux coefficient too large: 100             → moe_aux_too_large, the coefficient first

The runs are the tiny Llama with MoE MLPs, logged every 10 steps (the rules judge the last 5 records), each as
long as its fault needs to show: the healthy run 200 steps (20 records of router health); moe-c and moe-e 60 (the
capacity drops and the aux loss's size are there from the first step; 60 steps is the rules' 5-record window after
the first record); moe-a and moe-d 100 (at 60 the zero-init router is still only uneven and the 15x-wide one still a
collapse: measured); moe-b 150 (its dead experts showed at 100 and 120 here, but an earlier measurement at 100
still read a collapse: 150 leaves a margin). At 200 steps, as at these lengths, each fault's finding was its run's
only alarm (measured), so the shorter runs take no competing alarm away from the "named first" check. The healthy
run has the tiny model's 2 layers (its records are per layer); the fault runs have 1 (the rules judge each layer
alone; a MoE layer costs ~1.5 CPU s of compile and steps per run).
"""
import json

import pytest

from faultkit import NO_EVAL, alarms, diagnose, finding_text, first_cause, sets, tiny_cfg, train

MOE = sets("model.arch=llama", "model.ffn_hidden_size=64", "model.moe={num_experts: 8, top_k: 2}")


@pytest.fixture(scope="module")
def healthy(dataset, tmp_path_factory):
    run = tmp_path_factory.mktemp("moe") / "healthy"
    train(tiny_cfg(dataset, *MOE, *sets("train.max_steps=200", "train.eval_interval=100", "monitor.summary=true")),
          run)
    return run


@pytest.mark.slow
def test_a_healthy_moe_run_is_quiet_and_records_router_health(healthy):
    found = diagnose(healthy)
    print(f"healthy MoE run: {len(alarms(found))} alarms; notes: {[f.id for f in found]}")
    assert not alarms(found), finding_text(alarms(found))
    records = [json.loads(line) for line in open(healthy / "metrics.jsonl")]
    train_records = [r for r in records if "loss" in r]
    assert len(train_records) == 20
    for r in train_records:
        for layer in (0, 1):
            share = r[f"moe/{layer}/share"]
            assert len(share) == 8 and sum(share) == pytest.approx(1.0, abs=1e-5) and max(share) < 0.5
            assert r[f"moe/{layer}/dropped"] == 0 and 0.99 < r[f"moe/{layer}/lb_loss"] < 1.2
        lb = (r["moe/0/lb_loss"] + r["moe/1/lb_loss"]) / 2
        assert r["aux_loss"] == pytest.approx(0.01 * lb, rel=1e-6)  # aux_loss_coef × the layers' mean
    events = list((healthy / "summary").glob("events*"))
    assert events and b"moe/1/share/7" in events[0].read_bytes() and b"aux_loss" in events[0].read_bytes()


@pytest.mark.slow
def test_the_report_shows_expert_load_heat_maps_and_the_aux_loss(healthy):
    from ms_llm.report import write_report

    html = open(write_report([str(healthy)], str(healthy / "report.html")), encoding="utf-8").read()
    for panel in ("expert_load_0_0", "expert_load_0_1", "aux_loss", "lb_loss"):
        assert f'data-panel="{panel}"' in html, panel
    assert "expert load, layer 1 (% of the layer" in html and '"row_label":"expert"' in html
    assert 'data-panel="dropped"' not in html  # dropless: nothing to draw


@pytest.mark.slow
@pytest.mark.parametrize("name, steps, overrides, fid, words, fix", [
    ("moe_a_collapse", 100, ("model.moe.router_init_std=0", "model.moe.aux_loss_coef=0"), "moe_router_collapse",
     ("router starts at zero",), "--set model.moe.aux_loss_coef=0.01"),
    ("moe_b_dead", 150, ("model.moe.num_experts=32", "model.moe.top_k=1", "model.moe.router_init_std=3.0",
                         "model.moe.aux_loss_coef=0"), "moe_dead_experts", ("initialised 150x wider",),
     "--set model.moe.aux_loss_coef=0.01"),
    ("moe_c_drop", 60, ("model.moe.capacity_factor=0.5",), "moe_tokens_dropped", ("capacity_factor = 0.5 < 1",),
     "--set model.moe.capacity_factor="),
    ("moe_d_aux_small", 100, ("model.moe.router_init_std=0.3", "model.moe.aux_loss_coef=1e-5"), "moe_aux_too_small",
     ("aux_loss_coef = 1e-05 is too small",), "--set model.moe.aux_loss_coef=0.01"),
    ("moe_e_aux_large", 60, ("model.moe.aux_loss_coef=100",), "moe_aux_too_large",
     ("aux_loss_coef = 100 is too large",), "--set model.moe.aux_loss_coef=0.01"),
])
def test_moe_faults_are_named_first(dataset, tmp_path, name, steps, overrides, fid, words, fix):
    # no evaluation at all (the MoE rules read the training records only)
    train(tiny_cfg(dataset, *MOE, *sets("model.num_layers=1", f"train.max_steps={steps}", *NO_EVAL,
                                        *overrides)), tmp_path / name)
    found = diagnose(tmp_path / name)
    print(f"{name}: first alarm {alarms(found)[0].id if alarms(found) else None}: {alarms(found)[0].symptom}; cause 1: "
          f"{alarms(found)[0].causes[0]}; action 1: {alarms(found)[0].actions[0]}" if alarms(found) else "no alarm")
    first_cause(found, fid, *words, confidence="high")
    assert alarms(found)[0].id == fid, finding_text(alarms(found))
    f = next(x for x in found if x.id == fid)
    assert f.actions[0].startswith(fix), f.actions
    if name == "moe_c_drop":  # counted per log interval (the step's buffer is zeroed at each read), not cumulatively
        records = [json.loads(line) for line in open(tmp_path / name / "metrics.jsonl")]
        per_interval = 10 * 8 * 32 * 2  # steps × tokens per step × top_k
        drops = [r["moe/0/dropped"] for r in records if "loss" in r]
        assert all(0.5 * per_interval <= d <= per_interval for d in drops), drops
