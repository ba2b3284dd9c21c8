"""The parallel plan is data: strategies, stages, recompute and validation, checked on CPU."""
import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT
from ms_llm.config import load_config
from ms_llm.train.setup.resolve import resolve
from ms_llm.errors import UserError
from ms_llm.parallel.layout import balanced_stages, build_plan

CONFIGS = os.path.join(ROOT, "configs")


def cfg(*overrides, base=None):
    return load_config(os.path.join(CONFIGS, base) if base else None, list(overrides))


@pytest.mark.parametrize("name, devices, dp, mp", [("llama2_7b_8p.yaml", 8, 8, 1), ("llama2_13b_16p.yaml", 16, 8, 2),
                                                    ("gpt2_124m_8p.yaml", 8, 8, 1)])
def test_config_layouts_split_batch_heads_and_tokens_as_their_layout_says(name, devices, dp, mp):
    """The shipped configs' layouts, and for the primitives that are not projections (the projections have their
    derived test below), the split that follows from the layout: attention splits the batch over data-parallel
    ranks and the heads over tensor-parallel ones; the norms split the tokens over data-parallel ranks, and over
    tensor-parallel ones too under sequence parallelism; a data-parallel embedding keeps its table whole."""
    plan = build_plan(cfg(base=name), devices)
    assert (plan.dp, plan.mp, plan.pp) == (dp, mp, 1)
    heads = (dp, mp, 1, 1)
    assert plan.strategy_for("layers.5.attention.core.qk") == (heads, heads)
    assert plan.strategy_for("layers.5.attention.core.pv") == (heads, heads)
    assert plan.strategy_for("layers.5.attention.core.softmax") == (heads,)
    tokens = dp * mp if plan.seq_parallel else dp
    for norm in ("attn_norm", "mlp_norm"):
        assert plan.strategy_for(f"layers.2.{norm}.op")[0] == (tokens, 1)
    assert plan.vocab_emb_dp and plan.strategies["embedding_gather"] == ((1, 1), (dp, 1))
    assert plan.strategies["head.matmul"] == ((dp, 1), (1, 1))
    if mp > 1 and plan.seq_parallel:  # row-parallel outputs are reduce-scattered along the tokens
        assert plan.out_strategy_for("layers.3.mlp.down.matmul") == ((dp * mp, 1),)
    assert set(plan.recompute_of_layer) == {None}  # all three fit without recompute (ms-llm plan)
    assert plan.stage_of_layer == [0] * len(plan.stage_of_layer)


@pytest.mark.parametrize("base, overrides, devices", [
    ("llama2_13b_16p.yaml", [], 16),
    (None, ["model.preset=tiny-llama", "model.vocab_size=64", "parallel_config.model_parallel=4",
            "model.num_kv_heads=4", "parallel_config.data_parallel=2", "train.global_batch_size=16", "train.micro_batch_size=2"], 8),
    (None, ["model.preset=tiny-gpt2", "model.vocab_size=64", "parallel_config.model_parallel=2",
            "parallel_config.data_parallel=4", "train.global_batch_size=16", "train.micro_batch_size=2"], 8),
])
def test_linear_strategies_derived_from_the_model_go_column_then_row_and_tile_every_weight(base, overrides, devices):
    """Independently of layout.py's table: in each block (attention, MLP) the first projection is split by its
    output rows (column parallel, no communication) and the one that consumes it by its input columns (row
    parallel), so the pair needs one reduction; every weight splits into equal whole shards, and the activation's
    contracted axis is split exactly like the weight's."""
    from mindspore.nn.utils import no_init_parameters

    from model_zoo import build_model
    from ms_llm.nn.layers import Linear

    c = cfg(*overrides, base=base)
    plan = build_plan(c, devices)
    dp, mp = plan.dp, plan.mp
    with no_init_parameters():  # layer 0 is all this reads: one layer builds in a fraction of the time
        model = build_model(dataclasses.replace(c.model, num_layers=1))
    layer = model.layers[0]
    for block_name in ("attention", "mlp"):
        block = getattr(layer, block_name)
        linears = [(n, cell) for n, cell in block.name_cells().items() if isinstance(cell, Linear)]
        assert len(linears) == 2, linears  # a projection in, a projection out
        for position, (name, lin) in enumerate(linears):
            act, weight = plan.strategy_for(f"layers.0.{block_name}.{name}.matmul")
            expected_w = (mp, 1) if position == 0 else (1, mp)
            assert weight == expected_w and act == (dp, expected_w[1]), (block_name, name, act, weight)
            out_f, in_f = lin.weight.shape
            assert out_f % weight[0] == 0 and in_f % weight[1] == 0  # equal, whole shards
            shard = (out_f // weight[0], in_f // weight[1])
            assert shard[0] * weight[0] == out_f and shard[1] * weight[1] == in_f  # and they tile the weight


def test_pipeline_stages_balanced_with_override_and_recompute_per_stage():
    assert balanced_stages(8, 4) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert balanced_stages(7, 3) == [0, 0, 1, 1, 1, 2, 2]  # the remainder goes to a middle stage
    assert balanced_stages(10, 4) == [0, 0, 1, 1, 1, 2, 2, 2, 3, 3]
    c = cfg("model.preset=llama2-13b", "parallel_config.data_parallel=2", "parallel_config.model_parallel=4",
            "parallel_config.pipeline_stage=2", "parallel_config.micro_batch_num=8", "train.global_batch_size=16",
            "train.micro_batch_size=1", "parallel_config.stage_layers=[19, 21]", "recompute_config.recompute=[19, 5]",
            "recompute_config.select_recompute=true")
    plan = build_plan(c, 16)
    assert plan.layers_of_stage(0) == list(range(19)) and len(plan.layers_of_stage(1)) == 21
    assert plan.recompute_of_layer[:19] == ["full"] * 19  # stage 0: all 19 fully recomputed
    assert plan.recompute_of_layer[19:24] == ["full"] * 5 and plan.recompute_of_layer[24:] == ["select"] * 16
    assert plan.bubble == pytest.approx(1 / 9)
    assert "stage 1: layers 19-39 (21) + final norm, LM head" in plan.table()


@pytest.mark.parametrize("overrides, devices, words", [
    (["parallel_config.data_parallel=2", "parallel_config.model_parallel=2"], 8, ["2 × 2 × 1", "8 devices"]),
    (["model.preset=llama2-7b", "parallel_config.model_parallel=3", "model.num_heads=30", "model.hidden_size=3840"],
     3, ["model.ffn_hidden_size = 11008 is not divisible by model_parallel = 3"]),
    (["model.preset=llama2-7b", "parallel_config.model_parallel=5"], 5, ["model.num_heads = 32 is not divisible"]),
    (["model.preset=llama2-70b", "parallel_config.model_parallel=16"], 16, ["model.num_kv_heads = 8"]),
    (["model.preset=llama2-7b", "parallel_config.model_parallel=2", "model.vocab_size=32001",
      "parallel_config.vocab_emb_dp=false"], 2, ["model.vocab_size = 32001", "vocab_emb_dp"]),
    (["model.num_layers=2", "parallel_config.pipeline_stage=4", "parallel_config.micro_batch_num=4",
      "train.global_batch_size=48"], 4, ["model.num_layers = 2 is smaller than pipeline_stage = 4"]),
    (["parallel_config.pipeline_stage=4", "parallel_config.micro_batch_num=2", "train.global_batch_size=24"], 4,
     ["micro_batch_num = 2", "= 2"]),
    (["parallel_config.pipeline_stage=4", "parallel_config.micro_batch_num=2", "train.global_batch_size=24",
      "train.micro_batch_size=12"], 4, ["is smaller than pipeline_stage = 4"]),
    (["parallel_config.use_seq_parallel=true"], 1, ["use_seq_parallel = true needs model_parallel > 1"]),
    (["parallel_config.data_parallel=5", "train.global_batch_size=12"], 5, ["12 is not divisible", "5 × 12 = 60"]),
    (["parallel_config.pipeline_stage=2", "parallel_config.stage_layers=[1, 2]", "parallel_config.micro_batch_num=2",
      "train.global_batch_size=24"], 2, ["stage_layers = [1, 2]"]),
    (["recompute_config.recompute=[1, 1]"], 1, ["recompute_config.recompute = [1, 1]"]),
    (["recompute_config.recompute=[]"], 1, ["recompute_config.recompute = []", "or false"]),
])
def test_invalid_layouts_are_explained(overrides, devices, words):
    with pytest.raises(UserError) as e:
        build_plan(cfg(*overrides), devices)
    for w in words:
        assert w in str(e.value), str(e.value)


def test_pipeline_bubble_warning_below_four_micro_batches_per_stage():
    plan = build_plan(cfg("parallel_config.pipeline_stage=2", "parallel_config.micro_batch_num=3",
                          "train.global_batch_size=36"), 2)
    assert plan.warnings and "bubble 25%" in plan.warnings[0]


def test_cpu_refuses_model_and_pipeline_parallel_and_optimizer_sharding():
    for o in ("parallel_config.model_parallel=2", "parallel_config.optimizer_shard=true"):
        with pytest.raises(UserError, match="needs Ascend or GPU devices; on CPU only data parallelism runs"):
            resolve(cfg(o), 2, "CPU")


def test_shard_model_applies_the_plan_by_name():
    import mindspore as ms
    from mindspore.nn.utils import no_init_parameters

    from model_zoo import build_model
    from ms_llm.parallel.apply import shard_model

    c = cfg("model.preset=tiny-llama", "model.vocab_size=64", "parallel_config.model_parallel=2",
            "parallel_config.data_parallel=2", "parallel_config.use_seq_parallel=true", "train.global_batch_size=24")
    plan = build_plan(c, 4)
    with no_init_parameters():
        model = build_model(c.model)
    applied = shard_model(model, plan)
    prims = {f"{p}.{a}" if p else a: prim for p, cell in model.cells_and_names() for a, prim in cell._primitives.items()
             if prim is not None}
    for i in range(c.model.num_layers):
        for op in ("attention.qkv.matmul", "attention.core.qk", "attention.core.softmax", "attention.core.pv",
                   "attention.out.matmul", "mlp.gate_up.matmul", "mlp.down.matmul"):
            path = f"layers.{i}.{op}"
            assert tuple(prims[path].in_strategy) == plan.strategy_for(path) and path in applied
    assert tuple(prims["layers.1.mlp.down.matmul"].out_strategy) == ((4, 1),)
    assert tuple(prims["embedding_gather"].in_strategy) == ((1, 1), (2, 1))
    assert len(applied) == 7 * c.model.num_layers + 2  # norms are functional on CPU: nothing else to shard
    del ms


def test_a_plan_entry_that_matches_no_primitive_is_an_error():
    """Renaming a model attribute must not silently un-shard it."""
    from mindspore.nn.utils import no_init_parameters

    from model_zoo import build_model
    from ms_llm.parallel.apply import shard_model

    c = cfg("model.preset=tiny-llama", "model.vocab_size=64", "parallel_config.model_parallel=2",
            "parallel_config.data_parallel=2", "train.global_batch_size=24")
    plan = build_plan(c, 4)
    with no_init_parameters():
        model = build_model(c.model)
    renamed = dict(plan.strategies)
    renamed["layers.{i}.attention.qkv_proj.matmul"] = renamed.pop("layers.{i}.attention.qkv.matmul")
    with pytest.raises(RuntimeError, match=r"does not have: layers.\{i\}.attention.qkv_proj.matmul"):
        shard_model(model, dataclasses.replace(plan, strategies=renamed))


def test_data_rank_gives_model_and_pipeline_peers_the_same_slice():
    # 16 devices as dp 4 x mp 2 x pp 2: stage 0 is ranks 0-7, tensor-parallel pairs are neighbours
    plan = build_plan(cfg("model.preset=tiny-llama", "model.vocab_size=64", "parallel_config.model_parallel=2",
                          "parallel_config.pipeline_stage=2", "parallel_config.data_parallel=4",
                          "parallel_config.micro_batch_num=2", "train.global_batch_size=16",
                          "train.micro_batch_size=2"), 16)
    ranks = [plan.data_rank(r) for r in range(16)]
    assert ranks == [0, 0, 1, 1, 2, 2, 3, 3] * 2
    assert [build_plan(cfg("train.global_batch_size=24"), 2).data_rank(r) for r in range(2)] == [0, 1]


@pytest.mark.slow
def test_pipeline_step_places_layers_head_and_loss_on_their_stages(tmp_path):
    from mindspore.nn.utils import no_init_parameters

    from model_zoo import build_model
    from ms_llm.nn.backend import Backend
    from ms_llm.train.optimizer import AdamW
    from ms_llm.train.session import pipeline_step
    from ms_llm.train.step import StepSpec

    c = cfg("model.preset=tiny-gpt2", "model.vocab_size=64", "model.num_layers=6", "parallel_config.pipeline_stage=3",
            "parallel_config.data_parallel=2", "parallel_config.micro_batch_num=6", "train.global_batch_size=24",
            "train.micro_batch_size=2")
    plan = build_plan(c, 6)
    ascend = Backend("Ascend", layer_reuse=False)  # built as on Ascend (nothing is compiled or run here)
    with no_init_parameters():
        model = build_model(c.model, backend=ascend)
    spec = StepSpec.of_run(c, plan, 6, model, ascend)  # as the session builds it
    step = pipeline_step(model, AdamW(model.trainable_params(), 0.9, 0.95, 1e-8, 0.1), spec, plan, ascend)
    assert type(model.layers[0]).__name__ == "DecoderLayer"  # not reused per layer: the micro-batch loss is,
    assert type(step.pipeline.network).__name__ == "ReusedPipelineLoss"  # once for all micro-batches
    assert step.pipeline.micro_size == 6 and step.has_reducer  # PipelineGradReducer over the optimizer's weights
    assert len(step.reducer.accu_grads) == len(model.trainable_params())
    assert [layer.pipeline_stage for layer in model.layers] == [0, 0, 1, 1, 2, 2] == plan.stage_of_layer
    assert model.pipeline_stage == 0
    assert model.final_norm.pipeline_stage == model.head.pipeline_stage == step.loss_cell.pipeline_stage == 2
    assert 2 in model.embedding._pipeline_stage_list  # the tied embedding also serves the head on the last stage

    import mindspore as ms
    from ms_llm.parallel.apply import configure_auto_parallel

    try:  # MindSpore takes the context on CPU; it only refuses when a sharded graph compiles
        configure_auto_parallel(plan, str(tmp_path / "strategy"), 0)
        assert ms.get_auto_parallel_context("pipeline_stages") == 3
        assert [list(s) for s in ms.get_auto_parallel_context("dataset_strategy")] == [[2, 1]]  # ids split by dp only
    finally:
        ms.reset_auto_parallel_context()


# Every probe in one process (MindSpore's import paid once): each probe builds its own session and compiles its own
# step, dumping that compile's IR into a folder of its own, so the counts below come from that probe's graph alone.
# Only the execute graph's IR is dumped (MS_DEV_DUMP_IR_PASSES, set by the test): all of save_graphs' passes wrote
# ~170 MB per probe and doubled the test's time.
RECOMPUTE_PROBE = r"""
import glob, json, os, sys
import mindspore as ms
from ms_llm.config import load_config
from ms_llm.train.session import open_session
from ms_llm.train.step_runner import StepRunner
root, dataset, out = sys.argv[1], sys.argv[2], sys.argv[3]
for name, overrides in json.loads(sys.argv[4]):
    path = os.path.join(out, name)
    ms.set_context(save_graphs=1, save_graphs_path=path)
    cfg = load_config(os.path.join(root, "configs", "shakespeare_char.yaml"),
                      ["monitor.summary=false", "context.compile_cache=false", "model.num_layers=2",
                       f"data.dataset_dir={dataset}", "data.source=null", "model.seq_length=32"] + overrides)
    runner = StepRunner(open_session(cfg, echo=lambda *a: None))
    losses = [float(runner.step()[0].asnumpy()) for _ in range(4)]
    final = sorted(glob.glob(os.path.join(path, "**", "*execute*.ir"), recursive=True), key=os.path.getmtime)[-1]
    text = open(final).read()
    lines = text.splitlines()
    print("PROBE", json.dumps([name, losses, text.count("Sigmoid("), text.count("Softmax("),
                               sum("GeluTanhFwd" in l for l in lines), sum("CausalSoftmaxFwd" in l for l in lines)]),
          flush=True)
"""


@pytest.mark.slow
def test_recompute_shows_in_the_compiled_graph_and_keeps_the_losses(dataset, tmp_path):
    import json

    plain = "context.cpu_kernels=false"  # the composed GELU shows up as Sigmoid nodes that can be counted
    probes = [("none", [plain]), ("full", [plain, "recompute_config.recompute=true"]),
              ("select", [plain, "recompute_config.select_recompute=true"]),
              ("mixed", [plain, "recompute_config.recompute=[1]"]),
              ("kernels", []), ("kernels_select", ["recompute_config.select_recompute=true"])]
    proc = subprocess.run([sys.executable, "-c", RECOMPUTE_PROBE, ROOT, dataset, str(tmp_path), json.dumps(probes)],
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, GLOG_v="3", MS_DEV_DUMP_IR_PASSES="execute"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(l.split(" ", 1)[1]) for l in proc.stdout.splitlines() if l.startswith("PROBE ")]
    assert [r[0] for r in rows] == [name for name, _ in probes], proc.stdout[-2000:]
    # name: (losses, gelu sigmoids, softmaxes, fused gelus, fused softmaxes)
    (base_losses, base_gelu, base_softmax, _, _), (full_losses, full_gelu, full_softmax, _, _), \
        (sel_losses, sel_gelu, sel_softmax, _, _), (mixed_losses, mixed_gelu, mixed_softmax, _, _), \
        (kernel_losses, _, _, kernel_gelu, kernel_softmax), \
        (kernel_sel_losses, _, _, sel_kernel_gelu, sel_kernel_softmax) = [r[1:] for r in rows]
    assert base_softmax == 2 and base_gelu == 2  # two layers, each op once in the forward
    assert base_losses == full_losses == sel_losses  # recompute changes memory, never the numbers
    assert full_gelu == 2 * base_gelu and full_softmax == 2 * base_softmax  # every layer's forward runs twice
    assert sel_gelu == 2 * base_gelu and sel_softmax == 2 * base_softmax  # the selected ops run twice
    # with the fused CPU kernels, selective recompute is the kernels' own backward running them again
    assert kernel_gelu == kernel_softmax == 2 and sel_kernel_gelu == sel_kernel_softmax == 4
    assert kernel_sel_losses == kernel_losses
    # layers that recompute differently do not share one reused (lazy_inline) graph: only layer 0 recomputes
    assert mixed_losses == base_losses and mixed_gelu == 3 and mixed_softmax == 3


@pytest.mark.slow
def test_reshard_split_for_model_parallel_then_merge_is_bit_identical(tmp_path):
    from ms_llm.checkpoint import store
    from ms_llm.config import save_config

    c = cfg("model.preset=tiny-llama", "model.vocab_size=64")
    rng = np.random.default_rng(0)
    from mindspore.nn.utils import no_init_parameters
    from model_zoo import build_model
    with no_init_parameters():
        shapes = {n: tuple(p.shape) for n, p in build_model(c.model).parameters_and_names()}
    full = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    full.update({f"adam_m.{n}": rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()})
    store.write_tensors(str(tmp_path / "full.ckpt"), full, "ckpt")
    save_config(c, str(tmp_path / "config.yaml"))
    layout = ["--set", "parallel_config.model_parallel=2", "--set", "parallel_config.data_parallel=2"]
    from ms_llm.cli import main  # the CLI's commands in this process: a process of their own would add the import

    assert main(["convert", "--split", str(tmp_path / "full.ckpt"), "--config", str(tmp_path / "config.yaml"),
                 *layout, "--devices", "4", "--output", str(tmp_path / "shards")]) == 0
    r1 = store.read_tensors(str(tmp_path / "shards" / "rank_1" / "model.ckpt"))
    assert r1["layers.0.attention.qkv.weight"].shape == (shapes["layers.0.attention.qkv.weight"][0] // 2, 64)
    assert r1["layers.0.mlp.down.weight"].shape == (64, shapes["layers.0.mlp.down.weight"][1] // 2)
    assert np.array_equal(r1["layers.0.attn_norm.weight"], full["layers.0.attn_norm.weight"])  # replicated
    assert main(["convert", "--merge", str(tmp_path / "shards"), "--config", str(tmp_path / "config.yaml"),
                 *layout, "--devices", "4", "--output", str(tmp_path / "merged.ckpt")]) == 0
    merged = store.read_tensors(str(tmp_path / "merged.ckpt"))
    assert merged.keys() == full.keys() and all(np.array_equal(merged[k], full[k]) for k in full)
