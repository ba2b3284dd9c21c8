"""MindFormers `model.model_config` / `model.arch` → our `model` section and compute dtype (one row per key)."""
from ms_llm.errors import UserError
from ms_llm.interop.mindformers.table import num

# LlamaConfig's defaults (mindformers/models/llama/llama_config.py) for keys a file may leave out.
MF_MODEL_DEFAULTS = {"seq_length": 2048, "hidden_size": 4096, "num_layers": 32, "num_heads": 32, "vocab_size": 32000,
                     "multiple_of": 256, "rms_norm_eps": 1e-5, "theta": 10000.0, "compute_dtype": "float16"}
DTYPES = ("float32", "float16", "bfloat16")
MC = "model.model_config."


def model(t, facts):
    if t.has(MC + "model_type") and not t.has(MC + "type"):  # configs/qwen3/*.yaml and other mcore-style models
        raise UserError(f"model.model_config.model_type = {t.get(MC + 'model_type')!r} without model_config.type: a "
                        f"MindFormers model in Hugging Face's config keys (its mcore models: Qwen3, ...), which this "
                        f"importer does not read (it reads LlamaConfig files: Llama 2/3, Qwen2.5). Convert the "
                        f"model from its Hugging Face folder instead: ms-llm convert --from-hf DIR.")
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
    rope_extension(t)
    if t.get(MC + "attn_proj_has_bias"):
        raise UserError("model.model_config.attn_proj_has_bias = true: ms_llm's Llama has no bias on the attention "
                        "output (model.qkv_bias puts biases on q, k and v only); converting would silently drop it.")
    t.ignored(MC + "attn_proj_has_bias", "no bias on the attention output, as in ms_llm's Llama")
    if t.get(MC + "qkv_has_bias"):
        t.mapped(MC + "qkv_has_bias", ("model.qkv_bias", True), "biases on q, k and v (Qwen2.5)")
    t.ignored(MC + "qkv_has_bias", "no q/k/v biases")
    # Keys research/qwen2_5's YAMLs carry "copied from Qwen" that MindFormers' LlamaConfig and Llama never read.
    for k, why in (("rotary_emb_base", "theta is the RoPE base"), ("initializer_range", "init_method_std is"),
                   ("use_past_shard", "an inference setting")):
        t.ignored(MC + k, f"not read by MindFormers' Llama ({why})")
    if num(t.get(MC + "rotary_pct", 1.0), MC + "rotary_pct") != 1.0:
        t.unsupported(MC + "rotary_pct", "not read by MindFormers' Llama, which rotates whole heads, as ms_llm does")
    t.ignored(MC + "rotary_pct", "not read by MindFormers' Llama (it rotates whole heads, as ms_llm does)")
    if num(t.get(MC + "emb_dropout_prob", 0.0), MC + "emb_dropout_prob"):
        t.unsupported(MC + "emb_dropout_prob", "a dropout on the embeddings alone: ms_llm's model.dropout applies to "
                                               "attention, residual branches and embeddings together")
    t.ignored(MC + "emb_dropout_prob", "0: no embedding dropout")
    t.ignored(MC + "max_position_embedding", "RoPE tables are built for model.seq_length positions (the same "
                                             "values for every position below it)")
    t.ignored(MC + "embedding_init_type", "ms_llm keeps float32 master weights; a converted checkpoint remembers its "
                                          "own dtype")
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


def rope_extension(t):
    """extend_method: "LLAMA3" with a scaling_factor mapping (research/llama3_1's predict YAMLs) is Llama 3.1's RoPE
    frequency scaling, our model.rope_scaling; the other methods (PI, NTK, YARN, ...) are refused."""
    method = t.get(MC + "extend_method", "None")
    if method == "LLAMA3":
        sf = {k[len(MC + "scaling_factor."):]: v for k, v in t.flat.items() if k.startswith(MC + "scaling_factor.")}
        keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        missing = [k for k in keys if k not in sf]
        if missing or set(sf) - set(keys):
            raise UserError(f"model.model_config.extend_method = 'LLAMA3' needs scaling_factor to be a mapping of "
                            f"exactly {', '.join(keys)} (MindFormers checks the same); "
                            + (f"missing {', '.join(missing)}" if missing else
                               f"unknown {', '.join(sorted(set(sf) - set(keys)))}") + ".")
        scaling = {"type": "llama3", "factor": num(sf["factor"], MC + "scaling_factor.factor"),
                   "low_freq_factor": num(sf["low_freq_factor"], MC + "scaling_factor.low_freq_factor"),
                   "high_freq_factor": num(sf["high_freq_factor"], MC + "scaling_factor.high_freq_factor"),
                   "original_max_position_embeddings": num(sf["original_max_position_embeddings"],
                                                           MC + "scaling_factor.original_max_position_embeddings", int)}
        t.mapped(MC + "extend_method", ("model.rope_scaling", scaling), "Llama 3.1's RoPE frequency scaling")
        for k in keys:
            t.mapped(MC + "scaling_factor." + k, (f"model.rope_scaling.{k}", scaling[k]))
        return
    if method not in ("None", None):
        raise UserError(f"model.model_config.extend_method = {method!r}: that RoPE extension is not implemented in "
                        f"ms_llm's Llama (it has LLAMA3, as model.rope_scaling); converting would silently change "
                        f"the model.")
    t.ignored(MC + "scaling_factor", "used only with extend_method (none here)")
    t.ignore_prefix(MC + "scaling_factor.", "used only with extend_method (none here)")
    t.ignored(MC + "extend_method", "no RoPE extension")


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
