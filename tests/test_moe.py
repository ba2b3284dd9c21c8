"""Mixture of experts (docs/moe.md): the config and its refusals, parameter counts against the published ones, the
layer against a loop-by-loop NumPy reference (dropless, capacity with dropped tokens, the dense path), the aux loss
entering the differentiated loss, the router statistics, expert parallelism in the planner, MindFormers' moe_config,
and Hugging Face conversion both ways for Mixtral and Qwen3-MoE against transformers itself."""
import contextlib
import io
import json
import os
import re

import numpy as np
import pytest
import mindspore as ms

from test_families import converted_random_model
from ms_llm.config import load_config
from ms_llm.errors import UserError
from ms_llm.parallel.shapes import ModelShape

ms.set_device("CPU")
ms.set_context(mode=ms.GRAPH_MODE)

# Published totals (and active parameters per token), from each model's config.json shapes built by transformers 5.24
# on the meta device: the experts' share of the parameters times (E − k)/E is what a token leaves unused.
PUBLISHED = {"mixtral-8x7b": (46_702_792_704, 12_879_925_248), "qwen3-30b-a3b": (30_532_122_624, 3_353_032_704)}
TINY = ["model.arch=llama", "model.num_layers=2", "model.hidden_size=32", "model.num_heads=2", "model.seq_length=16",
        "model.vocab_size=64", "model.ffn_hidden_size=48"]


def cli(*args):
    from ms_llm.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


# --- config ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, message", [
    (["model.moe={num_experts: 2, top_k: 3}"], "model.moe.top_k = 3 is larger than model.moe.num_experts = 2"),
    (["model.moe={capacity_factor: 0}"], "model.moe.capacity_factor = 0.0 must be > 0"),
    (["model.moe={capacity_factor: -1.5}"], "set it to null"),
    (["model.moe={layers: [0, 2]}"], "model.moe.layers = [0, 2]: [2] out of range"),
    (["model.moe={layers: []}"], "the list is empty"),
    (["model.moe={layers: [1, 1]}"], "a layer is listed twice"),
    (["model.moe={num_experts: 8}", "parallel_config.expert_parallel=3"],
     "parallel_config.expert_parallel = 3 does not divide model.moe.num_experts = 8"),
    (["parallel_config.expert_parallel=2"], "expert_parallel = 2 without model.moe"),
    (["model.moe={shared_expert_gate: true}"], "shared_expert_gate = true without a shared expert"),
    (["model.moe={router_init_std: -0.1}"], "must be >= 0"),
])
def test_bad_moe_settings_are_refused_naming_the_field_and_the_fix(overrides, message):
    with pytest.raises(UserError, match=re.escape(message)):
        load_config(None, TINY + overrides)


def test_moe_needs_the_llama_layer():
    with pytest.raises(UserError, match="model.moe with model.arch = gpt2"):
        load_config(None, ["model.moe={num_experts: 4}"])


def test_expert_parallelism_is_refused_on_cpu_with_one_paragraph():
    from ms_llm.parallel.layout import with_data_parallel

    cfg = load_config(None, TINY + ["model.moe={num_experts: 4}", "parallel_config.expert_parallel=2"])
    with pytest.raises(UserError, match="AllToAll, which MindSpore does not run on CPU") as e:
        with_data_parallel(cfg, 2, "CPU")
    assert "\n" not in str(e.value) and "set expert_parallel to 1" in str(e.value)
    assert with_data_parallel(cfg, 2, "Ascend").parallel_config.data_parallel == 2  # the rule is the device's


def test_moe_true_gives_the_defaults_and_a_preset_merges_key_by_key():
    m = load_config(None, TINY + ["model.moe=true"]).model
    assert (m.moe.num_experts, m.moe.top_k, m.moe.capacity_factor, m.moe.dispatch) == (8, 2, None, "sorted")
    m = load_config(None, ["model.preset=mixtral-8x7b", "model.moe.capacity_factor=1.25"]).model
    assert (m.moe.num_experts, m.moe.top_k, m.moe.capacity_factor) == (8, 2, 1.25)


# --- parameter counts ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("preset", sorted(PUBLISHED))
def test_presets_have_the_published_total_and_active_parameters(preset):
    shape = ModelShape.from_config(load_config(None, [f"model.preset={preset}"]).model)
    assert (shape.total_params(), shape.active_params()) == PUBLISHED[preset]


def test_mixtral_by_hand():
    """46,702,792,704 = 32 layers × (attention 4096·(4096 + 2·1024) + 4096·4096, 8 experts × 3·4096·14336, router
    8·4096, two norms 2·4096) + embedding and head 2·32000·4096 + final norm 4096; active: 2 of the 8 experts."""
    h, f, layers = 4096, 14336, 32
    attention = h * (h + 2 * 1024) + h * h
    expert = 3 * h * f
    total = layers * (attention + 8 * expert + 8 * h + 2 * h) + 2 * 32000 * h + h
    assert total == PUBLISHED["mixtral-8x7b"][0] and total - layers * 6 * expert == PUBLISHED["mixtral-8x7b"][1]


def test_plan_prints_mixtrals_published_counts():
    code, out, err = cli("plan", "--set", "model.preset=mixtral-8x7b", "--devices", "16", "--json",
                         "--set", "parallel_config.expert_parallel=8", "--set", "train.global_batch_size=16",
                         "--set", "train.micro_batch_size=1")
    assert code == 0, err
    model = json.loads(out.strip().splitlines()[-1])["model"]
    assert (model["params"], model["active_params"]) == PUBLISHED["mixtral-8x7b"]


@pytest.mark.parametrize("moe", ["{num_experts: 4, top_k: 2}",
                                 "{num_experts: 4, top_k: 1, layers: [1], ffn_hidden_size: 24, shared_expert_size: 16, "
                                 "shared_expert_gate: true}"])
def test_the_built_model_has_the_parameters_plan_counts(moe):
    from mindspore.nn.utils import no_init_parameters

    from model_zoo import build_model, count_params

    m = load_config(None, TINY + [f"model.moe={moe}"]).model
    with no_init_parameters():
        model = build_model(m)
    shape = ModelShape.from_config(m)
    assert count_params(model) == shape.total_params()
    names = {n for n, _ in model.parameters_and_names()}
    assert ("layers.0.mlp.router.weight" in names) == (0 in shape.moe_layer_ids)
    assert "layers.1.mlp.experts.gate_up" in names and model.num_moe_layers == len(shape.moe_layer_ids)


# --- the layer against a NumPy loop ---------------------------------------------------------------------------

def silu(x):
    return x / (1 + np.exp(-x))


def reference_moe(x, router, gate_up, down, k, normalize, capacity=None):
    """Token by token, choice-major (all first choices before any second choice claim capacity): (output, counts,
    dropped, load-balancing loss, z-loss), in float64."""
    n, e, f = x.shape[0], router.shape[0], down.shape[2]
    logits = x @ router.T
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    top = np.argsort(-p, axis=1, kind="stable")[:, :k]
    w = np.take_along_axis(p, top, 1)
    if normalize:
        w = w / w.sum(1, keepdims=True)
    y, counts, filled, dropped = np.zeros_like(x), np.zeros(e), np.zeros(e), 0
    for choice in range(k):
        for t in range(n):
            j = top[t, choice]
            counts[j] += 1
            if capacity is not None and filled[j] >= capacity:
                dropped += 1
                continue
            filled[j] += 1
            g = gate_up[j] @ x[t]
            y[t] += w[t, choice] * (down[j] @ (silu(g[:f]) * g[f:]))
    lb = e * np.sum(counts / (n * k) * p.mean(0))
    lse = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
    return y, counts, dropped, lb, np.mean(lse ** 2)


def moe_layer(e=4, k=2, capacity_factor=None, dispatch="sorted", normalize=True, seed=0, h=16, f=24):
    from ms_llm.nn.moe import MoE

    layer = MoE(h, f, e, k, 0.02, 0.02, normalize_top_k=normalize, aux_loss_coef=0.5, z_loss_coef=0.25,
                capacity_factor=capacity_factor, dispatch=dispatch)
    rng = np.random.default_rng(seed)
    weights = {"router": rng.normal(0, 0.5, (e, h)), "gate_up": rng.normal(0, 0.3, (e, 2 * f, h)),
               "down": rng.normal(0, 0.3, (e, h, f))}
    layer.router.weight.set_data(ms.Tensor(weights["router"].astype(np.float32)))
    layer.experts.gate_up.set_data(ms.Tensor(weights["gate_up"].astype(np.float32)))
    layer.experts.down.set_data(ms.Tensor(weights["down"].astype(np.float32)))
    x = rng.normal(0, 1, (2, 12, h)).astype(np.float32)
    return layer, weights, x


@pytest.fixture
def pynative():
    """Op by op: the layer's arithmetic without a graph compile per case (seconds each); graph mode, which the
    static shapes are for, runs it in the conversion parity tests and every training test."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    yield
    ms.set_context(mode=ms.GRAPH_MODE)


@pytest.mark.parametrize("dispatch, capacity_factor, normalize", [("sorted", None, True), ("sorted", 0.75, True),
                                                                  ("dense", None, False), ("dense", 0.75, True),
                                                                  ("sorted", None, False)])
def test_the_layer_computes_the_reference(dispatch, capacity_factor, normalize, pynative):
    from ms_llm.nn.moe import STAT_NAMES, capacity

    layer, w, x = moe_layer(capacity_factor=capacity_factor, dispatch=dispatch, normalize=normalize)
    y, aux, stats = (t.asnumpy() for t in layer(ms.Tensor(x)))
    cap = capacity(24, 2, 4, capacity_factor) if capacity_factor else None
    ref, counts, dropped, lb, z = reference_moe(x.reshape(24, -1).astype(np.float64), w["router"], w["gate_up"],
                                                w["down"], 2, normalize, cap)
    np.testing.assert_allclose(y.reshape(24, -1), ref, atol=2e-5, rtol=1e-4)
    named = dict(zip(STAT_NAMES, stats[4:]))
    np.testing.assert_array_equal(stats[:4], counts)
    assert named["dropped"] == dropped and named["assignments"] == 48 and named["calls"] == 1
    assert (dropped > 0) == (capacity_factor is not None)  # 0.75: fewer slots than assignments
    np.testing.assert_allclose([named["lb_loss"], named["z_loss"], aux], [lb, z, 0.5 * lb + 0.25 * z], rtol=1e-5)


def test_capacity_is_the_ceiling_of_the_factor_share_and_at_most_the_tokens():
    from ms_llm.nn.moe import capacity, dropless_block

    assert capacity(24, 2, 4, 1.25) == 15 and capacity(24, 2, 4, 0.75) == 9 and capacity(10, 2, 2, 8.0) == 10
    assert capacity(3, 1, 8, 0.01) == 1
    assert dropless_block(48, 4) == 16 and dropless_block(40, 8) == 8


def layer_gradients(layer, x):
    from mindspore import nn

    class Objective(nn.Cell):  # a fixed random projection of the output, plus the aux loss
        def __init__(self, moe, probe):
            super().__init__()
            self.moe, self.probe = moe, probe

        def construct(self, x):
            y, aux, _ = self.moe(x)
            return (y * self.probe).sum() + aux

    probe = ms.Tensor(np.random.default_rng(1).normal(0, 1, x.shape).astype(np.float32))
    grad = ms.value_and_grad(Objective(layer, probe), None, layer.trainable_params())
    value, grads = grad(ms.Tensor(x))
    return float(value.asnumpy()), {p.name: g.asnumpy() for p, g in zip(layer.trainable_params(), grads)}


@pytest.mark.parametrize("capacity_factor", [None, 0.75])
def test_sorted_dispatch_gives_the_dense_paths_loss_and_gradients(capacity_factor, pynative):
    """The speed-up (tokens gathered into per-expert blocks) against the path without it (every expert on every
    token, weighted by the gate matrix): the same value and the same gradient for every weight (op by op)."""
    sorted_value, sorted_grads = layer_gradients(*moe_layer(capacity_factor=capacity_factor)[::2])
    dense_value, dense_grads = layer_gradients(*moe_layer(capacity_factor=capacity_factor, dispatch="dense")[::2])
    assert sorted_value == pytest.approx(dense_value, rel=1e-6)
    assert set(sorted_grads) == set(dense_grads)
    for name, g in sorted_grads.items():
        scale = np.abs(dense_grads[name]).max()
        assert scale > 0, name  # every weight gets a gradient (the router through w and the aux loss)
        np.testing.assert_allclose(g, dense_grads[name], atol=1e-5 * scale, err_msg=name)


@pytest.mark.slow  # op by op, ~5 CPU s (two MoE models' value and gradients)
def test_the_aux_loss_enters_the_differentiated_loss_under_the_accumulation_rule(pynative):
    """The routed loss of an MoE model differentiates (CE + aux) * scale / accum and logs CE; the router's gradient
    carries the aux loss (with the coefficient at 0 it is the CE's alone). Op by op: the loss's value and gradients
    are the point, and every MoE training test runs the compiled step."""
    from model_zoo import build_model
    from ms_llm.train.losses import RoutedLoss

    ids = ms.Tensor(np.random.default_rng(2).integers(0, 64, (2, 17)).astype(np.int32))
    router_grads, outs = {}, {}
    for coef in (0.0, 2.0):
        ms.set_seed(3)
        model = build_model(load_config(None, TINY + [f"model.moe={{num_experts: 4, aux_loss_coef: {coef}, "
                                                       f"z_loss_coef: {coef / 10}}}"]).model)
        loss_fn = RoutedLoss(model)
        out, grads = ms.value_and_grad(loss_fn, None, model.trainable_params(), has_aux=True)(ms.Tensor(8.0 / 4), ids)
        outs[coef] = [o.asnumpy() for o in out]
        router_grads[coef] = {p.name: g.asnumpy() for p, g in zip(model.trainable_params(), grads)
                              if "router" in p.name}
        _, aux, stats = model.forward_layers(ids[:, :-1])
        aux, stats = aux.asnumpy(), ms.ops.stack(stats).asnumpy()
        differentiated, ce = outs[coef][0], outs[coef][1]
        assert differentiated == pytest.approx((ce + aux) * 8.0 / 4, rel=1e-6)
        assert stats.shape == (2, 4 + 5) and outs[coef][2].shape == stats.shape
    assert outs[0.0][1] == pytest.approx(outs[2.0][1], rel=1e-6)  # the same weights: the same CE
    assert all(np.abs(router_grads[2.0][k] - router_grads[0.0][k]).max() > 1e-4 for k in router_grads[0.0])


# --- router statistics of a log interval --------------------------------------------------------------------

def test_interval_fields_share_ratio_means_and_drops():
    from ms_llm.train.loop.router_stats import interval_fields

    # two calls of layer 3: counts 30/10/20/0 of 60 assignments, lb sums 2.4, z sums 1.0, 6 dropped
    sums = np.array([[30, 10, 20, 0, 2.4, 1.0, 6, 60, 2]], np.float32)
    f = interval_fields(sums, [3], aux_coef=0.1, z_coef=0.01)
    assert f["moe/3/share"] == [0.5, 0.166667, 0.333333, 0.0] and f["moe/3/max_min"] is None
    assert f["moe/3/lb_loss"] == pytest.approx(1.2) and f["moe/3/z_loss"] == pytest.approx(0.5)
    assert f["moe/3/dropped"] == 6 and f["moe/3/dropped_frac"] == pytest.approx(0.1)
    assert f["aux_loss"] == pytest.approx(0.1 * 1.2 + 0.01 * 0.5)
    assert interval_fields(np.zeros((1, 9)), [3], 0.1, 0.0) == {}  # nothing accumulated: no fields


def test_the_router_buffer_is_read_once_per_interval_and_zeroed():
    from types import SimpleNamespace

    from ms_llm.train.loop.router_stats import RouterStats

    buffer = ms.Parameter(ms.Tensor(np.array([[3, 1, 1.0, 0.0, 0, 4, 1]], np.float32)), name="router_stats")
    m = load_config(None, TINY + ["model.moe={num_experts: 2, top_k: 2, layers: [1]}"]).model
    stats = RouterStats(SimpleNamespace(cfg=SimpleNamespace(model=m), step_fn=SimpleNamespace(
        state=SimpleNamespace(aux_sums=[buffer]))))
    assert stats.read()["moe/1/share"] == [0.75, 0.25]
    assert stats.read() == {} and not buffer.asnumpy().any()  # zeroed: the next interval starts from nothing


def test_router_fields_become_insight_and_tensorboard_scalars():
    from ms_llm.monitor.metrics import format_line, scalar_values

    record = {"step": 10, "loss": 2.0, "lr": 1e-3, "grad_norm": 0.5, "loss_scale": 1.0, "skipped": 0,
              "tokens_per_s": 1.0, "mfu": 0.0, "mem_gib": 0.1, "data_wait_frac": 0.0, "aux_loss": 0.0125,
              "moe/1/share": [0.75, 0.25], "moe/1/lb_loss": 1.25, "moe/1/max_min": None}
    scalars = scalar_values(record)
    assert scalars["moe/1/share/0"] == 0.75 and scalars["moe/1/share/1"] == 0.25 and scalars["aux_loss"] == 0.0125
    assert scalars["moe/1/lb_loss"] == 1.25 and "moe/1/max_min" not in scalars  # null (an idle expert) left out
    assert "aux 0.0125" in format_line(record, 100)


# --- diagnose on synthetic router fields (the fault suite trains the real thing) -----------------------------

def synthetic_run(shares, aux=0.0, coef=0.01, lb=1.0, dropped=0.0, extra=None):
    """A run whose every log record has the given per-layer shares (a list per record, or one list for all)."""
    from ms_llm.rundir.reader import Run

    records = []
    for i, share in enumerate(shares):
        r = {"step": 10 * (i + 1), "loss": 3.0 - 0.01 * i, "grad_norm": 0.5, "aux_loss": aux,
             "moe/0/share": share, "moe/0/lb_loss": lb, "moe/0/dropped_frac": dropped}
        records.append(r)
    config = {"model": {"moe": {"num_experts": len(shares[0]), "top_k": 2, "aux_loss_coef": coef, "z_loss_coef": 0.0,
                                "capacity_factor": 1.0 if dropped else None, **(extra or {})}, "init_std": 0.02},
              "train": {"clip_grad": 1.0, "max_steps": 10 * len(shares)}}
    return Run(path="synthetic", config=config, train=records)


BALANCED = [0.1, 0.15, 0.12, 0.13, 0.1, 0.16, 0.12, 0.12]
COLLAPSED = [0.45, 0.4, 0.03, 0.03, 0.03, 0.02, 0.02, 0.02]


def moe_findings(run):
    from ms_llm.diagnose.rules.moe import rule_moe

    return {f.id: f for f in rule_moe(run, {}, None) or []}


def test_a_balanced_router_raises_nothing_and_a_collapsed_one_is_named():
    assert moe_findings(synthetic_run([BALANCED] * 20, aux=0.01)) == {}
    found = moe_findings(synthetic_run([BALANCED] * 10 + [COLLAPSED] * 10, aux=0.0, coef=0.0, lb=3.0))
    assert "moe_router_collapse" in found and found["moe_router_collapse"].confidence == "high"
    assert found["moe_router_collapse"].actions[0].startswith("--set model.moe.aux_loss_coef=0.01")


def test_a_collapse_that_is_recovering_or_passing_is_not_sustained():
    recovering = [COLLAPSED] * 15 + [[0.35, 0.33, 0.08, 0.08, 0.06, 0.04, 0.03, 0.03]] * 2 + [BALANCED] * 3
    assert "moe_router_collapse" not in moe_findings(synthetic_run(recovering, aux=0.01))
    improving = [COLLAPSED] * 15 + [[top, 0.3, 0.1, 0.1, 0.1, 0.1, 0.1, 0.2 - top] for top in
                                    (0.47, 0.45, 0.43, 0.41, 0.39)]  # still high, but falling: the balance improves
    assert "moe_router_collapse" not in moe_findings(synthetic_run(improving, aux=0.01))
    passing = [BALANCED] * 16 + [COLLAPSED] * 2 + [BALANCED] * 2  # a healthy run's brief peak
    assert moe_findings(synthetic_run(passing, aux=0.01)) == {}


def test_dead_experts_dropping_and_the_aux_coefficient_both_ways():
    dead = [[0.2, 0.2, 0.2, 0.2, 0.2, 0.0, 0.0, 0.0]] * 20
    assert set(moe_findings(synthetic_run(dead, aux=0.0, coef=0.0))) == {"moe_dead_experts"}
    uneven = [[0.27, 0.25, 0.2, 0.1, 0.08, 0.05, 0.03, 0.02]] * 20
    assert set(moe_findings(synthetic_run(uneven, aux=1e-5, coef=1e-5))) == {"moe_aux_too_small"}
    assert moe_findings(synthetic_run(uneven, aux=0.012, coef=0.01)) == {}  # uneven, but the aux loss pulls
    large = moe_findings(synthetic_run([BALANCED] * 20, aux=100.0, coef=100.0))
    assert set(large) == {"moe_aux_too_large"} and "times the LM loss" in large["moe_aux_too_large"].evidence[0]
    drop = moe_findings(synthetic_run([BALANCED] * 20, aux=0.01, dropped=0.3))["moe_tokens_dropped"]
    assert drop.actions[0] == "--set model.moe.capacity_factor=1.5 (the busiest expert's median share × E: it then fits)"


def test_the_engine_puts_the_moe_finding_first_and_the_loss_rules_yield_to_a_dominating_aux_loss(tmp_path,
                                                                                                 monkeypatch):
    """Through `diagnose` itself (rule order, not the rule alone): a collapsed router is the first alarm of a run whose
    loss curve is healthy; an aux loss that dominates leaves a flat LM loss at the unigram level to moe_aux_too_large
    (underfitting and the progress rules would otherwise name the dropout, capacity or the data)."""
    from test_diagnose import UNIGRAM, healthy, write_run
    from ms_llm.diagnose.engine import diagnose

    monkeypatch.setenv("MS_LLM_CACHE", str(tmp_path / "cache"))
    moe = ["model.arch=llama", "model.moe={num_experts: 8, top_k: 2, aux_loss_coef: 0}"]
    collapsed = [dict(r, **{"aux_loss": 0.0, "moe/0/share": COLLAPSED, "moe/0/lb_loss": 3.0,
                            "moe/0/dropped_frac": 0.0}) if "loss" in r else r for r in healthy()]
    alarms = [f for f in diagnose(write_run(str(tmp_path / "collapse"), collapsed, moe))[1] if f.severity != "info"]
    assert alarms and alarms[0].id == "moe_router_collapse", [f.id for f in alarms]
    flat = [dict(r, loss=UNIGRAM + 0.01 * (i % 2), **{"aux_loss": 1.0, "moe/0/share": BALANCED, "moe/0/lb_loss": 1.0,
                                                      "moe/0/dropped_frac": 0.0}) if "loss" in r else
            dict(r, val_loss=UNIGRAM + 0.02) for i, r in enumerate(healthy())]
    moe[1] = "model.moe={num_experts: 8, top_k: 2, aux_loss_coef: 100}"
    run_dir = write_run(str(tmp_path / "aux_large"), flat, moe + ["model.dropout=0.2"])
    with open(tmp_path / "_data" / "manifest.json") as f:  # validation flat at its own unigram entropy, with dropout
        manifest = json.load(f)
    manifest["stats"]["val"] = {"unigram_entropy_nats": UNIGRAM}
    (tmp_path / "_data" / "manifest.json").write_text(json.dumps(manifest))
    found = diagnose(run_dir)[1]
    assert [f.id for f in found if f.severity != "info"] == ["moe_aux_too_large"], [(f.id, f.symptom) for f in found]


# --- expert parallelism in the planner ----------------------------------------------------------------------

def mixtral_plan(devices, *extra):
    from ms_llm.parallel import planner

    cfg = load_config(None, ["model.preset=mixtral-8x7b", "model.seq_length=4096", "precision.compute_dtype=bfloat16",
                             "train.global_batch_size=64", "train.micro_batch_size=1",
                             "recompute_config.recompute=true", "parallel_config.optimizer_shard=true", *extra])
    layout, _ = planner.layout_from_config(cfg, devices)
    return planner.plan(cfg, planner.Cluster(devices), layout)


def test_expert_memory_per_device_is_e_over_ep_of_the_experts_and_sharded_over_dp_over_ep():
    shape, r = mixtral_plan(16, "parallel_config.expert_parallel=8")
    terms = {t["name"]: t["bytes"] for t in r["memory"]["stages"][0]["terms"]}
    experts = 32 * 8 * 3 * 4096 * 14336  # every MoE layer's routed experts
    per_device = experts / 8  # one expert of each layer on each of the 8 EP ranks
    assert terms["experts' weights, fp32 master (sharded)"] == pytest.approx(4 * per_device / 2)  # dp/ep = 2 copies
    assert terms["experts' optimizer states, AdamW (sharded)"] == pytest.approx(8 * per_device / 2)
    assert terms["weights, fp32 master (sharded)"] == pytest.approx(4 * (shape.total_params() - experts) / 16)


def test_all_to_all_volume_per_step():
    _, r = mixtral_plan(16, "parallel_config.expert_parallel=8")
    a2a = r["communication"]["expert_parallel"]
    # full recompute: 6 all-to-alls of s·b·h·k bf16 per MoE layer and micro-batch, (ep−1)/ep of it off-device
    assert a2a["gb"] == pytest.approx(6 * 7 / 8 * 4096 * 4096 * 2 * 2 * 32 * 4 / 1e9, rel=1e-3)
    assert a2a["link"] == "intra" and "expert_data_parallel" in r["communication"]
    _, r1 = mixtral_plan(16)
    assert "expert_parallel" not in r1["communication"]


def test_search_ranks_expert_parallel_layouts_and_refuses_an_ep_that_does_not_divide():
    from ms_llm.parallel import planner

    cfg = load_config(None, ["model.preset=mixtral-8x7b", "model.seq_length=4096", "precision.compute_dtype=bfloat16",
                             "train.global_batch_size=256", "train.micro_batch_size=1"])
    layout, _ = planner.layout_from_config(cfg, 64)
    shape = ModelShape.from_config(cfg.model)
    results = planner.search(shape, layout, planner.Cluster(64))
    assert results and results[0]["layout"]["ep"] > 1  # the fastest layout splits the experts
    assert {r["layout"]["ep"] for r in results} == {1, 2, 4, 8}  # every power of two dividing dp and 8 experts
    reasons = planner.invalid_reasons(shape, layout.__class__(**{**layout.__dict__, "dp": 12, "ep": 8, "mp": 1,
                                                                 "pp": 1, "global_batch": 12}), 12)
    assert any("data_parallel = 12 is not divisible by expert_parallel = 8" in x for x in reasons)


def test_moe_strategies_split_experts_over_ep_and_keep_the_router_data_parallel():
    from ms_llm.parallel.layout import build_plan

    cfg = load_config(None, ["model.preset=mixtral-8x7b", "parallel_config.expert_parallel=4",
                             "parallel_config.model_parallel=2", "train.global_batch_size=16",
                             "train.micro_batch_size=1"])
    plan = build_plan(cfg, 16)
    assert plan.ep == 4 and plan.semi_auto
    assert plan.strategies["layers.{i}.mlp.experts.up_matmul"] == ((4, 1, 1), (4, 2, 1))
    assert plan.strategies["layers.{i}.mlp.experts.down_matmul"] == ((4, 1, 2), (4, 1, 2))
    assert plan.strategies["layers.{i}.mlp.router.matmul"] == ((8, 1), (1, 1))
    assert "layers.{i}.mlp.gate_up.matmul" not in plan.strategies  # every layer is an MoE layer


# --- MindFormers moe_config ----------------------------------------------------------------------------------

MF_MIXTRAL = {  # the moe_config, parallel and model keys of MindFormers' research/mixtral pretrain YAML
    "moe_config": {"expert_num": 8, "capacity_factor": 1.1, "aux_loss_factor": 0.05, "num_experts_chosen": 2,
                   "routing_policy": "TopkRouterV2", "enable_sdrop": True, "router_dense_type": "float32",
                   "use_fused_ops_topkrouter": False, "balance_via_topk_bias": False, "topk_bias_update_rate": 0.001,
                   "use_allgather_dispatcher": False},
    "use_parallel": True, "parallel": {"parallel_mode": 1, "enable_alltoall": True},
    "parallel_config": {"data_parallel": 8, "model_parallel": 1, "expert_parallel": 8, "pipeline_stage": 1},
    "model": {"model_config": {"type": "LlamaConfig", "seq_length": 4096, "hidden_size": 4096,
                               "intermediate_size": 14336, "theta": 1000000, "num_layers": 32, "num_heads": 32,
                               "vocab_size": 32000, "n_kv_heads": 8, "rms_norm_eps": 1e-5},
              "arch": {"type": "LlamaForCausalLM"}}}


def test_mindformers_moe_config_maps_to_model_moe():
    from ms_llm.config import from_dict
    from ms_llm.config.validate import validate_config
    from ms_llm.interop.mindformers.config import import_config
    from ms_llm.interop.mindformers.table import UNKNOWN, UNSUPPORTED

    ours, rows, _ = import_config(json.loads(json.dumps(MF_MIXTRAL)), samples=1000)
    assert ours["model"]["moe"] == {"num_experts": 8, "top_k": 2, "capacity_factor": 1.1, "aux_loss_coef": 0.05}
    assert ours["parallel_config"]["expert_parallel"] == 8
    status = {r.key: r.status for r in rows}
    assert status["moe_config.enable_sdrop"] == UNSUPPORTED and UNKNOWN not in status.values()
    cfg = validate_config(from_dict(ours))
    assert ModelShape.from_config(cfg.model).total_params() == PUBLISHED["mixtral-8x7b"][0]
    dropless = json.loads(json.dumps(MF_MIXTRAL))
    dropless["moe_config"]["capacity_factor"] = -1  # MindFormers: <= 0 is dropless
    assert import_config(dropless, samples=1000)[0]["model"]["moe"]["capacity_factor"] is None


# --- Hugging Face: config.json both ways and the refusals (pure Python) ---------------------------------------

MIXTRAL_HUB = {  # mistralai/Mixtral-8x7B-v0.1's config.json as the hub holds it (transformers 4.x)
    "architectures": ["MixtralForCausalLM"], "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32, "num_experts_per_tok": 2,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": False,
    "rms_norm_eps": 1e-05, "rope_theta": 1e6, "router_aux_loss_coef": 0.02, "sliding_window": None,
    "tie_word_embeddings": False, "vocab_size": 32000}


def test_mixtrals_hub_config_reads_as_the_preset():
    from dataclasses import replace

    from ms_llm.interop import huggingface as hf

    section = hf.model_section(MIXTRAL_HUB)
    ours = load_config(None, [f"model.{k}={json.dumps(v)}" for k, v in section.items()]).model
    preset = load_config(None, ["model.preset=mixtral-8x7b"]).model
    assert replace(ours, preset=preset.preset, seq_length=preset.seq_length) == preset
    assert section["moe"]["aux_loss_coef"] == pytest.approx(0.04)  # 0.02 × top_k: transformers' loss is k× ours


@pytest.mark.parametrize("extra, kind, expected", [
    ({"num_experts": 128, "moe_intermediate_size": 768, "norm_topk_prob": True}, "qwen3_moe",
     {"num_experts": 128, "ffn_hidden_size": 768, "normalize_top_k": True}),  # 4.x spelling
    ({"num_local_experts": 8, "mlp_only_layers": [0], "decoder_sparse_step": 1}, "qwen3_moe", {"layers": [1, 2, 3]}),
    ({"num_local_experts": 8, "decoder_sparse_step": 2}, "qwen3_moe", {"layers": [1, 3]}),
])
def test_qwen3_moe_configs_read_as_their_options(extra, kind, expected):
    from ms_llm.interop import huggingface as hf

    c = {"model_type": kind, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128, "head_dim": 16, **extra}
    moe = hf.model_section(c)["moe"]
    assert {k: moe.get(k) for k in expected} == expected


@pytest.mark.parametrize("overrides, message", [
    (["model.moe={shared_expert_size: 16}"], "no shared expert"),
    (["model.moe={normalize_top_k: false}"], "Mixtral always renormalises"),
    (["model.moe={layers: [1]}"], "Mixtral has experts in every layer"),
])
def test_moe_models_no_transformers_family_computes_are_not_written(overrides, message):
    from ms_llm.interop import huggingface as hf

    with pytest.raises(UserError, match=message):
        hf.hf_config(load_config(None, TINY + overrides).model)


def test_a_model_trained_from_scratch_is_written_as_its_family():
    from ms_llm.interop import huggingface as hf

    for extra, kind in ((["model.moe={num_experts: 4}"], "mixtral"),
                        (["model.qk_norm=true", "model.moe={num_experts: 4, layers: [1], normalize_top_k: false, "
                                                "ffn_hidden_size: 24}"], "qwen3_moe")):
        m = load_config(None, TINY + extra).model
        c = hf.hf_config(m)
        assert c["model_type"] == kind
        again = load_config(None, [f"model.{k}={json.dumps(v)}" for k, v in hf.model_section(c).items()]).model
        assert again == m


# --- Hugging Face parity: random transformers models --------------------------------------------------------

HF_FAMILIES = {  # transformers config class, options: each family's distinguishing features at tiny size
    "mixtral": ("MixtralConfig", {"num_local_experts": 4, "sliding_window": 8}),
    "qwen3_moe": ("Qwen3MoeConfig", {"num_experts": 4, "moe_intermediate_size": 48, "head_dim": 32,
                                     "norm_topk_prob": False, "mlp_only_layers": [1]}),
}
SEQ = 16


@pytest.fixture(scope="module", params=sorted(HF_FAMILIES))
def converted(request, tmp_path_factory):
    """A random transformers MoE model (weights redrawn large enough that routing differs token by token), saved
    with save_pretrained, converted with `ms-llm convert --from-hf`, and both models' logits on the same ids."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    cls, options = HF_FAMILIES[request.param]
    return converted_random_model(request.param, cls, dict(options, num_experts_per_tok=2),
                                  tmp_path_factory.mktemp(request.param))


@pytest.mark.slow
def test_logits_match_transformers_dropless(converted):
    diff = float(np.abs(converted["logits"] - converted["reference"]).max())
    m = converted["cfg"].model
    print(f"{converted['family']}: transformers {converted['transformers'].__version__}, "
          f"{sum(p.numel() for p in converted['model'].parameters()):,} parameters, {m.moe.num_experts} experts "
          f"top-{m.moe.top_k}, MoE layers {m.moe.layers or 'all'}, max |logit difference| {diff:.2e} over {SEQ} "
          f"tokens (logits up to {np.abs(converted['reference']).max():.1f})")
    assert diff < 1e-4
    assert m.moe.capacity_factor is None and ("sliding_window" in str(HF_FAMILIES[converted["family"]][1])) == bool(
        m.sliding_window)


@pytest.mark.slow
def test_converts_back_to_an_identical_state_dict(converted, tmp_path):
    root, torch, transformers = converted["root"], converted["torch"], converted["transformers"]
    code, _, err = cli("convert", "--to-hf", str(root / "ours" / "model.ckpt"), "--output", str(tmp_path / "back"))
    assert code == 0, err
    assert json.loads((tmp_path / "back" / "config.json").read_text()) == \
        json.loads((root / "hf" / "config.json").read_text())
    from safetensors import safe_open

    with safe_open(str(root / "hf" / "model.safetensors"), "pt") as a, \
            safe_open(str(tmp_path / "back" / "model.safetensors"), "pt") as b:
        assert set(a.keys()) == set(b.keys())  # the per-expert layout transformers 5 writes, written back
    back = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "back")).eval()
    original, again = converted["model"].state_dict(), back.state_dict()
    assert set(again) == set(original)
    assert all(torch.equal(again[k], original[k]) for k in original)


@pytest.mark.slow
def test_the_fused_expert_layout_converts_to_the_same_model(converted, tmp_path):
    """transformers 5 holds experts fused (mlp.experts.gate_up_proj / down_proj, router mlp.gate); a file written in
    that layout converts to the same weights, and goes back fused."""
    from safetensors.torch import save_file

    torch = converted["torch"]
    sd = {k: v.contiguous() for k, v in converted["model"].state_dict().items()}
    if "lm_head.weight" in sd and converted["model"].config.tie_word_embeddings:
        del sd["lm_head.weight"]
    os.makedirs(tmp_path / "fused")
    save_file(sd, str(tmp_path / "fused" / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "fused" / "config.json").write_text((converted["root"] / "hf" / "config.json").read_text())
    code, _, err = cli("convert", "--from-hf", str(tmp_path / "fused"), "--output", str(tmp_path / "ours"))
    assert code == 0, err
    from ms_llm.checkpoint import store

    a = store.read_tensors(str(tmp_path / "ours" / "model.ckpt"))
    b = store.read_tensors(str(converted["root"] / "ours" / "model.ckpt"))
    assert set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a)
    code, _, err = cli("convert", "--to-hf", str(tmp_path / "ours" / "model.ckpt"), "--output", str(tmp_path / "back"))
    assert code == 0, err
    from safetensors import safe_open

    with safe_open(str(tmp_path / "back" / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert keys == set(sd) and all(torch.equal(f.get_tensor(k), sd[k]) for k in keys)


@pytest.mark.slow
def test_a_config_json_written_from_our_config_loads_as_the_same_model(converted, tmp_path):
    import shutil

    root, torch, transformers = converted["root"], converted["torch"], converted["transformers"]
    os.makedirs(tmp_path / "run")
    shutil.copy(root / "ours" / "model.ckpt", tmp_path / "run" / "model.ckpt")
    code, _, err = cli("convert", "--to-hf", str(tmp_path / "run" / "model.ckpt"), "--config",
                       str(root / "ours" / "config.yaml"), "--output", str(tmp_path / "back"))
    assert code == 0, err
    back = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "back")).eval()
    with torch.no_grad():
        np.testing.assert_array_equal(back(converted["ids"]).logits[0].numpy(), converted["reference"])
