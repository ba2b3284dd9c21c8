"""Everything a run holds, built once from a config: runtime, data, model, optimizer, compiled step.

`open_session` does all checks that can refuse a run (config × world size, dataset × model) before it
builds anything; the trainer, the benchmark and the debugging tools all start from it. The session holds the
resolved config (`ms_llm.train.resolve`: data-parallel size, vocabulary and strategy directory filled in, and
the parallel layout), a new object: the config the caller loaded is left as it was.

One step's path through the files: `Session.train_step` (here) → `step.AccumulateStep` for each micro-batch but
the last, then `step.TrainStep` (ms_llm/train/step.py: `LossFn` → the model's layers in ms_llm/nn/transformer.py →
the LM head and cross-entropy, chunked over tokens (ms_llm/train/loss.py; a mixture of experts adds its router loss,
fine-tuning data takes masked_loss.MaskedLossFn); value_and_grad; all-reduce, norm, clip; `optimizer.AdamW`), the
first step of a session going through `first_step` (ms_llm/train/compile_cache.py: compile or load, binding check,
first-step record).
"""
from dataclasses import dataclass, fields
from typing import Any, Callable, List, NamedTuple

import numpy as np

from ms_llm.config.validate import head_dim, moe_layers
from ms_llm.data.loader import TrainBatches, check_token_ids, eval_batches
from ms_llm.data.manifest import has_manifest, load_manifest
from ms_llm.errors import UserError
from ms_llm.monitor.throughput import flops_per_token, peak_tflops
from ms_llm.parallel.shapes import ModelShape
from ms_llm.train import compile_cache
from ms_llm.train.context import Runtime, agree, all_ranks_ok, launch_world_size, select_device, setup_context
from ms_llm.train.resolve import ResolvedConfig, check_launch, resolve


class StepOutput(NamedTuple):
    """What one optimizer step reports; tensors until the host reads them."""
    loss: Any  # mean loss of the step's micro-batches (over all ranks)
    grad_norm: Any  # global gradient norm before clipping
    code: Any  # 0 update applied, 1 skipped (non-finite gradients), 2 skipped by the anomaly guard
    loss_scale: Any  # the loss scale after the step


@dataclass
class Session:
    resolved: ResolvedConfig  # the config as run and its parallel layout
    rt: Runtime
    log: Callable
    manifest: dict
    purpose: str  # what the session is for (train, benchmark, lr_find, ...): part of the compile cache's key
    accum: int
    model: Any
    step_fn: Any
    eval_step: Any
    data: TrainBatches
    val: List[Any]
    n_params: int
    flops_per_token: float
    peak_flops: float
    cache: Any = None  # compile_cache.Guard until the first step has compiled (or loaded) the step's graphs
    fresh_start: bool = True  # the step starts from the config's own initialisation (no resume, no loaded weights)
    finetune: Any = None  # train.finetune.FinetuneState: chat data (masked loss), LoRA, data.extra_val; None: plain
    compiled: bool = False

    @property
    def cfg(self):
        return self.resolved.cfg

    @property
    def parallel(self):
        return self.resolved.parallel

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

    def step_inputs(self, batches):
        """The step cells' arguments for each micro-batch: (ids,), or for fine-tuning data (ids, token weights,
        segment ids, mask count) (train/finetune.py)."""
        return [(b,) for b in batches] if self.finetune is None else self.finetune.inputs(batches)

    def train_step(self, batches=None):
        """One optimizer step: accum-1 accumulating micro-batches, then the updating one. The first step of a
        session under the compile cache goes through `first_step`, so every driver gets its checks."""
        batches = batches or self.next_batches()
        if self.cache is not None:
            return self.first_step(batches)
        inputs = self.step_inputs(batches)
        if not self.compiled:
            self.compile_inputs(inputs)
        for x in inputs[:-1]:
            self.step_fn.accumulate(*x)
        return StepOutput(*self.step_fn(*inputs[-1]))

    def compile(self, batches):
        """Compile the step's graphs for these micro-batches without running them (`ms-llm benchmark --memory`
        measures the compile apart); the step then takes them as usual."""
        self.compile_inputs(self.step_inputs(batches))
        if self.finetune is not None:  # step_inputs counted these batches: the step counts them again
            self.finetune.loss_tokens = self.finetune.target_tokens = 0.0

    def compile_inputs(self, inputs):
        """Compile the step's graphs (from one step's `step_inputs`) before the first step runs, then give the
        compiler's freed memory back to the OS, so that the step's memory does not come on top of it (CPU)."""
        from ms_llm.train.context import release_freed_host_memory

        for cell, x in zip(self.step_cells, inputs[-2:] if self.accum > 1 else inputs[-1:]):
            cell.compile(*x)
        self.compiled = True
        release_freed_host_memory()

    def first_step(self, batches):
        """The first step under the compile cache: its graphs compiled or loaded and their binding checked, then
        run; a fresh start also records (filling) or verifies (reusing) what the step did (see compile_cache).
        A reused entry that does not reproduce it is discarded, and the session reopens uncached — model,
        optimizer and data from their initialisation — and takes the step again: only fresh starts are checked,
        so nothing is lost. Every rank starts over, or none."""
        from ms_llm.train.context import release_freed_host_memory

        guard, self.cache = self.cache, None
        probe = self.step_inputs(batches[-2:] if self.accum > 1 else batches[-1:])
        if self.finetune is not None:  # the probe counted its batches: the step counts them again
            self.finetune.loss_tokens = self.finetune.target_tokens = 0.0
        guard.check_binding(self.step_cells, probe, self.log)
        self.compiled = True
        release_freed_host_memory()
        before = compile_cache.fingerprint(self.step_fn) if self.fresh_start else None
        out = self.train_step(batches)
        if before is None:
            return out
        seen = guard.first_step_record([x.asnumpy() for x in out], before, compile_cache.fingerprint(self.step_fn))
        error = None
        try:
            guard.check_first_step(seen)
        except compile_cache.CacheMismatch as e:
            error = e
        if all_ranks_ok(self.rt, error is None):
            return out
        self.log(f"warning: {error}" if error else "warning: another rank's compile cache entry did not reproduce "
                                                   "its first step; starting again with a fresh compile")
        self.reopen_uncached()
        return self.train_step(batches)

    def reopen_uncached(self):
        """Rebuild this session from its resolved config with the compile cache off, in place, so that whoever
        holds the session (the trainer's hooks, a driver's loop) keeps using it. The data stream stays where the
        caller had taken it: the step is retaken on the same batches, whoever chose them."""
        fresh = build_session(self.resolved, self.rt, self.log, self.manifest, self.purpose, use_compile_cache=False)
        fresh.fresh_start = self.fresh_start
        fresh.data.seek(self.data.consumed)
        for f in fields(self):
            setattr(self, f.name, getattr(fresh, f.name))


def open_session(cfg, echo=print, purpose="train", rt=None, strategy_dir=None, use_compile_cache=True):
    """Check, resolve, then build. `rt`: an already set-up runtime (the caller then ran `check_launch` before
    setting it up); `strategy_dir`: where semi-auto parallel writes its strategy files; `use_compile_cache=False`
    overrides the config's switch."""
    if rt is None:  # refused before the rendezvous: every rank of a launch refuses at once
        check_launch(cfg, launch_world_size(), select_device(cfg.context))
        rt = setup_context(cfg.context)
    # the trainer's RunLog prefixes other ranks' lines itself; a plain print gets the prefix here
    log = echo if rt.is_main or echo is not print else (lambda msg: print(f"[rank {rt.rank}] {msg}", flush=True))
    manifest = prepare_dataset(cfg, rt, log)
    resolved = resolve(cfg, rt.world_size, rt.device_target, manifest, strategy_dir)
    return build_session(resolved, rt, log, manifest, purpose, use_compile_cache)


def build_session(resolved, rt, log, manifest, purpose, use_compile_cache=True):
    """The session of a resolved config: model, optimizer, compiled step, data readers."""
    import mindspore as ms
    from model_zoo import build_model, count_params
    from ms_llm.nn import backend as nn_backend
    from ms_llm.nn import cpu_kernels
    from ms_llm.train.evaluate import EvalStep
    from ms_llm.train.lr_schedule import lr_table
    from ms_llm.train import finetune
    from ms_llm.train.optimizer import AdamW
    from ms_llm.train.step import TrainStep

    cfg, parallel = resolved.cfg, resolved.parallel
    t, m = cfg.train, cfg.model
    backend = nn_backend.for_device(rt.device_target, cfg.context.cpu_kernels, layer_reuse=parallel.pp == 1)
    if rt.device_target == "CPU" and cfg.context.cpu_kernels and not backend.cpu_kernels:
        log(f"note: fused CPU kernels unavailable ({cpu_kernels.build_error()}); using plain MindSpore ops")
    cache = None
    if cfg.context.compile_cache and use_compile_cache and cfg.context.mode == "graph":
        why_not = compile_cache.unusable_reason()
        if why_not:  # (select_device switched MindSpore's cache off already)
            log(f"note: compile cache off: {why_not}")
        else:
            cache = compile_cache.enable(cfg, rt, purpose)
            log(f"compile cache: {'reusing' if cache.hit else 'filling'} {cache.path}")
    ms.set_seed(t.seed)
    np.random.seed(t.seed)
    semi_auto = parallel.semi_auto
    if semi_auto:
        from ms_llm.parallel.apply import configure_auto_parallel

        configure_auto_parallel(parallel, cfg.checkpoint.strategy_dir or "strategy", rt.rank)
    finetune.check(cfg, manifest, parallel)
    model = build_model(m, cfg.precision.compute_dtype, backend)
    ft = finetune.prepare(cfg, manifest, model, log)  # LoRA (before the optimizer sees the trainable parameters)
    apply_plan(model, parallel, semi_auto, log)
    optimizer = AdamW(model.trainable_params(), t.beta1, t.beta2, t.eps, t.weight_decay)
    micro_batch, accum = t.micro_batch_size, parallel.accumulation
    if parallel.pp > 1:  # one call per step: the pipeline takes all micro-batches at once and slices them itself
        step_fn = pipeline_step(model, optimizer, cfg, parallel, backend)
        micro_batch, accum = t.micro_batch_size * accum, 1
    else:  # under semi-auto parallel MindSpore inserts the data-parallel gradient reduction itself
        dp_reduce = 1 if semi_auto else rt.world_size
        step_fn = TrainStep(model, optimizer, cfg.precision, t.clip_grad, accum, dp_reduce, lr_table(t), t.anomaly,
                            backend, finetune.loss_fn(model, cfg, manifest, accum, dp_reduce),
                            loss_chunk(cfg, parallel, log))
    model.set_train(True)
    dp, data_rank = parallel.dp, parallel.data_rank(rt.rank)
    data = TrainBatches(cfg.data.dataset_dir, manifest, "train", micro_batch, dp, data_rank, t.seed,
                        m.seq_length, num_workers=cfg.data.num_workers)
    val = []
    if parallel.pp == 1:
        val = eval_batches(cfg.data.dataset_dir, manifest, t.micro_batch_size, t.eval_steps, dp, data_rank,
                           m.seq_length, cfg.data.num_workers, accum)
    elif t.eval_interval or t.eval_steps:
        log("note: no validation during training under pipeline parallelism (a forward-only pipeline is a "
            "different graph); evaluate the checkpoint with pipeline_stage: 1")
    finetune.load_extra_val(ft, cfg, manifest, model, t.micro_batch_size, dp, data_rank, accum)
    n_params = count_params(model)
    eval_step = finetune.eval_step(model, cfg, manifest) or EvalStep(model, loss_chunk(cfg, parallel), backend)
    # MoE: a token computes with top_k of each MoE layer's experts, so the FLOPs count the active parameters only
    inactive = ModelShape.from_config(m).inactive_expert_params() if m.moe is not None else 0
    s = Session(resolved, rt, log, manifest, purpose, accum, model, step_fn, eval_step, data, val, n_params,
                flops_per_token(count_params(model, exclude_positions=True) - inactive, m.num_layers,
                                m.num_heads * head_dim(m), m.seq_length),  # attention: heads × head_dim wide
                peak_tflops(rt.device_target, cfg.monitor.peak_tflops) * 1e12, cache, finetune=ft)
    moe = (f", {n_params - inactive:,} active per token ({len(moe_layers(m))} MoE layers, top-{m.moe.top_k} of "
           f"{m.moe.num_experts} experts, {'dropless' if m.moe.capacity_factor is None else 'capacity factor ' + str(m.moe.capacity_factor)})"
           if m.moe is not None else "")
    log(f"model: {m.arch}, {n_params:,} parameters{moe} ({m.num_layers} layers, hidden {m.hidden_size}, {m.num_heads} "
        f"heads, seq {m.seq_length}, vocab {m.vocab_size}); compute dtype {cfg.precision.compute_dtype}")
    if t.warmup_steps >= t.max_steps:
        log(f"note: train.warmup_steps = {t.warmup_steps} >= train.max_steps = {t.max_steps}: the learning rate "
            f"never reaches train.lr = {t.lr} in this run")
    what = "pipeline micro-batches" if parallel.pp > 1 else "accumulation"
    log(f"batch: global {t.global_batch_size} = micro {t.micro_batch_size} × {what} {parallel.accumulation} × "
        f"data-parallel {dp}; {s.tokens_per_step:,} tokens/step; device {rt.device_target}, {rt.world_size} rank(s)")
    return s


def loss_chunk(cfg, parallel, log=None):
    """train.loss_chunk_tokens where the chunked loss applies: not under semi-auto parallel, whose strategies shard
    the LM head's own matmul (the chunked loss has its own, unsharded), nor on pipeline stages."""
    chunk = cfg.train.loss_chunk_tokens
    if chunk and cfg.model.moe is not None:
        return 0  # the MoE loss (step.LossFn.routed_loss) adds the router's aux loss to the whole logits' loss
    if chunk and parallel.semi_auto:
        if log:
            log(f"note: train.loss_chunk_tokens = {chunk} is not used under semi-auto parallel (the layout shards the "
                f"LM head's matmul); the loss takes the whole logits")
        return 0
    return chunk


def pipeline_step(model, optimizer, cfg, parallel, backend):
    """The pipelined step: MindSpore's Pipeline wrapper and PipelineGradReducer (Ascend), the loss on the last
    stage, the per-micro-batch loss compiled once (lazy_inline) where the backend supports it."""
    from mindspore.parallel.nn import PipelineGradReducer

    from ms_llm.parallel.apply import assign_stages
    from ms_llm.train.lr_schedule import lr_table
    from ms_llm.train.step import PipelineTrainStep

    t = cfg.train
    reducer = PipelineGradReducer(optimizer.params, opt_shard=parallel.optimizer_shard)
    step = PipelineTrainStep(model, optimizer, cfg.precision, t.clip_grad, parallel.micro_batch_num, lr_table(t),
                             t.anomaly, reducer=reducer, reuse=backend.ascend)
    assign_stages(model, parallel, loss=step.loss_cell)
    return step


def apply_plan(model, parallel, semi_auto, log):
    from ms_llm.parallel.apply import apply_recompute, shard_model

    if semi_auto:  # pipeline stages are assigned with the pipelined step, which owns the loss cell
        applied = shard_model(model, parallel)
        log(f"parallel: {len(applied)} primitives sharded; " + parallel.table().splitlines()[0])
    apply_recompute(model, parallel)
    for w in parallel.warnings:
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
            if rt.is_main and d.format != "text":  # conversations (docs/finetuning.md)
                from ms_llm.data.chat_preprocess import preprocess_conversations

                preprocess_conversations(d.source, d.dataset_dir, cfg.model.seq_length, d.tokenizer, d.format,
                                         d.val_fraction, log=log)
            elif rt.is_main:
                from ms_llm.data.preprocess import preprocess

                preprocess(d.source, d.dataset_dir, cfg.model.seq_length, d.tokenizer, d.val_fraction, d.text_field,
                           log=log)

        agree(rt, build)
    return load_manifest(d.dataset_dir)
