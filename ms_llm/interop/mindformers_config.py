"""MindFormers Llama YAML → ms_llm config, with a row per source key (see mindformers_table).

    ms-llm convert --from-mindformers-config pretrain_llama2_7b.yaml --output llama2_7b.yaml [--samples N]

Values that change meaning are converted and the conversion is stated in the row:
  batch      MindFormers' runner_config.batch_size is per device and per micro-step; ours is the global batch:
             global = batch_size × micro_batch_interleave_num × data_parallel × gradient_accumulation_steps
             (× micro_batch_num instead of the accumulation under pipeline parallelism, as MindFormers does).
  epochs     MindFormers trains `epochs` passes; ms_llm counts optimizer steps: epochs × samples // global.
  defaults   where a key is absent, MindFormers' default is written when ours differs (weight decay 0,
             no warmup, lr_end 0, untied head, ...), so the run means what it meant there.
"""
import os

from ms_llm.errors import UserError
from ms_llm.interop.mindformers_table import Ledger, format_table, summary_counts

# LlamaConfig's defaults (mindformers/models/llama/llama_config.py) for keys a file may leave out.
MF_MODEL_DEFAULTS = {"seq_length": 2048, "hidden_size": 4096, "num_layers": 32, "num_heads": 32, "vocab_size": 32000,
                     "multiple_of": 256, "rms_norm_eps": 1e-5, "theta": 10000.0, "compute_dtype": "float16"}
# Optimizer defaults by type: (beta1, beta2, eps, weight_decay).
MF_OPTIMIZERS = {"AdamW": (0.9, 0.999, 1e-8, 0.0), "adamw": (0.9, 0.999, 1e-8, 0.0),
                 "FP32StateAdamWeightDecay": (0.9, 0.999, 1e-6, 0.0), "AdamWeightDecay": (0.9, 0.999, 1e-6, 0.0),
                 "FusedAdamWeightDecay": (0.9, 0.999, 1e-6, 0.0)}
MF_SCHEDULES = {"CosineWithWarmUpLR": "cosine", "LinearWithWarmUpLR": "linear", "ConstantWarmUpLR": "constant",
                "constant": "constant"}
DTYPES = ("float32", "float16", "bfloat16")
MC = "model.model_config."


def num(value, key, kind=float):
    """A number from YAML: PyYAML reads 1e-5 (no dot) as a string."""
    try:
        return kind(float(value)) if kind is int else kind(value)
    except (TypeError, ValueError):
        raise UserError(f"{key} = {value!r} is not a number. Fix it in the MindFormers file.") from None


def import_config(raw, samples=None, devices=None, path="the config"):
    """(our config as a dict of sections, rows, facts) for a MindFormers YAML mapping `raw`."""
    if not isinstance(raw, dict) or not isinstance((raw.get("model") or {}).get("model_config"), dict):
        raise UserError(f"{path} has no model.model_config section: it is not a MindFormers model config. Give the "
                        f"YAML you pass to MindFormers' run_mindformer.py (e.g. configs/llama2/pretrain_llama2_7b.yaml).")
    t = Ledger(raw)
    facts = {}
    model(t, facts)
    batch(t, facts, devices)
    parallel(t, facts)
    recompute(t)
    schedule(t, facts, samples)
    optimizer(t)
    precision(t)
    data(t)
    callbacks(t)
    context(t)
    top_level(t)
    return t.ours, t.finish(), facts


# --- model ------------------------------------------------------------------------------------------------

def model(t, facts):
    kind = t.get(MC + "type", "LlamaConfig")
    if kind != "LlamaConfig":
        raise UserError(f"model.model_config.type = {kind!r}: only Llama models (LlamaConfig) are imported; ms_llm's "
                        f"other family is GPT-2. Other MindFormers models have no ms_llm equivalent yet.")
    t.mapped(MC + "type", ("model.arch", "llama"), "the Llama decoder (RoPE, RMSNorm, SwiGLU, GQA)")
    arch = t.get("model.arch.type", "LlamaForCausalLM")
    if arch != "LlamaForCausalLM":
        raise UserError(f"model.arch.type = {arch!r}: only LlamaForCausalLM is imported (LoRA/prefix-tuning "
                        f"wrappers are not part of ms_llm).")
    t.ignored("model.arch.type", "the causal-LM head over the decoder: what model.arch: llama builds")
    if t.get(MC + "extend_method", "None") not in ("None", None):
        raise UserError(f"model.model_config.extend_method = {t.get(MC + 'extend_method')!r}: RoPE extension (PI/NTK) "
                        f"is not implemented in ms_llm's Llama; converting would silently change the model.")
    for key in ("qkv_has_bias", "attn_proj_has_bias"):
        if t.get(MC + key):
            raise UserError(f"model.model_config.{key} = true: ms_llm's Llama has no biases; converting would "
                            f"silently drop them.")
        t.ignored(MC + key, "no biases, as in ms_llm's Llama")
    v = {k: t.get(MC + k, d) for k, d in MF_MODEL_DEFAULTS.items()}
    for mf, ours in (("num_layers", "num_layers"), ("hidden_size", "hidden_size"), ("num_heads", "num_heads"),
                     ("vocab_size", "vocab_size"), ("seq_length", "seq_length")):
        value = num(v[mf], MC + mf, int)
        if t.has(MC + mf):
            t.mapped(MC + mf, (f"model.{ours}", value))
        else:
            t.default(MC + mf, (f"model.{ours}", value), "MindFormers' LlamaConfig default")
    kv_key = next((k for k in ("n_kv_heads", "num_key_value_heads") if t.get(MC + k) is not None), None)
    for k in ("n_kv_heads", "num_key_value_heads"):
        if k == kv_key:
            t.mapped(MC + k, ("model.num_kv_heads", num(t.get(MC + k), MC + k, int)),
                     "grouped-query attention" if t.get(MC + k) != v["num_heads"] else "")
        else:
            t.ignored(MC + k, "null: one key/value head per query head")
    ffn_size(t, v)
    t.mapped(MC + "rms_norm_eps", ("model.norm_eps", num(v["rms_norm_eps"], MC + "rms_norm_eps")))
    t.mapped(MC + "theta", ("model.rope_theta", num(v["theta"], MC + "theta")))
    if not t.has(MC + "rms_norm_eps"):
        t.default(MC + "rms_norm_eps", ("model.norm_eps", 1e-5), "MindFormers' default")
    tied = bool(t.get(MC + "tie_word_embeddings", False))
    t.mapped(MC + "tie_word_embeddings", ("model.tie_embeddings", tied))
    if not t.has(MC + "tie_word_embeddings"):
        t.default(MC + "tie_word_embeddings", ("model.tie_embeddings", False),
                  "MindFormers' Llama has its own lm_head (ms_llm's default ties it)")
    dtype = t.get(MC + "compute_dtype", "float16")
    if dtype not in DTYPES:
        raise UserError(f"model.model_config.compute_dtype = {dtype!r}: expected one of {', '.join(DTYPES)}.")
    if t.has(MC + "compute_dtype"):
        t.mapped(MC + "compute_dtype", ("precision.compute_dtype", dtype),
                 "matmuls; norms, softmax, loss and master weights stay float32")
    else:
        t.default(MC + "compute_dtype", ("precision.compute_dtype", dtype), "MindFormers' default")
    if t.has(MC + "init_method_std"):
        t.mapped(MC + "init_method_std", ("model.init_std", num(t.get(MC + "init_method_std"), "init_method_std")))
    t.ignored(MC + "scaling_factor", "used only with extend_method (none here)")
    t.ignored(MC + "extend_method", "no RoPE extension")
    t.ignored(MC + "qkv_concat", "a checkpoint-layout choice: ms_llm always fuses q/k/v; converting a checkpoint "
                                 "reads either layout")
    facts["qkv_concat"] = bool(t.get(MC + "qkv_concat", False))
    for k in ("layernorm_compute_type", "softmax_compute_type", "rotary_dtype"):
        t.ignored(MC + k, "ms_llm computes norms, softmax and RoPE tables in float32 always")
    t.ignored(MC + "param_init_type", "ms_llm keeps float32 master weights; a converted checkpoint remembers its "
                                      "own dtype")
    t.ignored(MC + "use_flash_attention", "chosen automatically: Ascend FlashAttentionScore for 16-bit compute, "
                                          "head size a multiple of 16")
    t.ignored(MC + "use_attn_mask_compression", "flash-attention mask detail; ms_llm uses the compressed causal mask")
    for k in ("use_eod_attn_mask_compression", "use_eod_reset"):
        if t.get(MC + k):
            t.unsupported(MC + k, "attention is not reset at document ends in ms_llm (packed samples attend across "
                                  "documents)")
        t.ignored(MC + k, "off")
    for k in ("fine_grain_interleave", "use_fused_rope", "use_fused_swiglu", "fused_rms_norm", "rmsnorm_compute_2d",
              "use_rope_slice", "use_ring_attention"):
        t.ignored(MC + k, "kernel choice: ms_llm picks fused kernels by device")
    for k in ("use_past", "is_dynamic", "batch_size", "block_size", "num_blocks", "repetition_penalty",
              "max_decode_length", "top_k", "top_p", "do_sample", "chunk_prefill"):
        t.ignored(MC + k, "inference setting (ms-llm sample takes --top-k, --temperature)")
    for k in ("bos_token_id", "eos_token_id", "pad_token_id", "ignore_token_id"):
        t.ignored(MC + k, "packed samples need no padding or ignored labels; the end-of-document id is the data's")
    t.ignored(MC + "checkpoint_name_or_path", "weights come from checkpoint.load_weights (a converted checkpoint)")
    offset(t)
    if (t.get(MC + "pp_interleave_num") or 1) > 1:
        t.unsupported(MC + "pp_interleave_num", "interleaved pipeline stages are not implemented: one chunk per stage")
    t.ignored(MC + "pp_interleave_num", "1: no interleaved pipeline")


def ffn_size(t, v):
    """MindFormers' LlamaFeedForward: intermediate_size, else multiple_of-rounded 2/3 of 4h (× ffn_dim_multiplier)."""
    h, multiple = num(v["hidden_size"], "hidden_size", int), num(v["multiple_of"], "multiple_of", int)
    inter, mult = t.get(MC + "intermediate_size"), t.get(MC + "ffn_dim_multiplier")
    t.mapped(MC + "multiple_of", ("model.multiple_of", multiple),
             "rounds the derived MLP width" if inter is None else "not used: intermediate_size is given")
    if inter is not None:
        t.mapped(MC + "intermediate_size", ("model.ffn_hidden_size", num(inter, "intermediate_size", int)))
        t.ignored(MC + "ffn_dim_multiplier", "intermediate_size is given")
        return
    hidden = 4 * h
    if mult is not None:
        hidden = int((num(mult, "ffn_dim_multiplier") + 0.01) * hidden)
    hidden = int(2 * hidden / 3)
    ffn = multiple * ((hidden + multiple - 1) // multiple)
    formula = (f"{multiple}·ceil(int(2/3·int(({mult}+0.01)·4·{h}))/{multiple})" if mult is not None
               else f"{multiple}·ceil(int(2/3·4·{h})/{multiple})")
    if t.has(MC + "ffn_dim_multiplier") and mult is not None:
        t.mapped(MC + "ffn_dim_multiplier", ("model.ffn_hidden_size", ffn), f"MindFormers' rule: {formula}")
        return
    t.ignored(MC + "ffn_dim_multiplier", "null")
    t.ignored(MC + "intermediate_size", "null")
    t.default(MC + "intermediate_size", ("model.ffn_hidden_size", ffn), f"MindFormers' rule: {formula}")


def offset(t):
    """MindFormers' per-stage layer offsets → our explicit stage_layers (balanced split + offset)."""
    off = t.get(MC + "offset", 0)
    pp = int(t.get("parallel_config.pipeline_stage", 1))
    layers = int(t.get(MC + "num_layers", 32))
    if off == 0 or (isinstance(off, list) and not any(off)):
        t.ignored(MC + "offset", "no offsets: layers split evenly over the pipeline stages")
        return
    if isinstance(off, list) and len(off) == pp:
        base = layers // pp
        stage_layers = [base + int(o) for o in off]
        stage_layers[-1] += layers - sum(stage_layers)
        t.mapped(MC + "offset", ("parallel_config.stage_layers", stage_layers),
                 f"{layers} layers / {pp} stages + offsets")
        return
    t.unsupported(MC + "offset", f"cannot turn offset {off!r} into layers per stage for pipeline_stage = {pp}; set "
                                 f"parallel_config.stage_layers yourself")


# --- batch and parallel layout ----------------------------------------------------------------------------

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
    for k in ("data_parallel", "model_parallel", "pipeline_stage", "vocab_emb_dp", "gradient_aggregation_group"):
        if t.has(pc + k):
            t.mapped(pc + k, (pc + k, t.get(pc + k)))
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
    for k in ("expert_parallel", "context_parallel"):
        if (t.get(pc + k) or 1) > 1:
            t.unsupported(pc + k, f"{k.replace('_', ' ')} is not implemented in ms_llm")
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


# --- data, callbacks, context, the rest --------------------------------------------------------------------

def data(t):
    td = "train_dataset."
    d = t.get(td + "data_loader.dataset_dir")
    if d:
        folder = os.path.dirname(d) if d.endswith(".mindrecord") or os.path.isfile(d) else d.rstrip("/")
        t.mapped(td + "data_loader.dataset_dir", ("data.dataset_dir", folder or "."),
                 ("the folder of that file; " if folder != d else "")
                 + "a MindFormers MindRecord needs a manifest.json first (ms-llm data adopt)")
    else:
        t.action(td + "data_loader.dataset_dir", "empty: set data.dataset_dir to the dataset folder")
    t.ignored(td + "data_loader.type", "MindDataset: what ms_llm reads")
    t.ignored(td + "data_loader.shuffle", "ms_llm shuffles every epoch with a permutation drawn from train.seed")
    cols = t.get(td + "input_columns", ["input_ids"])
    if "labels" in cols:
        t.unsupported(td + "input_columns", "the labels column is not read: ms_llm's loss covers every next token "
                                            "of input_ids (no prompt masking)")
    t.ignored(td + "input_columns", "ms_llm reads input_ids (seq_length + 1 tokens per sample)")
    t.ignored(td + "num_parallel_workers", "reader threads suit the host, not the run: set data.num_workers for "
                                           "yours (default 1; MindSpore refuses more than the host's CPUs)")
    t.ignored(td + "batch_size", "MindFormers replaces it with runner_config.batch_size too")
    for k in ("python_multiprocessing", "drop_remainder", "repeat", "numa_enable", "prefetch_size", "seed"):
        t.ignored(td + k, "pipeline detail ms_llm sets itself (batches never end short: epochs join)")
    t.ignore_prefix("train_dataset_task.", "the dataset task wrapping train_dataset")
    t.ignore_prefix("eval_dataset", "ms_llm evaluates on the val split of data.dataset_dir")
    if t.get("do_eval", False):
        step = t.get("eval_step_interval", -1)
        if step and step > 0:
            t.mapped("eval_step_interval", ("train.eval_interval", int(step)))
        t.ignored("do_eval", "on: every eval_step_interval steps")
    else:
        t.mapped("do_eval", ("train.eval_interval", 0), "ms_llm still evaluates once at the end")
        t.ignored("eval_step_interval", "do_eval is off")
        if not t.has("do_eval"):
            t.default("do_eval", ("train.eval_interval", 0), "MindFormers does not evaluate while training by "
                                                             "default; ms_llm still evaluates once at the end")
    t.ignored("eval_step_interval", "-1: evaluation only at the end")
    t.ignored("eval_epoch_interval", "ms_llm counts steps, not epochs")


CALLBACK_NOTES = {
    "MFLossMonitor": "the log line and metrics.jsonl every train.log_interval steps",
    "ObsMonitor": "copies to OBS: checkpoint.remote_dir (see remote_save_url)",
    "SummaryMonitor": "Insight summaries under <run>/summary (monitor.summary)",
    "ProfileMonitor": "the profiler window: monitor.profile",
    "TrainingStateMonitor": "per-layer statistics: monitor.tensor_stats",
    "CheckpointMonitor": "the checkpoint section",
    "EvalCallBack": "train.eval_interval",
}


def callbacks(t):
    i = 0
    while t.has(f"callbacks[{i}].type"):
        p = f"callbacks[{i}]."
        kind = t.get(p + "type")
        if kind not in CALLBACK_NOTES:
            t.unsupported(p + "type", "no ms_llm equivalent for this callback")
            t.ignore_prefix(p, f"belongs to {kind}")
            i += 1
            continue
        if kind == "SummaryMonitor":
            t.mapped(p + "type", ("monitor.summary", True), CALLBACK_NOTES[kind])
            t.ignore_prefix(p, "summaries go to <run>/summary")
        t.ignored(p + "type", CALLBACK_NOTES[kind])
        if kind == "MFLossMonitor" and t.has(p + "per_print_times"):
            t.mapped(p + "per_print_times", ("train.log_interval", int(t.get(p + "per_print_times"))))
        if kind == "CheckpointMonitor":
            if t.has(p + "save_checkpoint_steps"):
                t.mapped(p + "save_checkpoint_steps",
                         ("checkpoint.save_interval", int(t.get(p + "save_checkpoint_steps"))))
            keep = int(t.get(p + "keep_checkpoint_max", 5))
            t.mapped(p + "keep_checkpoint_max", ("checkpoint.keep_last", keep))
            if not t.has(p + "keep_checkpoint_max"):
                t.default(p + "keep_checkpoint_max", ("checkpoint.keep_last", 5), "CheckpointMonitor's default")
            t.mapped(p + "async_save", ("checkpoint.async_save", bool(t.get(p + "async_save"))))
            fmt = t.get(p + "checkpoint_format", "ckpt")
            if fmt in ("ckpt", "safetensors"):
                t.mapped(p + "checkpoint_format", ("checkpoint.format", fmt))
            t.ignored(p + "prefix", "ms_llm names checkpoints step_<n>")
            t.ignored(p + "integrated_save", "each rank writes its own checkpoint; `ms-llm convert --merge` joins "
                                             "tensor-parallel shards")
            t.ignored(p + "directory", "checkpoints go to <run>/checkpoints/rank_<r>")
            for k in ("save_network_params", "save_trainable_params", "remove_redundancy", "save_checkpoint_seconds"):
                t.ignored(p + k, "ms_llm saves the full training state every save_interval steps")
        t.ignore_prefix(p, f"{kind} setting ms_llm has no knob for")
        i += 1
    t.ignore_prefix("eval_callbacks", "ms_llm's evaluation logs val_loss to the same log line and metrics.jsonl")


def context(t):
    c = "context."
    mode = t.get(c + "mode", 0)
    t.mapped(c + "mode", ("context.mode", "pynative" if mode in (1, "PYNATIVE_MODE") else "graph"))
    target = t.get(c + "device_target", "Ascend")
    t.mapped(c + "device_target", ("context.device_target", "auto"),
             f"auto picks Ascend where present (was {target!r}); the config stays checkable on a CPU")
    t.mapped(c + "max_device_memory", ("context.max_device_memory", str(t.get(c + "max_device_memory"))))
    level = t.get(c + "jit_config.jit_level")
    if level in ("O0", "O1", "O2"):
        t.mapped(c + "jit_config.jit_level", ("context.jit_level", level))
    if t.has(c + "runtime_num_threads"):
        t.mapped(c + "runtime_num_threads", ("context.num_threads", int(t.get(c + "runtime_num_threads"))))
    t.ignored(c + "device_id", "each rank's device comes from msrun")
    for k in t.keys(c):
        t.ignored(k, "a MindSpore compiler/debug option ms_llm leaves at its default")


def top_level(t):
    t.mapped("seed", ("train.seed", int(t.get("seed", 0))), "init, data order and dropout")
    mode = t.get("run_mode", "train")
    if mode in ("train", "finetune"):
        t.ignored("run_mode", "training" + (": fine-tuning is training from checkpoint.load_weights"
                                             if mode == "finetune" else ""))
    else:
        t.unsupported("run_mode", f"{mode!r}: ms-llm convert imports training configs (generation: ms-llm sample)")
    ckpt = t.get("load_checkpoint", "")
    if ckpt:
        t.action("load_checkpoint", f"convert it: ms-llm convert --from-mindformers {ckpt} --config <this output> "
                                    f"--output DIR, then --set checkpoint.load_weights=DIR/model.ckpt")
    t.ignored("load_checkpoint", "empty: training starts from random weights")
    if t.get("resume_training"):
        t.unsupported("resume_training", "MindFormers optimizer state is not converted: start from its weights "
                                         "(checkpoint.load_weights); ms_llm runs resume with --resume")
    t.ignored("resume_training", "off")
    t.ignored("auto_trans_ckpt", "ms_llm shards a full checkpoint itself for any layout")
    t.ignored("src_strategy_path_or_dir", "strategy files are read by `ms-llm convert --from-mindformers DIR "
                                          "--strategy S` when merging a sharded checkpoint")
    t.ignored("only_save_strategy", "`ms-llm plan` and `--dry-run` check a layout without training")
    t.ignored("output_dir", "each run gets its own --run-dir (runs/<config>-<time>)")
    t.ignore_prefix("trainer.", "ms_llm has one trainer; the model comes from model.arch")
    t.ignore_prefix("processor.", "tokenizing happens before training: the dataset's manifest.json names the tokenizer")
    t.ignore_prefix("metric.", "ms_llm reports validation loss (perplexity = exp(val_loss))")
    url = t.get("remote_save_url", "")
    if isinstance(url, str) and url.startswith(("obs://", "s3://")):
        t.mapped("remote_save_url", ("checkpoint.remote_dir", url), "every completed checkpoint is copied there")
    t.ignored("remote_save_url", "not a URL (the template's placeholder)")
    if t.get("profile", False):
        start, stop = int(t.get("profile_start_step", 1)), int(t.get("profile_stop_step", 10))
        t.mapped("profile", [("monitor.profile.start_step", start), ("monitor.profile.stop_step", stop)],
                 f"steps {start}-{stop} with mindspore.Profiler; top-10 operators printed")
        t.ignored("profile_start_step", "in monitor.profile.start_step")
        t.ignored("profile_stop_step", "in monitor.profile.stop_step")
    t.ignored("profile", "off")
    for k in ("profile_start_step", "profile_stop_step"):
        t.ignored(k, "profiling is off")
    for k in ("init_start_profile", "profile_communication", "profile_memory", "profile_level", "profile_output",
              "profile_rank_ids", "profile_pipeline", "profile_with_stack", "profiler_level", "with_stack"):
        t.ignored(k, "ms_llm's profiler window records operators and memory on the profiled rank")
    moe = t.get("moe_config.expert_num", 1)
    if moe and moe > 1:
        raise UserError(f"moe_config.expert_num = {moe}: mixture-of-experts Llama is not implemented in ms_llm; "
                        f"converting would silently give a dense model.")
    t.ignore_prefix("moe_config.", "expert_num 1: a dense model")
    if t.get("layer_scale"):
        t.unsupported("layer_scale", "layer-wise learning-rate decay is not implemented")
    for k in ("layer_scale", "layer_decay", "lr_scale_factor"):
        t.ignored(k, "layer-wise learning-rate scaling is off")
    for k in ("auto_tune", "filepath_prefix", "autotune_per_step"):
        t.ignored(k, "hyper-parameter auto-tuning (off); `ms-llm plan --search` ranks parallel layouts")


# --- the command ------------------------------------------------------------------------------------------

def convert_config(src, out, samples=None, devices=None, log=print):
    from ms_llm.config import from_dict
    from ms_llm.config.loader import read_yaml
    from ms_llm.config.validate import validate_config
    from ms_llm.parallel.memory import ModelShape

    if samples is not None and samples <= 0:
        raise UserError(f"--samples = {samples} must be the (positive) number of training samples in the dataset.")
    if os.path.exists(out):
        raise UserError(f"--output '{out}' already exists: choose another file name (a converted config is never "
                        f"overwritten).")
    raw = read_yaml(src)
    if samples is None:
        samples = count_samples(raw)
    ours, rows, facts = import_config(raw, samples, devices, f"'{src}'")
    cfg = validate_config(from_dict(ours))
    pc = cfg.parallel_config
    if pc.data_parallel:  # the layout must also pass the planner's checks (micro-batches, divisibility)
        from ms_llm.parallel.layout import build_plan

        build_plan(cfg, pc.data_parallel * pc.model_parallel * pc.pipeline_stage)
    log(format_table(rows))
    counts = summary_counts(rows)
    log("\n" + ", ".join(f"{n} {s}" for s, n in counts.items()) + f" ({len(rows)} rows)")
    n = ModelShape.from_config(cfg.model).total_params()
    m, tr = cfg.model, cfg.train
    log(f"model: llama, {n:,} parameters ({m.num_layers} layers, hidden {m.hidden_size}, {m.num_heads} heads, "
        f"{m.num_kv_heads} kv heads, ffn {m.ffn_hidden_size}, seq {m.seq_length}, vocab {m.vocab_size})")
    log(f"batch: global {tr.global_batch_size} = micro {tr.micro_batch_size} × data-parallel {facts['dp']} × "
        f"{'pipeline micro-batches' if facts['pp'] > 1 else 'accumulation'} "
        f"{tr.global_batch_size // (tr.micro_batch_size * facts['dp'])}")
    write_yaml(ours, out, src, counts)
    log(f"wrote {out}. Next: ms-llm plan --config {out}; ms-llm train --config {out} --dry-run")
    return cfg, rows


def count_samples(raw):
    """Training samples in train_dataset's MindRecord when it is readable here (epochs → steps), else None."""
    d = ((raw.get("train_dataset") or {}).get("data_loader") or {}).get("dataset_dir")
    if not d or not os.path.exists(d):
        return None
    from ms_llm.interop.mindrecord_count import count

    return count(d)


def write_yaml(ours, out, src, counts):
    import yaml

    header = (f"# Converted from the MindFormers config {os.path.basename(src)} by `ms-llm convert "
              f"--from-mindformers-config`.\n# Keys: " + ", ".join(f"{n} {s}" for s, n in counts.items())
              + ". The command printed what became of each.\n")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    class Dumper(yaml.SafeDumper):  # sections as blocks, short lists ([4, 0]) inline
        pass

    Dumper.add_representer(list, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=True))
    with open(out, "w", encoding="utf-8") as f:
        f.write(header)
        yaml.dump(ours, f, Dumper=Dumper, sort_keys=False, default_flow_style=False)
