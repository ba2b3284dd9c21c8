"""Everything a run holds, built once from a config: runtime, data, model, optimizer, compiled step.

`open_session` does all checks that can refuse a run (config × world size, dataset × model) before it
builds anything; the trainer, the benchmark and the debugging tools all start from it. The session's `cfg` is
the resolved config (data-parallel size, vocabulary and strategy directory filled in), a new object: the
config the caller loaded is left as it was.
"""
from dataclasses import dataclass, replace
from typing import Any, Callable, List, NamedTuple

import numpy as np

from ms_llm.config import check_against_dataset
from ms_llm.data.loader import TrainBatches, check_token_ids, eval_batches
from ms_llm.data.manifest import has_manifest, load_manifest
from ms_llm.errors import UserError
from ms_llm.monitor.throughput import flops_per_token, peak_tflops
from ms_llm.train.context import Runtime, agree, all_ranks_ok, launch_world_size, select_device, setup_context


class StepOutput(NamedTuple):
    """What one optimizer step reports; tensors until the host reads them."""
    loss: Any  # mean loss of the step's micro-batches (over all ranks)
    grad_norm: Any  # global gradient norm before clipping
    code: Any  # 0 update applied, 1 skipped (non-finite gradients), 2 skipped by the anomaly guard
    loss_scale: Any  # the loss scale after the step


@dataclass
class Session:
    cfg: Any
    rt: Runtime
    log: Callable
    manifest: dict
    plan: Any
    accum: int
    model: Any
    step_fn: Any
    eval_step: Any
    data: TrainBatches
    val: List[Any]
    n_params: int
    flops_per_token: float
    peak_flops: float
    cache: Any = None  # compile_cache.Guard while the step's graphs are not yet compiled
    fresh_start: bool = True  # the step starts from the config's own initialisation (no resume, no loaded weights)
    compiled: bool = False

    @property
    def tokens_per_step(self):
        return self.cfg.train.global_batch_size * self.cfg.model.seq_length

    @property
    def step_cells(self):
        """The compiled cells of one optimizer step, in call order."""
        return ([self.step_fn.accumulate] if self.accum > 1 else []) + [self.step_fn]

    def next_batches(self):
        """The micro-batches of the next optimizer step on this rank, each checked for out-of-range ids."""
        batches = [next(self.data) for _ in range(self.accum)]
        for i, b in enumerate(batches):  # an out-of-range id is the integer NaN: refuse it before the forward
            problem = check_token_ids(b.asnumpy(), self.cfg.model.vocab_size)
            if problem:
                raise UserError(f"micro-batch {i} of the next step: {problem}")
        return batches

    def train_step(self, batches=None):
        """One optimizer step: accum-1 accumulating micro-batches, then the updating one."""
        batches = batches or self.next_batches()
        if self.cache is not None:
            return self.first_cached_step(batches)
        if not self.compiled:
            self.compile(batches)
        for b in batches[:-1]:
            self.step_fn.accumulate(b)
        return StepOutput(*self.step_fn(batches[-1]))

    def compile(self, batches):
        """Compile the step's graphs before the first step runs, then give the compiler's freed memory back to the
        OS, so that the step's memory does not come on top of it (CPU)."""
        from ms_llm.train.context import release_freed_host_memory

        for cell, batch in zip(self.step_cells, batches[-2:] if self.accum > 1 else batches[-1:]):
            cell.compile(batch)
        self.compiled = True
        release_freed_host_memory()

    def first_cached_step(self, batches):
        """The first step under the compile cache: its graphs compiled or loaded, checked, then run; a fresh
        start also records (filling) or verifies (reusing) what the step did. See compile_cache."""
        from ms_llm.train import compile_cache
        from ms_llm.train.context import release_freed_host_memory

        guard, self.cache = self.cache, None
        guard.check_binding(self.step_cells, batches[-2:] if self.accum > 1 else batches[-1:], self.log)
        self.compiled = True
        release_freed_host_memory()
        before = compile_cache.fingerprint(self.step_fn) if self.fresh_start else None
        out = self.train_step(batches)
        if before is not None:
            outputs = [x.asnumpy() for x in out]
            seen = guard.first_step_record(outputs, before, compile_cache.fingerprint(self.step_fn))
            error = None
            try:
                guard.check_first_step(seen)
            except compile_cache.CacheMismatch as e:
                error = e
            if not all_ranks_ok(self.rt, error is None):  # every rank starts over, or none
                raise error or compile_cache.CacheMismatch("another rank's compile cache entry did not reproduce "
                                                           "its first step; starting again with a fresh compile")
        return out


def open_session(cfg, echo=print, purpose="train", rt=None, layout=None, strategy_dir=None, compile_cache=None):
    """Check, then build. `rt`: an already set-up runtime; `layout`: (config, ParallelPlan) from
    `ms_llm.parallel.layout.resolve_layout` when the caller resolved it already; `strategy_dir`: where semi-auto
    parallel writes its strategy files; `compile_cache=False` overrides the config's switch."""
    from ms_llm.parallel.layout import resolve_layout

    if layout is None:  # refused before the rendezvous: every rank of a launch refuses at once
        layout = resolve_layout(cfg, launch_world_size(), rt.device_target if rt else select_device(cfg.context))
    cfg, plan = layout
    rt = rt or setup_context(cfg.context)
    # the trainer's RunLog prefixes other ranks' lines itself; a plain print gets the prefix here
    log = echo if rt.is_main or echo is not print else (lambda msg: print(f"[rank {rt.rank}] {msg}", flush=True))
    manifest = prepare_dataset(cfg, rt, log)
    if cfg.model.vocab_size is None:  # now known: the layout's vocabulary rule can run
        from ms_llm.parallel.layout import build_plan

        cfg = check_against_dataset(cfg, manifest, cfg.data.dataset_dir)
        plan = build_plan(cfg, plan.devices)
    cfg = check_against_dataset(cfg, manifest, cfg.data.dataset_dir)
    if strategy_dir and cfg.checkpoint.strategy_dir != strategy_dir:
        cfg = replace(cfg, checkpoint=replace(cfg.checkpoint, strategy_dir=strategy_dir))

    import mindspore as ms
    from model_zoo import build_model, count_params
    from ms_llm.nn import backend as nn_backend
    from ms_llm.nn import cpu_kernels
    from ms_llm.train.evaluate import EvalStep
    from ms_llm.train.lr_schedule import lr_table
    from ms_llm.train.optimizer import AdamW
    from ms_llm.train.step import TrainStep

    t, m = cfg.train, cfg.model
    backend = nn_backend.for_device(rt.device_target, cfg.context.cpu_kernels, layer_reuse=plan.pp == 1)
    if rt.device_target == "CPU" and cfg.context.cpu_kernels and not backend.cpu_kernels:
        log(f"note: fused CPU kernels unavailable ({cpu_kernels.build_error()}); using plain MindSpore ops")
    cache = None
    if cfg.context.compile_cache and compile_cache is not False and cfg.context.mode == "graph":
        from ms_llm.train import compile_cache as cc

        why_not = cc.unusable_reason()
        if why_not:  # (select_device switched MindSpore's cache off already)
            log(f"note: compile cache off: {why_not}")
        else:
            cache = cc.enable(cfg, rt, purpose)
            log(f"compile cache: {'reusing' if cache.hit else 'filling'} {cache.path}")
    ms.set_seed(t.seed)
    np.random.seed(t.seed)
    semi_auto = plan.semi_auto
    if semi_auto:
        from ms_llm.parallel.apply import configure_auto_parallel

        configure_auto_parallel(plan, cfg.checkpoint.strategy_dir or "strategy", rt.rank)
    model = build_model(m, cfg.precision.compute_dtype, backend)
    apply_plan(model, plan, semi_auto, log)
    optimizer = AdamW(model.trainable_params(), t.beta1, t.beta2, t.eps, t.weight_decay)
    micro_batch, accum = t.micro_batch_size, plan.accumulation
    if plan.pp > 1:  # one call per step: the pipeline takes all micro-batches at once and slices them itself
        step_fn = pipeline_step(model, optimizer, cfg, plan, backend)
        micro_batch, accum = t.micro_batch_size * accum, 1
    else:  # under semi-auto parallel MindSpore inserts the data-parallel gradient reduction itself
        step_fn = TrainStep(model, optimizer, cfg.precision, t.clip_grad, accum, 1 if semi_auto else rt.world_size,
                            lr_table(t), t.anomaly, backend, loss_chunk(cfg, plan, log))
    model.set_train(True)
    dp, data_rank = plan.dp, plan.data_rank(rt.rank)
    data = TrainBatches(cfg.data.dataset_dir, manifest, "train", micro_batch, dp, data_rank, t.seed,
                        m.seq_length, num_workers=cfg.data.num_workers)
    val = []
    if plan.pp == 1:
        val = eval_batches(cfg.data.dataset_dir, manifest, t.micro_batch_size, t.eval_steps, dp, data_rank,
                           m.seq_length, cfg.data.num_workers, accum)
    elif t.eval_interval or t.eval_steps:
        log("note: no validation during training under pipeline parallelism (a forward-only pipeline is a "
            "different graph); evaluate the checkpoint with pipeline_stage: 1")
    n_params = count_params(model)
    s = Session(cfg, rt, log, manifest, plan, accum, model, step_fn, EvalStep(model, loss_chunk(cfg, plan), backend), data, val, n_params,
                flops_per_token(count_params(model, exclude_positions=True), m.num_layers, m.hidden_size, m.seq_length),
                peak_tflops(rt.device_target, cfg.monitor.peak_tflops) * 1e12, cache)
    log(f"model: {m.arch}, {n_params:,} parameters ({m.num_layers} layers, hidden {m.hidden_size}, {m.num_heads} heads, "
        f"seq {m.seq_length}, vocab {m.vocab_size}); compute dtype {cfg.precision.compute_dtype}")
    if t.warmup_steps >= t.max_steps:
        log(f"note: train.warmup_steps = {t.warmup_steps} >= train.max_steps = {t.max_steps}: the learning rate "
            f"never reaches train.lr = {t.lr} in this run")
    what = "pipeline micro-batches" if plan.pp > 1 else "accumulation"
    log(f"batch: global {t.global_batch_size} = micro {t.micro_batch_size} × {what} {plan.accumulation} × data-parallel {dp}; "
        f"{s.tokens_per_step:,} tokens/step; device {rt.device_target}, {rt.world_size} rank(s)")
    return s


def loss_chunk(cfg, plan, log=None):
    """train.loss_chunk_tokens where the chunked loss applies: not under semi-auto parallel, whose strategies shard
    the LM head's own matmul (the chunked loss has its own, unsharded), nor on pipeline stages."""
    chunk = cfg.train.loss_chunk_tokens
    if chunk and plan.semi_auto:
        if log:
            log(f"note: train.loss_chunk_tokens = {chunk} is not used under semi-auto parallel (the layout shards the "
                f"LM head's matmul); the loss takes the whole logits")
        return 0
    return chunk


def pipeline_step(model, optimizer, cfg, plan, backend):
    """The pipelined step: MindSpore's Pipeline wrapper and PipelineGradReducer (Ascend), the loss on the last
    stage, the per-micro-batch loss compiled once (lazy_inline) where the backend supports it."""
    from mindspore.parallel.nn import PipelineGradReducer

    from ms_llm.parallel.apply import assign_stages
    from ms_llm.train.lr_schedule import lr_table
    from ms_llm.train.step import PipelineTrainStep

    t = cfg.train
    reducer = PipelineGradReducer(optimizer.params, opt_shard=plan.optimizer_shard)
    step = PipelineTrainStep(model, optimizer, cfg.precision, t.clip_grad, plan.micro_batch_num, lr_table(t),
                             t.anomaly, reducer=reducer, reuse=backend.ascend)
    assign_stages(model, plan, loss=step.loss_cell)
    return step


def apply_plan(model, plan, semi_auto, log):
    from ms_llm.parallel.apply import apply_recompute, shard_model

    if semi_auto:  # pipeline stages are assigned with the pipelined step, which owns the loss cell
        applied = shard_model(model, plan)
        log(f"parallel: {len(applied)} primitives sharded; " + plan.table().splitlines()[0])
    apply_recompute(model, plan)
    for w in plan.warnings:
        log(f"warning: {w}")


def prepare_dataset(cfg, rt, log):
    """Load the dataset manifest; preprocess `data.source` first (on rank 0) when the folder has none."""
    d = cfg.data
    if d.blend:  # several preprocessed datasets mixed by weight (ms_llm.data.blend)
        return load_manifest(d.dataset_dir, blend=d.blend)
    if not has_manifest(d.dataset_dir):
        if not d.source:
            load_manifest(d.dataset_dir)  # raises the 'run ms-llm preprocess' message
        if rt.is_main:
            log(f"no dataset in '{d.dataset_dir}': preprocessing '{d.source}' ({d.tokenizer} tokenizer, "
                f"seq_length {cfg.model.seq_length})")

        def build():
            if rt.is_main:
                from ms_llm.data.preprocess import preprocess

                preprocess(d.source, d.dataset_dir, cfg.model.seq_length, d.tokenizer, d.val_fraction, d.text_field,
                           log=log)

        agree(rt, build)
    return load_manifest(d.dataset_dir)
