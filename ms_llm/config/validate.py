"""Checks that need more than one field, and values derived from several fields.

`validate_config` runs on every load: static checks, and the values derived from the config alone (key/value
heads, FFN width). Values that depend on the launch (data-parallel size) and the data (vocabulary) are filled in
once, by ms_llm.train.setup.resolve (with `check_against_dataset` here), into new Config objects; a loaded config is
never changed (its sections are frozen dataclasses).
"""
import dataclasses
from dataclasses import replace

from ms_llm.errors import UserError, closest

STOP_SEVERITIES = ("warning", "error")  # train.stop_on: what the live diagnosis may end a run for


def derived_ffn_hidden_size(m):
    if m.ffn_hidden_size:
        return m.ffn_hidden_size
    if m.arch == "gpt2":
        return 4 * m.hidden_size
    hidden = int(2 * (4 * m.hidden_size) / 3)  # SwiGLU has 3 matrices: keep the parameter count of a 4h MLP
    return m.multiple_of * ((hidden + m.multiple_of - 1) // m.multiple_of)


def validate_config(cfg):
    m, t, p = cfg.model, cfg.train, cfg.precision
    positive = [("model.num_layers", m.num_layers), ("model.hidden_size", m.hidden_size),
                ("model.num_heads", m.num_heads), ("model.seq_length", m.seq_length),
                ("model.multiple_of", m.multiple_of),
                ("train.global_batch_size", t.global_batch_size), ("train.micro_batch_size", t.micro_batch_size),
                ("train.max_steps", t.max_steps), ("train.log_interval", t.log_interval),
                ("precision.scale_window", p.scale_window),
                ("parallel_config.model_parallel", cfg.parallel_config.model_parallel),
                ("parallel_config.expert_parallel", cfg.parallel_config.expert_parallel),
                ("parallel_config.pipeline_stage", cfg.parallel_config.pipeline_stage),
                ("parallel_config.micro_batch_num", cfg.parallel_config.micro_batch_num)]
    for name, v in positive:
        if v <= 0:
            raise UserError(f"{name} = {v} must be a positive integer.")
    if cfg.data.extra_val and not t.eval_steps:
        raise UserError(f"data.extra_val = '{cfg.data.extra_val}' is a second validation set, and train.eval_steps = 0 "
                        f"turns validation off. Set train.eval_steps to the number of validation batches per pass "
                        f"(e.g. 20), or data.extra_val: null.")
    bad = [x for x in (t.stop_on or []) if x not in STOP_SEVERITIES]
    if bad:
        raise UserError(f"train.stop_on = {list(t.stop_on)}: {bad[0]!r} is not a severity. List the severities of "
                        f"the live diagnosis that end the run: {', '.join(STOP_SEVERITIES)} (e.g. [error]), or null "
                        f"to never stop.")
    for name, v in [("model.num_kv_heads", m.num_kv_heads), ("model.ffn_hidden_size", m.ffn_hidden_size),
                    ("model.vocab_size", m.vocab_size), ("parallel_config.data_parallel",
                                                         cfg.parallel_config.data_parallel)]:
        if v is not None and v <= 0:
            raise UserError(f"{name} = {v} must be a positive integer (or null to derive it).")
    if m.head_dim is None and m.hidden_size % m.num_heads:
        raise UserError(f"model.hidden_size = {m.hidden_size} is not divisible by model.num_heads = {m.num_heads}: "
                        f"each head needs hidden_size/num_heads dimensions. Pick num_heads from the divisors of "
                        f"{m.hidden_size} (e.g. {nearest_divisor(m.hidden_size, m.num_heads)}) or change hidden_size"
                        + (" (or set model.head_dim)." if m.arch == "llama" else "."))
    if m.num_kv_heads is None:  # derived once, here, into the object load_config returns
        m = replace(m, num_kv_heads=m.num_heads)
    if m.num_heads % m.num_kv_heads:
        raise UserError(f"model.num_heads = {m.num_heads} is not divisible by model.num_kv_heads = {m.num_kv_heads}: "
                        f"grouped-query attention shares each key/value head among num_heads/num_kv_heads query heads. "
                        f"Use a divisor of {m.num_heads}.")
    if m.arch == "gpt2" and m.num_kv_heads != m.num_heads:
        raise UserError(f"model.num_kv_heads = {m.num_kv_heads} with model.arch = gpt2: GPT-2 uses full multi-head "
                        f"attention. Remove num_kv_heads or use arch: llama for grouped-query attention.")
    if m.arch == "llama" and m.bias:
        raise UserError("model.bias = true with model.arch = llama: Llama's linear layers and RMSNorm have no biases, "
                        "and ms_llm builds it without them. Remove model.bias (or set it to false); for biases on "
                        "the q, k and v projections (Qwen2.5) set model.qkv_bias: true.")
    check_llama_options(m)
    m = replace(m, ffn_hidden_size=derived_ffn_hidden_size(m))
    check_moe(m, cfg.parallel_config)
    cfg = replace(cfg, model=m)
    if not 0.0 <= m.dropout < 1.0:
        raise UserError(f"model.dropout = {m.dropout} must be in [0, 1).")
    if m.init_std <= 0:
        raise UserError(f"model.init_std = {m.init_std} must be > 0 (GPT-2 uses 0.02).")
    if not 0.0 <= cfg.data.val_fraction < 1.0:
        raise UserError(f"data.val_fraction = {cfg.data.val_fraction} must be at least 0 and below 1 (e.g. 0.1; 0: no "
                        f"validation split).")
    if t.lr <= 0 or t.min_lr < 0 or t.min_lr > t.lr:
        raise UserError(f"train.lr = {t.lr} and train.min_lr = {t.min_lr}: need 0 <= min_lr <= lr and lr > 0.")
    if t.warmup_steps < 0:
        raise UserError(f"train.warmup_steps = {t.warmup_steps} must be >= 0.")
    if t.decay_steps is not None and t.decay_steps <= t.warmup_steps:
        raise UserError(f"train.decay_steps = {t.decay_steps} must exceed train.warmup_steps = {t.warmup_steps} "
                        f"(or be null to decay until train.max_steps).")
    if not (0 <= t.beta1 < 1 and 0 <= t.beta2 < 1):
        raise UserError(f"train.beta1 = {t.beta1}, train.beta2 = {t.beta2}: both must be in [0, 1).")
    if t.clip_grad < 0 or t.weight_decay < 0 or t.eval_interval < 0:
        raise UserError("train.clip_grad, train.weight_decay and train.eval_interval must be >= 0 "
                        f"(got {t.clip_grad}, {t.weight_decay}, {t.eval_interval}).")
    if t.global_batch_size % t.micro_batch_size:
        raise UserError(f"train.global_batch_size = {t.global_batch_size} is not divisible by "
                        f"train.micro_batch_size = {t.micro_batch_size}. The global batch is split into micro-batches "
                        f"(accumulation steps × data-parallel ranks); make it a multiple of the micro batch.")
    if t.loss_chunk_tokens < 0:
        raise UserError(f"train.loss_chunk_tokens = {t.loss_chunk_tokens} must be >= 0: the tokens per chunk of the "
                        f"LM head and loss (e.g. 1024), or 0 for the whole logits at once.")
    if p.init_scale <= 0 or p.scale_factor <= 1:
        raise UserError(f"precision.init_scale = {p.init_scale} must be > 0 and precision.scale_factor = "
                        f"{p.scale_factor} must be > 1.")
    if t.stop_at_step is not None and not 0 < t.stop_at_step <= t.max_steps:
        raise UserError(f"train.stop_at_step = {t.stop_at_step} must be between 1 and train.max_steps = {t.max_steps}.")
    prof = cfg.monitor.profile
    if prof is not None and not 0 <= prof.start_step < prof.stop_step:
        raise UserError(f"monitor.profile: start_step = {prof.start_step}, stop_step = {prof.stop_step}: need "
                        f"0 <= start_step < stop_step (start after the first step to keep compilation out).")
    check_finetune(cfg.finetune)
    check_preference(cfg)
    check_eval(cfg)
    if cfg.checkpoint.save_interval < 0 or cfg.checkpoint.keep_last < 1:
        raise UserError(f"checkpoint.save_interval = {cfg.checkpoint.save_interval} must be >= 0 and "
                        f"checkpoint.keep_last = {cfg.checkpoint.keep_last} must be >= 1.")
    if not cfg.checkpoint.upload_budget_s > 0:
        raise UserError(f"checkpoint.upload_budget_s = {cfg.checkpoint.upload_budget_s} must be > 0: the seconds one "
                        f"checkpoint's upload is retried before it is left only local.")
    check_trackers(cfg.monitor.trackers)
    check_memory_size(cfg.context.max_device_memory)
    check_no_blank_strings(cfg)
    check_legal_ranges(cfg)
    return cfg


def check_memory_size(text):
    """MindSpore's set_memory takes 'xxGB' and nothing else; refused here rather than by the runtime on the device."""
    import re

    if text is not None and not re.fullmatch(r"\d+(\.\d+)?GB", str(text).strip()):
        raise UserError(f"context.max_device_memory = {text!r} is not a memory size MindSpore accepts: write a number "
                        f"of GB, e.g. '58GB' (MindFormers' value on a 64 GB Ascend device), or null for the default.")


def check_trackers(names):
    from ms_llm.config.schema import TRACKERS

    bad = [n for n in names if n not in TRACKERS]
    if bad or len(set(names)) != len(names):
        what = f"'{bad[0]}' is not a tracker ms_llm knows" if bad else "names a tracker twice"
        hint = closest(str(bad[0]), TRACKERS) if bad else None
        raise UserError(f"monitor.trackers = {list(names)}: {what}" + (f" (did you mean '{hint}'?)" if hint else "")
                        + f". Choose from: {', '.join(TRACKERS)}, e.g. monitor.trackers: [mlflow, swanlab].")


def check_eval(cfg):
    """The eval: section (task evaluation during training, ms_llm.eval.hook): it runs beside validation."""
    e, t, pc = cfg.eval, cfg.train, cfg.parallel_config
    if e.interval < 0 or (e.batch_size is not None and e.batch_size < 1) or \
            (e.num_fewshot is not None and e.num_fewshot < 0):
        raise UserError(f"eval.interval = {e.interval}, eval.batch_size = {e.batch_size}, eval.num_fewshot = "
                        f"{e.num_fewshot}: need interval >= 0, batch_size >= 1 (or null) and num_fewshot >= 0 (or "
                        f"null).")
    if e.limit is not None and (e.limit <= 0 or (e.limit >= 1 and e.limit != int(e.limit))):
        raise UserError(f"eval.limit = {e.limit} evaluates nothing or a part of a document: give a number of documents "
                        f"per task (e.g. 200), a share below 1 (e.g. 0.1), or null for all of them.")
    if not e.tasks:
        return
    if e.interval and (not t.eval_interval or e.interval % t.eval_interval):
        fix = (f"a multiple of it (e.g. {t.eval_interval * max(1, round(e.interval / t.eval_interval))})"
               if t.eval_interval else "a multiple of a train.eval_interval you set")
        raise UserError(f"eval.interval = {e.interval} is not a multiple of train.eval_interval = {t.eval_interval}: "
                        f"task evaluation runs beside validation, every eval.interval steps and at the end. Set "
                        f"eval.interval to {fix}, or to 0 for the end only.")
    if pc.pipeline_stage > 1 or pc.model_parallel > 1:
        raise UserError(f"eval.tasks = {list(e.tasks)} with parallel_config.pipeline_stage = {pc.pipeline_stage} and "
                        f"model_parallel = {pc.model_parallel}: task evaluation during training runs on whole "
                        f"replicas of the model (one device or data parallel). Evaluate the run's checkpoints "
                        f"afterwards with `ms-llm eval --run-dir RUN --checkpoint F`, or set eval.tasks: [].")


def check_preference(cfg):
    """finetune.preference (preference optimisation, ms_llm/train/losses/preference.py): its values, and the layouts
    it does not run with (a mixture of experts trains with its router term: ms_llm/train/losses/routed.py). A preference dataset without the section is checked against the layout with
    the other fine-tuning data (ms_llm.train.setup.finetune.check)."""
    p, pc = cfg.finetune.preference, cfg.parallel_config
    if p is None and cfg.data.format != "preference":
        return
    if p is not None and p.beta <= 0:
        raise UserError(f"finetune.preference.beta = {p.beta} must be positive (DPO's usual value is 0.1; "
                        f"SimPO's paper uses 2 to 2.5).")
    if pc.pipeline_stage > 1:
        raise UserError(f"preference optimisation (finetune.preference, or data.format: preference) with "
                        f"parallel_config.pipeline_stage = {pc.pipeline_stage}: the pair loss needs both sequences' "
                        f"log-probs of a pair in one place and the reference pass beside the step, which the "
                        f"pipelined step does not have. Use data parallelism (pipeline_stage: 1); LoRA "
                        f"(finetune.lora) keeps a large model's optimizer state small enough to fit.")


def check_finetune(ft):
    """finetune.lora's values (the checks against data and layout are ms_llm.train.setup.finetune.check's)."""
    lora = ft.lora
    if lora is None:
        return
    from ms_llm.config.schema import LORA_TARGETS as TARGETS

    if lora.rank <= 0 or lora.alpha <= 0 or not 0 <= lora.dropout < 1:
        raise UserError(f"finetune.lora: rank = {lora.rank}, alpha = {lora.alpha}, dropout = {lora.dropout}: need a "
                        f"positive rank and alpha and 0 <= dropout < 1 (e.g. rank 8, alpha 16, dropout 0.05).")
    unknown = [t for t in lora.targets if t not in TARGETS]
    if unknown or not lora.targets:
        raise UserError(f"finetune.lora.targets = {lora.targets}: "
                        + (f"{', '.join(map(repr, unknown))} is not a projection of ms_llm's models" if unknown
                           else "empty") + f". Choose among {', '.join(TARGETS)} (qkv, out: attention; gate_up, "
                        f"down: llama MLP; up, down: gpt2 MLP).")


def head_dim(m):
    """The size of one attention head: model.head_dim, or hidden_size / num_heads when it is null."""
    return m.head_dim or m.hidden_size // m.num_heads


def check_llama_options(m):
    """The options that make Llama's relatives (Llama 3, Qwen2.5, Qwen3, Mistral): llama only, and sane."""
    if m.head_dim is not None and m.head_dim <= 0:
        raise UserError(f"model.head_dim = {m.head_dim} must be a positive integer (or null: hidden_size / num_heads).")
    if m.sliding_window is not None and m.sliding_window <= 0:
        raise UserError(f"model.sliding_window = {m.sliding_window} must be a positive number of tokens (or null: "
                        f"every token attends to all earlier ones).")
    if m.arch == "gpt2":
        llama_only = [(k, v) for k, v in (("head_dim", m.head_dim), ("rope_scaling", m.rope_scaling),
                                          ("sliding_window", m.sliding_window)) if v is not None]
        llama_only += [(k, v) for k, v in (("qkv_bias", m.qkv_bias), ("qk_norm", m.qk_norm)) if v]
        if llama_only:
            k, v = llama_only[0]
            raise UserError(f"model.{k} = {v} with model.arch = gpt2: it is an option of the llama family (RoPE, "
                            f"RMSNorm, SwiGLU; Llama 3, Qwen2.5, Qwen3, Mistral). GPT-2's biases are model.bias; "
                            f"remove model.{k} or use model.arch: llama.")
        return
    if head_dim(m) % 2:
        raise UserError(f"the head size is {head_dim(m)} (model.head_dim, or hidden_size / num_heads when it is "
                        f"null), an odd number: RoPE rotates pairs of dimensions, so the head size must be even.")
    rs = m.rope_scaling
    if rs is not None:
        low, high = rs.low_freq_factor, rs.high_freq_factor
        if rs.factor < 1 or rs.original_max_position_embeddings <= 0 or not 0 < low < high:
            raise UserError(f"model.rope_scaling = factor {rs.factor}, low_freq_factor {rs.low_freq_factor}, "
                            f"high_freq_factor {rs.high_freq_factor}, original_max_position_embeddings "
                            f"{rs.original_max_position_embeddings}: the llama3 rule needs factor >= 1, "
                            f"0 < low_freq_factor < high_freq_factor and a positive original context (Llama 3.1: "
                            f"8, 1, 4, 8192).")


def check_moe(m, pc):
    """model.moe (a mixture of experts in place of chosen layers' MLPs) and parallel_config.expert_parallel."""
    moe, ep = m.moe, pc.expert_parallel
    if moe is None:
        if ep > 1:
            raise UserError(f"parallel_config.expert_parallel = {ep} without model.moe: expert parallelism splits the "
                            f"experts of mixture-of-experts layers over ranks, and this model has none. Set "
                            f"expert_parallel to 1, or add model.moe: {{num_experts: 8, top_k: 2}}.")
        return
    if m.arch != "llama":
        raise UserError(f"model.moe with model.arch = {m.arch}: the experts are SwiGLU MLPs of the llama family "
                        f"(Mixtral, Qwen3-MoE). Use model.arch: llama, or remove model.moe.")
    if moe.num_experts < 1 or moe.top_k < 1:
        raise UserError(f"model.moe.num_experts = {moe.num_experts} and model.moe.top_k = {moe.top_k} must both be "
                        f"positive integers (Mixtral: 8 experts, top_k 2).")
    if moe.top_k > moe.num_experts:
        raise UserError(f"model.moe.top_k = {moe.top_k} is larger than model.moe.num_experts = {moe.num_experts}: "
                        f"each token is sent to top_k different experts. Set top_k <= {moe.num_experts} (Mixtral "
                        f"sends each token to 2 of 8), or add experts.")
    if moe.capacity_factor is not None and moe.capacity_factor <= 0:
        raise UserError(f"model.moe.capacity_factor = {moe.capacity_factor} must be > 0: each expert takes at most "
                        f"capacity_factor × tokens × top_k / num_experts tokens (1.25 is usual). For no limit (no "
                        f"token dropped) set it to null, the default; MindFormers' capacity_factor <= 0 means the same.")
    if moe.layers is not None:
        bad = [i for i in moe.layers if not 0 <= i < m.num_layers]
        if bad or not moe.layers or len(set(moe.layers)) != len(moe.layers):
            why = (f"{bad} out of range: layers are numbered 0 to {m.num_layers - 1}" if bad else
                   "the list is empty: no layer would be an MoE layer" if not moe.layers else "a layer is listed twice")
            raise UserError(f"model.moe.layers = {moe.layers}: {why} (model.num_layers = {m.num_layers}). List "
                            f"distinct layer indices below {m.num_layers}, or null for every layer.")
    if moe.ffn_hidden_size is not None and moe.ffn_hidden_size <= 0:
        raise UserError(f"model.moe.ffn_hidden_size = {moe.ffn_hidden_size} must be a positive width (or null: "
                        f"model.ffn_hidden_size).")
    if moe.router_init_std is not None and moe.router_init_std < 0:
        raise UserError(f"model.moe.router_init_std = {moe.router_init_std} must be >= 0 (0: a router that starts at "
                        f"zero; null: model.init_std).")
    if moe.shared_expert_size < 0 or moe.aux_loss_coef < 0 or moe.z_loss_coef < 0:
        raise UserError(f"model.moe.shared_expert_size = {moe.shared_expert_size}, aux_loss_coef = "
                        f"{moe.aux_loss_coef}, z_loss_coef = {moe.z_loss_coef}: none may be negative.")
    if moe.shared_expert_gate and not moe.shared_expert_size:
        raise UserError("model.moe.shared_expert_gate = true without a shared expert: set "
                        "model.moe.shared_expert_size (its inner width, e.g. 5632 for Qwen1.5-MoE-A2.7B), or remove "
                        "the gate.")
    if moe.num_experts % ep:
        divisors = [d for d in range(1, moe.num_experts + 1) if moe.num_experts % d == 0]
        raise UserError(f"parallel_config.expert_parallel = {ep} does not divide model.moe.num_experts = "
                        f"{moe.num_experts}: each expert-parallel rank holds num_experts / expert_parallel whole "
                        f"experts. Use one of {divisors}.")


def moe_layers(m):
    """Indices of the layers whose MLP is a mixture of experts (none without model.moe)."""
    if m.moe is None:
        return []
    return sorted(m.moe.layers) if m.moe.layers is not None else list(range(m.num_layers))


def expert_ffn(m):
    """Inner width of each routed expert."""
    return m.moe.ffn_hidden_size or m.ffn_hidden_size


def nearest_divisor(n, near):
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    return min(divisors, key=lambda d: abs(d - near))


def check_against_dataset(cfg, manifest, dataset_dir):
    """The model must fit the data: sample length and vocabulary come from the manifest. Returns the config with
    model.vocab_size taken from the manifest when it was null (a new object)."""
    m = cfg.model
    sample_len = manifest["seq_length"]
    if m.seq_length > sample_len:
        raise UserError(f"model.seq_length = {m.seq_length} is larger than the samples in '{dataset_dir}' "
                        f"({sample_len} tokens + 1). Set model.seq_length <= {sample_len}, or re-run preprocessing "
                        f"with --seq-length {m.seq_length} into a new directory.")
    need = manifest["vocab_size"]
    if m.vocab_size is None:
        return replace(cfg, model=replace(m, vocab_size=need))
    if m.vocab_size < need:
        raise UserError(f"model.vocab_size = {m.vocab_size} is smaller than the dataset's vocabulary ({need} tokens, "
                        f"largest id {manifest.get('max_token_id', need - 1)}) in '{dataset_dir}'. Set "
                        f"model.vocab_size >= {need}, or null to take it from the data.")
    return cfg


def check_no_blank_strings(cfg, section=None, prefix=""):
    """A key typed as a plain string (not Optional: it has no "none" to fall back on) holding '' or blanks is
    refused: a folder, a field name or a choice that is empty reaches a path or a table as nothing (an empty
    data.dataset_dir made preprocessing rename its output onto '')."""
    import typing

    section = cfg if section is None else section
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if dataclasses.is_dataclass(value):
            check_no_blank_strings(cfg, value, f"{prefix}{f.name}.")
        elif f.type is str and isinstance(value, str) and not value.strip() and type(None) not in typing.get_args(f.type):
            raise UserError(f"{prefix}{f.name} = {value!r} is empty ({f.metadata.get('help', '')}). Give a value, or "
                            f"remove the key for its default {f.default!r}.")


def check_legal_ranges(cfg):
    """Every number of a validated config inside its key's declared legal range (schema.LEGAL): the last check of
    validation, so that a key's own check, with its context, speaks first where there is one."""
    from ms_llm.config.schema import LEGAL, numbers_of

    for path, legal in LEGAL.items():
        value = cfg
        for part in path.split("."):
            value = getattr(value, part, None)
        for v in numbers_of(value):
            if not legal.admits(v):
                section, key = path.rsplit(".", 1)
                owner = cfg
                for part in section.split("."):
                    owner = getattr(owner, part)
                help = next(f.metadata.get("help", "") for f in dataclasses.fields(owner) if f.name == key)
                raise UserError(f"{path} = {v!r} is outside its legal range {legal} ({help}). Give a value in that "
                                f"range.")
