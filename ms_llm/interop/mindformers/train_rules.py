"""MindFormers batch, parallel layout, recompute, LR schedule, optimizer and loss-scale keys → our `train`,
`parallel_config`, `recompute_config` and `precision` sections (one row per key)."""
from ms_llm.errors import UserError
from ms_llm.interop.mindformers.table import num

# Optimizer defaults by type: (beta1, beta2, eps, weight_decay).
MF_OPTIMIZERS = {"AdamW": (0.9, 0.999, 1e-8, 0.0), "adamw": (0.9, 0.999, 1e-8, 0.0),
                 "FP32StateAdamWeightDecay": (0.9, 0.999, 1e-6, 0.0), "AdamWeightDecay": (0.9, 0.999, 1e-6, 0.0),
                 "FusedAdamWeightDecay": (0.9, 0.999, 1e-6, 0.0)}
MF_SCHEDULES = {"CosineWithWarmUpLR": "cosine", "LinearWithWarmUpLR": "linear", "ConstantWarmUpLR": "constant",
                "constant": "constant"}


def batch(t, facts, devices):
    pp = int(t.get("parallel_config.pipeline_stage", 1)) if t.get("use_parallel", False) else 1
    bs = num(t.get("runner_config.batch_size", 1), "runner_config.batch_size", int)
    gas = num(t.get("runner_config.gradient_accumulation_steps", 1), "gradient_accumulation_steps", int)
    interleave = num(t.get("micro_batch_interleave_num", 1), "micro_batch_interleave_num", int)
    mbn = num(t.get("parallel_config.micro_batch_num", 1), "parallel_config.micro_batch_num", int)
    if t.get("use_parallel", False):
        dp = num(t.get("parallel_config.data_parallel", 1), "parallel_config.data_parallel", int)
        dp_text = f"data_parallel {dp}"
    else:
        dp = devices or 1
        dp_text = f"{dp} device(s) (use_parallel: false; --devices N for more)"
    micro = bs * interleave
    if pp > 1:
        global_batch = micro * dp * mbn
        formula = f"{bs}{f' × interleave {interleave}' if interleave > 1 else ''} × {dp_text} × micro_batch_num {mbn}"
    else:
        global_batch = micro * dp * gas
        formula = f"{bs}{f' × interleave {interleave}' if interleave > 1 else ''} × {dp_text} × accumulation {gas}"
    facts.update(global_batch=global_batch, micro=micro, dp=dp, pp=pp)
    t.mapped("runner_config.batch_size",
             [("train.micro_batch_size", micro), ("train.global_batch_size", global_batch)],
             f"per device per micro-step in MindFormers; ours is global = {formula} = {global_batch}")
    if not t.has("runner_config.batch_size"):
        t.default("runner_config.batch_size", [("train.micro_batch_size", micro),
                                               ("train.global_batch_size", global_batch)],
                  f"MindFormers' default 1; global = {formula}")
    if pp > 1:
        t.ignored("runner_config.gradient_accumulation_steps", "MindFormers ignores it under pipeline parallelism: "
                                                              "micro_batch_num gives the micro-batches")
    else:
        t.ignored("runner_config.gradient_accumulation_steps",
                  f"in train.global_batch_size: ms_llm derives accumulation = global / (micro × data_parallel) = {gas}")
    if interleave > 1:
        t.mapped("micro_batch_interleave_num", ("train.micro_batch_size", micro),
                 f"MindFormers feeds batch_size × {interleave} per device; ms_llm runs it as one micro-batch of "
                 f"{micro} (no interleaved halves to overlap communication)")
    t.ignored("micro_batch_interleave_num", "1: no interleaving")
    for k in ("sink_mode", "sink_size"):
        t.ignored(f"runner_config.{k}", "data sinking: ms_llm feeds one batch per compiled step")
    t.ignored("runner_config.initial_epoch", "ms_llm resumes from its own checkpoints' data position")
    if t.get("use_parallel", False):
        t.ignored("use_parallel", "ms_llm picks data or semi-auto parallel from parallel_config and the ranks launched")
    else:
        t.mapped("use_parallel", ("parallel_config.data_parallel", None),
                 "stand-alone / data parallel: data_parallel = the ranks msrun launches")


def parallel(t, facts):
    pc = "parallel_config."
    if not t.get("use_parallel", False):
        t.ignore_prefix(pc, "use_parallel is false: MindFormers ignores parallel_config (one device, or data "
                            "parallel over the launched ranks)")
        t.ignore_prefix("parallel.", "use_parallel is false: no parallel context")
        return
    mp = int(t.get(pc + "model_parallel", 1))
    for k in ("data_parallel", "model_parallel", "pipeline_stage", "vocab_emb_dp"):
        if t.has(pc + k):
            t.mapped(pc + k, (pc + k, t.get(pc + k)))
    if t.has(pc + "gradient_aggregation_group"):
        t.ignored(pc + "gradient_aggregation_group", "MindSpore fuses the gradient all-reduce itself; ms_llm has no "
                                                     "such setting")
    if t.get(pc + "use_seq_parallel", False) and mp == 1:
        t.mapped(pc + "use_seq_parallel", (pc + "use_seq_parallel", False),
                 "no effect without model_parallel > 1 (ms_llm refuses the combination)")
    t.mapped(pc + "use_seq_parallel", (pc + "use_seq_parallel", bool(t.get(pc + "use_seq_parallel", False))))
    if facts["pp"] > 1:
        t.mapped(pc + "micro_batch_num", (pc + "micro_batch_num", int(t.get(pc + "micro_batch_num", 1))),
                 "pipeline micro-batches per step")
    else:
        t.ignored(pc + "micro_batch_num", "used only with pipeline_stage > 1")
    t.mapped(pc + "optimizer_shard", (pc + "optimizer_shard", bool(t.get(pc + "optimizer_shard"))))
    if (t.get(pc + "expert_parallel") or 1) > 1:  # with moe_config, moe_rules maps it first
        t.unsupported(pc + "expert_parallel", "no moe_config.expert_num > 1: there are no experts to split")
    if (t.get(pc + "context_parallel") or 1) > 1:
        t.unsupported(pc + "context_parallel", "context parallelism is not implemented in ms_llm")
    for k in ("expert_parallel", "context_parallel"):
        t.ignored(pc + k, "1: off")
    t.ignored(pc + "mem_coeff", "a coefficient of MindSpore's auto-parallel strategy search (not used)")
    for k in t.keys(pc + "recompute"):
        t.ignored(k, "see recompute_config")
    mode = t.get("parallel.parallel_mode", 1)
    if mode in (2, 3, "auto_parallel", "hybrid_parallel"):
        t.unsupported("parallel.parallel_mode", "strategy search is not used: ms_llm applies parallel_config's "
                                                "strategies (semi-auto); `ms-llm plan --search` ranks layouts instead")
    t.ignored("parallel.parallel_mode", "ms_llm: data parallel when model_parallel × pipeline_stage = 1, else "
                                        "semi-auto with parallel_config's strategies")
    t.ignored("parallel.search_mode", "auto-parallel strategy search (not used)")
    t.ignored("parallel.gradients_mean", "ms_llm's loss is the mean over the global batch; gradients are averaged "
                                         "over data-parallel ranks")
    t.ignored("parallel.full_batch", "each rank reads its own slice of the global batch (same math)")
    t.mapped("parallel.enable_parallel_optimizer",
             (pc + "optimizer_shard", bool(t.get("parallel.enable_parallel_optimizer"))),
             "shards AdamW state over data-parallel ranks")
    t.ignored("parallel.enable_alltoall", "all-to-all is for MoE (not in ms_llm)")
    t.ignored("parallel.strategy_ckpt_save_file", "ms_llm saves strategy files per rank under checkpoint.strategy_dir")
    t.ignore_prefix("parallel.strategy_ckpt_config.", "ms_llm saves strategy files per rank under "
                                                      "checkpoint.strategy_dir")
    t.ignore_prefix("parallel.parallel_optimizer_config.", "optimizer-sharding tuning MindSpore decides")
    t.ignore_prefix("parallel.pipeline_config.", "ms_llm's pipeline schedule is MindSpore's default 1F1B")
    t.ignore_prefix("parallel.dataset_strategy", "each rank reads its own slice of the global batch")


def recompute(t):
    rc = "recompute_config."
    r = t.get(rc + "recompute", False)
    if isinstance(r, (bool, list)):
        t.mapped(rc + "recompute", (rc + "recompute", r), "layers per pipeline stage" if isinstance(r, list) else "")
    else:
        t.unsupported(rc + "recompute", f"{r!r}: expected true/false or layers per stage")
    s = t.get(rc + "select_recompute", False)
    if isinstance(s, bool):
        t.mapped(rc + "select_recompute", (rc + "select_recompute", s),
                 "attention core + MLP activation" if s else "")
    else:
        t.unsupported(rc + "select_recompute", "per-layer or per-operator lists: ms_llm's select_recompute is "
                                               "on/off for all layers; set to true", (rc + "select_recompute", True))
    for k in ("select_comm_recompute", "parallel_optimizer_comm_recompute", "mp_comm_recompute",
              "recompute_slice_activation", "select_recompute_exclude", "select_comm_recompute_exclude"):
        t.ignored(rc + k, "communication recompute: a MindSpore graph option ms_llm does not expose")


# --- schedule and optimizer -------------------------------------------------------------------------------

def schedule(t, facts, samples):
    ls = "lr_schedule."
    g = facts["global_batch"]
    epochs = t.get("runner_config.epochs", 1)
    max_steps = None
    if samples:
        max_steps = max(1, int(epochs) * (int(samples) // g))
        t.mapped("runner_config.epochs", ("train.max_steps", max_steps),
                 f"{epochs} epoch(s) × ({samples:,} samples // global batch {g})")
    else:
        t.action("runner_config.epochs", f"needs the dataset size: pass --samples N (or make train_dataset's "
                                         f"dataset_dir readable); train.max_steps = {epochs} × N // {g}. Left at "
                                         f"ms_llm's default (2000)")
    facts["max_steps"] = max_steps
    kind = t.get(ls + "type", "CosineWithWarmUpLR" if t.has(ls + "learning_rate") else "constant")
    if kind in MF_SCHEDULES:
        t.mapped(ls + "type", ("train.lr_schedule", MF_SCHEDULES[kind]))
        if not t.has(ls + "type"):
            t.default(ls + "type", ("train.lr_schedule", MF_SCHEDULES[kind]), "no lr_schedule: a constant rate")
    else:
        t.unsupported(ls + "type", f"ms_llm has cosine, linear and constant decay; kept cosine",
                      ("train.lr_schedule", "cosine"))
    lr = t.get(ls + "learning_rate", t.get("optimizer.learning_rate"))
    if lr is not None:
        t.mapped(ls + "learning_rate", ("train.lr", num(lr, "learning_rate")), "peak")
        if t.has(ls + "learning_rate"):
            t.ignored("optimizer.learning_rate", "lr_schedule.learning_rate is the one MindFormers uses")
        else:
            t.mapped("optimizer.learning_rate", ("train.lr", num(lr, "learning_rate")), "peak")
    lr_end = num(t.get(ls + "lr_end", 0.0), "lr_schedule.lr_end")
    if lr is not None and lr_end > num(lr, "learning_rate"):
        raise UserError(f"lr_schedule.lr_end = {lr_end} is above learning_rate = {lr}: ms_llm decays from lr to "
                        f"min_lr. Fix the MindFormers file.")
    if t.has(ls + "lr_end"):
        t.mapped(ls + "lr_end", ("train.min_lr", lr_end), "final rate of the decay")
    else:
        t.default(ls + "lr_end", ("train.min_lr", 0.0), "MindFormers decays to 0 by default (ms_llm to lr/10)")
    total = t.get(ls + "total_steps")
    total = None if total in (None, -1) else num(total, "lr_schedule.total_steps", int)
    decay = t.get(ls + "decay_steps")
    if total is not None:
        t.mapped(ls + "total_steps", ("train.decay_steps", total), "the decay ends there (min_lr after)")
    else:
        t.ignored(ls + "total_steps", "-1: the decay spans the whole run (train.decay_steps null)")
    if decay is not None:
        t.mapped(ls + "decay_steps", ("train.decay_steps", num(decay, "decay_steps", int)))
    span = total or max_steps
    if t.get(ls + "warmup_steps") is not None:
        t.mapped(ls + "warmup_steps", ("train.warmup_steps", num(t.get(ls + "warmup_steps"), "warmup_steps", int)))
        t.ignored(ls + "warmup_ratio", "warmup_steps is given")
    elif t.get(ls + "warmup_ratio") is not None:
        ratio = num(t.get(ls + "warmup_ratio"), "warmup_ratio")
        if span:
            t.mapped(ls + "warmup_ratio", ("train.warmup_steps", int(span * ratio)), f"int({span} steps × {ratio})")
        else:
            t.action(ls + "warmup_ratio", f"needs the run length (pass --samples N): train.warmup_steps = "
                                          f"int(steps × {ratio}). Left at ms_llm's default (100)")
    else:
        t.default(ls + "warmup_steps", ("train.warmup_steps", 0), "MindFormers' default: no warmup")
    if num(t.get(ls + "warmup_lr_init", 0.0), "warmup_lr_init"):
        t.unsupported(ls + "warmup_lr_init", "ms_llm's warmup starts from 0")
    t.ignored(ls + "warmup_lr_init", "0: warmup starts from 0, as in ms_llm")
    if num(t.get(ls + "num_cycles", 0.5), "num_cycles") != 0.5:
        t.unsupported(ls + "num_cycles", "ms_llm's cosine is the half wave (num_cycles 0.5)")
    t.ignored(ls + "num_cycles", "0.5: the half-cosine ms_llm uses")


def optimizer(t):
    op = "optimizer."
    kind = t.get(op + "type", "AdamW")
    if kind not in MF_OPTIMIZERS:
        t.unsupported(op + "type", f"ms_llm trains with AdamW (fp32 moments); {kind} is not available")
        beta1, beta2, eps, wd = MF_OPTIMIZERS["AdamW"]
    else:
        t.ignored(op + "type", "ms_llm's AdamW: fp32 moments, decoupled weight decay on matrices only")
        beta1, beta2, eps, wd = MF_OPTIMIZERS[kind]
    betas = t.get(op + "betas")
    if isinstance(betas, (list, tuple)) and len(betas) == 2:
        t.mapped(op + "betas", [("train.beta1", num(betas[0], "betas")), ("train.beta2", num(betas[1], "betas"))])
    else:
        for i, k in ((0, "beta1"), (1, "beta2")):
            if t.has(op + k):
                t.mapped(op + k, (f"train.{k}", num(t.get(op + k), op + k)))
            else:
                t.default(op + k, (f"train.{k}", (beta1, beta2)[i]), f"{kind}'s default")
    if t.has(op + "eps"):
        t.mapped(op + "eps", ("train.eps", num(t.get(op + "eps"), "optimizer.eps")))
    else:
        t.default(op + "eps", ("train.eps", eps), f"{kind}'s default")
    if t.has(op + "weight_decay"):
        t.mapped(op + "weight_decay", ("train.weight_decay", num(t.get(op + "weight_decay"), "weight_decay")),
                 "ms_llm decays matrices only (not norms)")
    else:
        t.default(op + "weight_decay", ("train.weight_decay", wd), f"{kind}'s default (ms_llm's is 0.1)")
    t.ignored(op + "learning_rate", "lr_schedule.learning_rate is the one MindFormers uses")


def precision(t):
    rw = "runner_wrapper."
    t.ignored(rw + "type", "ms_llm's compiled step: loss scaling, accumulation, clipping, AdamW")
    sense = t.get(rw + "scale_sense")
    if isinstance(sense, (int, float)) and not isinstance(sense, bool):
        value = float(sense)
        pairs = [("precision.loss_scale", "none")] if value == 1.0 else \
            [("precision.loss_scale", "static"), ("precision.init_scale", value)]
        t.mapped(rw + "scale_sense", pairs, "a fixed scale" + (" of 1: no scaling" if value == 1.0 else ""))
    else:
        kind = t.get(rw + "scale_sense.type", "DynamicLossScaleUpdateCell")
        value = num(t.get(rw + "scale_sense.loss_scale_value", 2 ** 24 if "Dynamic" in kind else 1),
                    "loss_scale_value")
        if "Dynamic" in kind:
            t.mapped(rw + "scale_sense.type", ("precision.loss_scale", "dynamic"))
            t.mapped(rw + "scale_sense.loss_scale_value", ("precision.init_scale", value))
            t.mapped(rw + "scale_sense.scale_factor",
                     ("precision.scale_factor", num(t.get(rw + "scale_sense.scale_factor", 2), "scale_factor")))
            t.mapped(rw + "scale_sense.scale_window",
                     ("precision.scale_window", num(t.get(rw + "scale_sense.scale_window", 1000), "scale_window", int)))
        elif "Fixed" in kind:
            if value == 1.0:
                t.mapped(rw + "scale_sense.type", ("precision.loss_scale", "none"), "a fixed scale of 1: no scaling")
                t.ignored(rw + "scale_sense.loss_scale_value", "1: no scaling")
            else:
                t.mapped(rw + "scale_sense.type", ("precision.loss_scale", "static"))
                t.mapped(rw + "scale_sense.loss_scale_value", ("precision.init_scale", value))
        else:
            t.unsupported(rw + "scale_sense.type", f"{kind}: ms_llm has dynamic, static or no loss scaling")
        if not t.keys(rw + "scale_sense"):
            t.default(rw + "scale_sense", ("precision.loss_scale", "none"), "no scale_sense: MindFormers does "
                                                                            "not scale the loss")
    clip = t.get(rw + "use_clip_grad", False)
    norm = num(t.get(rw + "max_grad_norm", 1.0), "max_grad_norm")
    t.mapped(rw + "use_clip_grad", ("train.clip_grad", norm if clip else 0.0),
             f"global-norm clipping at {norm}" if clip else "no clipping")
    if not t.has(rw + "use_clip_grad"):
        t.default(rw + "use_clip_grad", ("train.clip_grad", 0.0), "MindFormers does not clip by default")
    t.ignored(rw + "max_grad_norm", "in train.clip_grad" if clip else "clipping is off")
