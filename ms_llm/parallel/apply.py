"""Applying a ParallelPlan to a plain model from outside: MindSpore's semi-auto parallel context,
`.shard()` on primitives found by name, `pipeline_stage` on cells, recompute on layers.

Model code knows nothing of this: strategies are looked up by the path of each primitive in the cell
tree ("layers.3.attention.core.qk"). Semi-auto and pipeline parallelism need Ascend or GPU; on CPU the
session refuses such layouts before getting here (only recompute and data parallelism run on CPU).
"""
import os


def configure_auto_parallel(plan, strategy_dir, rank):
    import mindspore as ms

    os.makedirs(strategy_dir, exist_ok=True)
    ms.set_auto_parallel_context(
        parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL, device_num=plan.devices,
        # the token ids are split over data-parallel ranks only: model-parallel and pipeline peers read the same
        # slice (ParallelPlan.data_rank)
        dataset_strategy=((plan.dp, 1),),
        pipeline_stages=plan.pp, enable_parallel_optimizer=plan.optimizer_shard,
        # expert parallelism: tokens move between data-parallel and expert-parallel layouts by AllToAll
        enable_alltoall=plan.ep > 1,
        strategy_ckpt_config={"save_file": os.path.join(strategy_dir, f"strategy_rank_{rank}.ckpt"),
                              "only_trainable_params": False})


def shard_model(model, plan):
    """`.shard()` every primitive the plan names; returns {path: strategy} of what was applied. A plan entry that
    matches no primitive of the model is an error: a renamed attribute would otherwise un-shard it silently."""
    applied, matched = {}, set()
    for cell_path, cell in model.cells_and_names():
        for attr, prim in cell._primitives.items():  # primitives stored as Cell attributes
            if prim is None:
                continue
            path = f"{cell_path}.{attr}" if cell_path else attr
            strategy = plan.strategy_for(path)
            if strategy is None:
                continue
            out = plan.out_strategy_for(path)
            if out:
                prim.shard(in_strategy=strategy, out_strategy=out)
            else:
                prim.shard(strategy)
            applied[path] = strategy
            matched.add(plan.key_for(path))
    missing = [k for k in plan.strategies if k not in matched and k not in plan.optional]
    if missing:
        raise RuntimeError(f"the parallel plan names primitives this model does not have: {', '.join(missing)}. "
                           f"The model's attributes and ms_llm/parallel/layout.py's decoder_strategies must use the "
                           f"same paths, or those ops run unsharded.")
    return applied


def assign_stages(model, plan, loss=None):
    """pipeline_stage per layer; the embedding on the first stage (the model's own), the final norm, LM head
    and `loss` cell on the last. A tied embedding is used on both ends, so its weight joins the last stage
    too (MindSpore then keeps the two copies' gradients summed)."""
    if plan.pp == 1:
        return
    model.pipeline_stage = 0
    for layer, stage in zip(model.layers, plan.stage_of_layer):
        layer.pipeline_stage = stage
    last = plan.pp - 1
    for cell in (model.final_norm, model.head, loss):
        if cell is not None:
            cell.pipeline_stage = last
    (model.embedding if model.tie else model.lm_head).add_pipeline_stage(last)


def apply_recompute(model, plan):
    """Full recompute: the whole layer's activations are recomputed in backward (only its input is kept).
    Selective: only the attention core (scores, softmax) and the MLP activation, the activations that
    cost the most memory per FLOP (Korthikanti et al. 2022)."""
    for layer, mode in zip(model.layers, plan.recompute_of_layer):
        if hasattr(layer, "cell_init_args"):  # lazy_inline shares one graph per key: layers that recompute
            layer.cell_init_args += f"_recompute_{mode}"  # differently must not share it
        if mode == "full":
            layer.recompute()
        elif mode == "select":
            layer.attention.core.recompute()
            (layer.mlp.experts.act if layer.routed else layer.mlp.act).recompute()
