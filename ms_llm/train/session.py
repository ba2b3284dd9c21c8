"""Everything a run holds, built once from a config: runtime, data, model, optimizer, step.

`open_session` does all checks that can refuse a run (config × world size, dataset × model) before it
builds anything; the trainer, the benchmark and the debugging tools all start from it, and step through a
`StepRunner` (ms_llm/train/step_runner.py; its first step compiles or loads the graphs and checks them:
ms_llm/train/compile_step.py). The session holds the resolved config (`ms_llm.train.setup.resolve`: data-parallel
size, vocabulary and strategy directory filled in, and the parallel layout), a new object: the config the caller
loaded is left as it was.
"""
from dataclasses import dataclass
from typing import Any, Callable, List, NamedTuple

import numpy as np

from ms_llm.config.validate import head_dim, moe_layers
from ms_llm.data.loader import TrainBatches, check_token_ids, eval_batches
from ms_llm.data.manifest import load_manifest
from ms_llm.errors import UserError
from ms_llm.nn.dropout import seed_dropout
from ms_llm.monitor.throughput import flops_per_token, peak_tflops
from ms_llm.parallel.shapes import ModelShape
from ms_llm.train.setup.context import Runtime, launch_world_size, select_device, setup_context
from ms_llm.train.setup.resolve import ResolvedConfig, check_launch, resolve


# Parameters of the step that are zero at every step boundary, or constant, or derived from the config: not state
# ("accu_grads."/"scale_sense": the pipeline's gradient reducer; dropout's key holds the seed and this rank's place,
# written by the session, and the step's numbers, written by the step itself)
TRANSIENT = ("grad_accum.", "accum_loss", "accu_grads.", "scale_sense", "dropout_key", "micro_batch")


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
    loss: Any  # the run's loss cell (ms_llm/train/losses): the step trains it, validation evaluates it
    data: TrainBatches
    val: List[Any]
    n_params: int
    flops_per_token: float
    peak_flops: float
    backend: Any = None  # ms_llm.nn.backend.Backend: the fused kernels the model and step were built with
    fresh_start: bool = True  # the step starts from the config's own initialisation (no resume, no loaded weights)
    finetune: Any = None  # train.finetune.FinetuneState: LoRA, data.extra_val; None: neither

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

    def checkpoint_parameters(self):
        """{name: Parameter} of what a checkpoint holds, under the parameters' own names ("layers.0.attention.qkv.weight",
        "adam_m.<same>", "loss_scale", ...): every parameter of the step but the buffers that are zero at every step
        boundary or derived from the config (TRANSIENT), and the frozen base weights of a LoRA run (its checkpoints hold
        the adapters: checkpoint/lora.py)."""
        frozen = {p.name for p in self.model.get_parameters() if not p.requires_grad}
        return {p.name: p for p in self.step_fn.get_parameters()
                if not p.name.startswith(TRANSIENT) and p.name not in frozen}

    def model_parameter_names(self):
        return {p.name for p in self.model.get_parameters()}

    def initial_state(self):
        """The step's parameters (model, optimizer moments, loss scale, counters) as this config initialises them:
        built again from the seed, apart from this session's cells, which keep their compiled graphs."""
        cfg = self.cfg
        ms_seed(cfg.train.seed)
        _, step_fn, _ = build_step(self.resolved, self.rt, self.manifest, self.backend, lambda *_: None)
        return {p.name: p.value() for p in step_fn.get_parameters()}

    def load_state(self, state):
        """Set the step's parameters to `state` ({name: Tensor}), in place."""
        for p in self.step_fn.get_parameters():
            if p.name in state:
                p.set_data(state[p.name].copy())


def open_session(cfg, echo=print, purpose="train", rt=None, strategy_dir=None, fresh_start=True):
    """Check, resolve, then build. `rt`: an already set-up runtime (the caller then ran `check_launch` before
    setting it up); `strategy_dir`: where semi-auto parallel writes its strategy files; `fresh_start`: the step will
    start from the config's own initialisation (False: the caller resumes or loads weights into it)."""
    if rt is None:  # refused before the rendezvous: every rank of a launch refuses at once
        check_launch(cfg, launch_world_size(), select_device(cfg.context))
        rt = setup_context(cfg.context)
    # the trainer's RunLog prefixes other ranks' lines itself; a plain print gets the prefix here
    log = echo if rt.is_main or echo is not print else (lambda msg: print(f"[rank {rt.rank}] {msg}", flush=True))
    manifest = dataset_manifest(cfg)
    resolved = resolve(cfg, rt.world_size, rt.device_target, manifest, strategy_dir)
    return build_session(resolved, rt, log, manifest, purpose, fresh_start)


def ms_seed(seed):
    """Seed MindSpore's initialisers and numpy: the same seed builds the same initial parameters. Also MindSpore's
    default generator, whose state checkpoints keep: set_seed leaves it alone, and MindSpore 2.7 seeds it at random
    on import, so two runs of one config would write different checkpoints."""
    import mindspore as ms

    ms.set_seed(seed)
    ms.manual_seed(seed)
    np.random.seed(seed)


def build_step(resolved, rt, manifest, backend, log):
    """Model (LoRA applied), the run's loss (chosen by ms_llm/train/losses from the config and the dataset) and the
    step cell (optimizer inside), in training mode. Called once per session, and again by `Session.initial_state`."""
    from model_zoo import build_model
    from ms_llm.train.setup import finetune
    from ms_llm.train import losses
    from ms_llm.train.optimizer import AdamW
    from ms_llm.train.step import StepSpec, TrainStep

    cfg, parallel = resolved.cfg, resolved.parallel
    t = cfg.train
    model = build_model(cfg.model, cfg.precision.compute_dtype, backend)
    ft = finetune.prepare(cfg, manifest, model, log)  # LoRA (before the optimizer sees the trainable parameters)
    apply_plan(model, parallel, log)
    seed_dropout(model, t.seed, parallel.data_rank(rt.rank), parallel.dp)
    optimizer = AdamW(model.trainable_params(), t.beta1, t.beta2, t.eps, t.weight_decay)
    spec = StepSpec.of_run(cfg, parallel, rt.world_size, model, backend)
    if parallel.pp > 1:  # one call per step: the pipeline takes all micro-batches at once and slices them itself
        step_fn = pipeline_step(model, optimizer, spec, parallel, backend)
    else:
        step_fn = TrainStep(optimizer, losses.choose(cfg, manifest, model, backend), spec)
    return model, step_fn, ft


def pipeline_step(model, optimizer, spec, parallel, backend):
    """The pipelined step: MindSpore's Pipeline wrapper and PipelineGradReducer (Ascend), the step's own loss
    placed on the last stage, compiled once for all micro-batches where the backend can call a subgraph."""
    from mindspore.parallel.nn import PipelineGradReducer

    from ms_llm.parallel.apply import assign_stages
    from ms_llm.train.pipeline_step import PipelineTrainStep

    reducer = PipelineGradReducer(optimizer.params, opt_shard=parallel.optimizer_shard)
    step_fn = PipelineTrainStep(optimizer, model, spec, parallel.micro_batch_num, reducer=reducer,
                                reuse=backend.ascend)
    assign_stages(model, parallel, loss=step_fn.loss_cell)
    return step_fn


def build_session(resolved, rt, log, manifest, purpose, fresh_start=True):
    """The session of a resolved config: model, optimizer, step, data readers."""
    from model_zoo import count_params
    from ms_llm.nn import backend as nn_backend
    from ms_llm.nn import cpu_kernels
    from ms_llm.train import losses
    from ms_llm.train.setup import finetune

    cfg, parallel = resolved.cfg, resolved.parallel
    t, m = cfg.train, cfg.model
    backend = nn_backend.for_device(rt.device_target, cfg.context.cpu_kernels, layer_reuse=parallel.pp == 1)
    if rt.device_target == "CPU" and cfg.context.cpu_kernels and not backend.cpu_kernels:
        log(f"note: fused CPU kernels unavailable ({cpu_kernels.build_error()}); using plain MindSpore ops")
    ms_seed(t.seed)
    if parallel.semi_auto:
        from ms_llm.parallel.apply import configure_auto_parallel

        configure_auto_parallel(parallel, cfg.checkpoint.strategy_dir or "strategy", rt.rank)
    finetune.check(cfg, manifest, parallel)
    for note in resolved.notes:
        log(f"note: {note}")
    model, step_fn, ft = build_step(resolved, rt, manifest, backend, log)
    micro_batch, accum = t.micro_batch_size, parallel.accumulation
    if parallel.pp > 1:  # the pipeline takes all micro-batches of a step in one call
        micro_batch, accum = t.micro_batch_size * accum, 1
    dp, data_rank = parallel.dp, parallel.data_rank(rt.rank)
    data = TrainBatches(cfg.data.dataset_dir, manifest, "train", micro_batch, dp, data_rank, t.seed,
                        m.seq_length, shuffle=cfg.data.shuffle, num_workers=cfg.data.num_workers)
    val = []
    if not t.eval_steps:
        log("note: no validation (train.eval_steps = 0)")
    elif parallel.pp == 1:
        val = eval_batches(cfg.data.dataset_dir, manifest, t.micro_batch_size, t.eval_steps, dp, data_rank,
                           m.seq_length, cfg.data.num_workers, accum)
    else:
        log("note: no validation during training under pipeline parallelism (a forward-only pipeline is a "
            "different graph); evaluate the checkpoint with pipeline_stage: 1")
    extra = finetune.load_extra_val(ft, cfg, manifest, dp, data_rank, accum)
    if extra is not None:  # data.extra_val: plain text, evaluated with the loss a run on it would get
        ft.extra_loss = losses.choose(cfg, extra, model, backend)
    n_params = count_params(model)
    # MoE: a token computes with top_k of each MoE layer's experts, so the FLOPs count the active parameters only
    inactive = ModelShape.from_config(m).inactive_expert_params() if m.moe is not None else 0
    s = Session(resolved, rt, log, manifest, purpose, accum, model, step_fn, step_fn.loss, data, val, n_params,
                flops_per_token(count_params(model, exclude_positions=True) - inactive, m.num_layers,
                                m.num_heads * head_dim(m), m.seq_length),  # attention: heads × head_dim wide
                peak_tflops(rt.device_target, cfg.monitor.peak_tflops) * 1e12, backend, fresh_start, ft)
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


def apply_plan(model, parallel, log):
    from ms_llm.parallel.apply import apply_recompute, shard_model

    if parallel.semi_auto:  # pipeline stages are assigned with the pipelined step, which owns the loss cell
        applied = shard_model(model, parallel)
        log(f"parallel: {len(applied)} primitives sharded; " + parallel.table().splitlines()[0])
    apply_recompute(model, parallel)
    for w in parallel.warnings:
        log(f"warning: {w}")


def dataset_manifest(cfg):
    """The manifest of the run's dataset (a blend's, when data.blend mixes several). The session never preprocesses:
    a missing dataset is refused with the command that makes it (ms_llm/train/setup/dataset.py prepares it first for the
    commands that train)."""
    d = cfg.data
    if d.blend:  # several preprocessed datasets mixed by weight (ms_llm.data.blend)
        return load_manifest(d.dataset_dir, blend=d.blend)
    return load_manifest(d.dataset_dir)
