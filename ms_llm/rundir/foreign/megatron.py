"""Megatron-LM's training log (also MindSpeed-LLM's, which prints Megatron's line and adds fields), read into
ms_llm's records.

The line (megatron/training/training.py `training_log`; megatron/training.py before 2024-03), every field
' key: value |', printed by the last rank (print_rank_last; rank 0 before 2020-08):

   [2026-01-27 10:00:00.123456] iteration      100/    2000 | consumed samples:       102400 | elapsed time per
   iteration (ms): 1234.5 | throughput per GPU (TFLOP/s/GPU): 312.4 | learning rate: 2.999999E-04 | global batch
   size:  1024 | lm loss: 3.210000E+00 | loss scale: 1.0 | grad norm: 0.512 | number of skipped iterations:   0 |
   number of nan iterations:   0 |

What a missing field means (the code that prints it decides):
  lm loss        printed only when the interval's mean is >= 0: left out when it is NaN (a non-finite loss in an
                 iteration that was applied); 0.000000E+00 (or absent in the first interval) when every iteration
                 of the interval was skipped, as there was no applied iteration to average.
  nan iterations skipped iterations whose loss was NaN/Inf: the interval's mean loss, as ms_llm logs it (all
                 steps), is then non-finite.
  grad norm      absent when the optimizer does not compute it (no clipping, some optimizers).
  learning rate  absent on ranks without trainable parameters (2025-11 on) or with a decoupled LR.
Around the line: the argument dump at the top ('---- arguments ----' ... 'end of arguments'), validation
lines (' validation loss at iteration N | lm loss value: ... |'), memory reports ('[Rank 0] (after N iterations)
memory (MB) | ... | max allocated: ...'), timers ('time (ms) | forward-compute: ... | batch-generator: ...'),
the rerun state machine's and older NaN checks ('Unexpected result nan ... iteration #N', 'found NaN in local
forward loss calculation'), checkpoint loads and saves, and '[after training is done]'.

MindSpeed-LLM's FSDP2 trainer (mindspeed_llm/fsdp2/utils/train_monitor.py) prints the same shape after its
logger's 'INFO [date] >> ' with 'consumed tokens', 'tokens/s', 'mfu', 'mtp loss' and 'max_memory_allocated(GB)'.
"""
import ast
import math
import re

from ms_llm.rundir.foreign.logtext import begins_any, number
from ms_llm.rundir.foreign.parsed import Parsed

NAME, TITLE = "megatron", "Megatron-LM"
ITER = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)\s*\|")
VALID = re.compile(r"\bvalidation(\S*) loss at (.*?)\s*\|(.*)$")
ARGS_BEGIN = re.compile(r"^-{6,}\s*(arguments|MindSpeed-LLM Arguments|[\w -]*arguments)\s*-{6,}\s*$", re.I)
ARGS_END = re.compile(r"^-{6,}\s*end of .*arguments\s*-{6,}\s*$", re.I)
ARG = re.compile(r"^\s{1,4}(\w[\w.-]*) \.{2,} ?(.*)$")
MEMORY = re.compile(r"\(after (\d+) iterations\) memory \(MB\)(.*)$")
TIMERS = re.compile(r"^\s*time \(ms\)\s*\|(.*)$")
TIMER_ROW = re.compile(r"^\s+([\w-]+) \.+: \(([\d.]+), ([\d.]+)\)\s*$")  # '(min, max) time across ranks (ms):' rows
NAN_AT = re.compile(r"iteration #?(\d+)[:\s].*?(Unexpected result (?:nan|inf|-inf)|found (?:NaN|Inf)[^,!]*)", re.I)
LOADED = re.compile(r"successfully loaded checkpoint from (\S+).*? at iteration (\d+)")
SAVING = re.compile(r"saving checkpoint at iteration\s+(\d+)")
EXITING = re.compile(r"exiting program (?:at iteration (\d+)|after receiving SIGTERM|after (\d+(?:\.\d+)?) minutes)")
DONE = re.compile(r"\[after training is done\]")
FSDP2 = re.compile(r"^(?:INFO|WARNING) \[[^\]]+\] >>\s*")
TIMESTAMP = re.compile(r"\[(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})(\.\d+)?\]")
SIGNATURES = (ITER, ARGS_BEGIN, re.compile(r"number of skipped iterations:"))

# normalised key (lower case, no spaces) -> ms_llm's record field
FIELDS = {
    "consumedsamples": "consumed_samples", "consumedtokens": "tokens", "skippedsamples": "skipped_samples",
    "elapsedtimeperiteration(ms)": "ms_per_step", "throughputpergpu(tflop/s/gpu)": "tflops",
    "energypergpu(j/iter/gpu)": "energy_j", "powerpergpu(w/gpu)": "power_w",
    "learningrate": "lr", "decoupledlearningrate": "decoupled_lr", "globalbatchsize": "global_batch_size",
    "lmloss": "loss", "lossscale": "loss_scale", "gradnorm": "grad_norm", "numzeros": "num_zeros",
    "paramsnorm": "params_norm", "numberofskippediterations": "skipped_interval",
    "numberofnaniterations": "nan_interval", "tokens/s": "tokens_per_s", "mfu": "mfu",
    "max_memory_allocated(gb)": "mem_gib", "max_memory_reserved(gb)": "mem_reserved_gib",
    "load_balancing_loss": "aux_loss", "seq_load_balancing_loss": "aux_loss", "global_load_balancing_loss": "aux_loss",
    "auxloss": "aux_loss", "z_loss": "z_loss", "mtploss": "mtp_loss", "indexerloss": "indexer_loss",
}
INT_FIELDS = {"consumed_samples", "tokens", "skipped_samples", "global_batch_size", "skipped_interval",
              "nan_interval", "num_zeros"}
ABSENT = {
    "data_wait_frac": "Megatron-LM prints the data wait only among its timers (--timing-log-level 2: "
                      "batch-generator)",
    "mfu": "Megatron-LM prints TFLOP/s per GPU (--log-throughput), not the share of the device's peak",
    "mem_gib": "Megatron-LM reports memory once, after the first iterations, unless --log-memory-interval is set",
    "tokens_per_s": "the argument dump with seq_length is not in the log (tokens = samples x seq_length)",
    "grad_norm": "the optimizer printed no grad norm",
    "val_loss": "no validation line (--eval-interval, --eval-iters 0?)",
    "loss_scale": "no loss scale printed",
}


def starts(text):
    return bool(ITER.search(text)) or text.lstrip().startswith("validation")


def complete(text):
    return text.rstrip().endswith("|")


# the last field of each form of the line (training_log's history; MindSpeed-LLM's FSDP2 monitor's)
TERMINAL = ("number of nan iterations",
            "cpu_memory_usage(%)", "only for test", "ppl")  # fields that end a line and are never followed


def ends(text):
    """The line ends with the field its form ends with (a wrapped line's first part can end with '|' too)."""
    t = text.rstrip()
    if not t.endswith("|"):
        return False
    last = t[:-1].rsplit("|", 1)[-1]
    key = last.rpartition(":")[0].strip().lower() or last.strip().lower()
    return any(key.endswith(k) or k in key for k in TERMINAL)


def begins_line(text):
    return begins_any(text) or bool(ITER.search(text)) or bool(ARG.match(text)) or text.lstrip().startswith(
        ("time (ms)", "validation", "[after", "[before"))


def fields(segment, whole):
    """{ms_llm field: value} and the unknown keys of ' key: value |' pairs; the text after the last '|' is a cut
    field unless the line is `whole`."""
    parts = segment.split("|")
    if not whole or not complete(segment):
        parts = parts[:-1]
    out, unknown = {}, {}
    for part in parts:
        key, sep, value = part.rpartition(":")
        if not sep:  # 'consumed samples 123' (2020-12-11 only)
            m = re.match(r"^\s*(.*?)\s+([-+\d.eE]+)\s*$", part)
            if not m:
                continue
            key, value = m.groups()
        norm = re.sub(r"\s+", "", key).lower()
        v = number(value)
        if not norm or v is None:
            continue
        name = FIELDS.get(norm)
        if name is None and norm.endswith("loss"):
            name = re.sub(r"[^a-z0-9]+", "_", key.strip().lower()).strip("_")
        if name is None:
            unknown[key.strip()] = v
            continue
        if name in out and name == "aux_loss":
            out[name] += v
        else:
            out[name] = int(v) if name in INT_FIELDS and math.isfinite(v) else v
    return out, unknown


def parse_train(text, whole, features):
    m = ITER.search(text)
    head = text[:m.start()]
    ts = TIMESTAMP.search(head)
    if ts:
        features.add("timestamp with microseconds" if ts.group(2) else "timestamp")
    if FSDP2.match(text):
        features.add("MindSpeed-LLM FSDP2 logger")
    rec, unknown = fields(text[m.end():], whole)
    rec = {"step": int(m.group(1)), **rec}
    for k in rec:
        features.add(k)
    if unknown:
        rec["other"] = unknown
    return rec, int(m.group(2))


def read(lines, counts):
    p = Parsed(TITLE, counts=counts, absent=dict(ABSENT))
    args, in_args, last_arg = {}, False, None
    order = 0
    last_train = {}  # rank -> record (timers and memory reports belong to it)
    timer_rank = None
    for line in lines:
        text = line.text
        order += 1
        if in_args:
            if ARGS_END.match(text.strip()):
                in_args = False
                continue
            m = ARG.match(text)
            if m:
                args[m.group(1)] = m.group(2).strip()
                last_arg = m.group(1)
                continue
            if last_arg and text.strip() and not begins_line(text) and not ARGS_BEGIN.match(text.strip()):
                args[last_arg] += text.strip()  # a value the terminal wrapped
                continue
            in_args = False  # a dump cut short: what came before it is kept
        if ARGS_BEGIN.match(text.strip()):
            in_args = True
            if "mindspeed" in text.lower():
                p.framework = "MindSpeed-LLM"
            continue
        if "mindspeed" in text.lower() and p.framework == TITLE:
            p.framework = "MindSpeed-LLM"
        if ITER.search(text):
            rec, total = parse_train(text, not line.last, p.features)
            p.info["max_steps"] = total
            p.train.append((line.rank, order, rec))
            last_train[line.rank] = rec
            counts["training lines"] += 1
            continue
        m = VALID.search(text)
        if m:
            ev = parse_valid(m, last_train.get(line.rank))
            if ev is None:
                counts["test-set and unplaced evaluation lines (not used)"] += 1
            else:
                p.evals.append((line.rank, order, ev))
                counts["validation lines"] += 1
            continue
        m = MEMORY.search(text)
        if m:
            rec = last_train.get(line.rank)
            peak = _named(m.group(2), "max allocated")
            if rec is not None and rec["step"] == int(m.group(1)) and peak is not None:
                rec["mem_gib"] = peak / 1024
                p.features.add("memory report")
            counts["memory reports"] += 1
            continue
        m = TIMERS.match(text)
        if m:
            attach_timer(last_train.get(line.rank), _pairs(m.group(1)))
            counts["timer lines"] += 1
            continue
        if text.startswith("(min, max) time across ranks (ms):"):
            timer_rank = line.rank
            continue
        m = TIMER_ROW.match(text)
        if m and timer_rank == line.rank:
            attach_timer(last_train.get(line.rank), {m.group(1): float(m.group(3))})
            continue
        m = NAN_AT.search(text)
        if m:
            p.events.append((line.rank, order, {"step": int(m.group(1)), "event": "nonfinite",
                                                "detail": text.strip()[:300]}))
            continue
        m = LOADED.search(text)
        if m:
            if int(m.group(2)) > 0:
                p.events.append((line.rank, order, {"step": int(m.group(2)), "event": "resume", "from": m.group(1)}))
                p.restarts.append((line.rank, order, int(m.group(2))))
            continue
        m = SAVING.search(text)
        if m:
            p.events.append((line.rank, order, {"step": int(m.group(1)), "event": "checkpoint"}))
            continue
        m = EXITING.search(text)
        if m:
            rec = last_train.get(line.rank)
            step = int(m.group(1)) if m.group(1) else (rec["step"] if rec else 0)
            p.events.append((line.rank, order, {"step": step, "event": "stop_at_step" if m.group(1) or m.group(2)
                                                else "preempted", "detail": text.strip()[:200]}))
            continue
        if DONE.search(text):
            p.ended = True
            continue
        counts["other lines (not metrics)"] += 1
    if args:
        p.info["args"] = args
        p.config, p.config_notes = config_from_args(args)
        p.config_source = "the argument dump at the top of the log"
        p.info["world_size"] = _int(args.get("world_size"))
        if p.framework == TITLE and any(k.startswith(("use_mcore", "npu", "ascend")) or "mindspeed" in k
                                        for k in args) and any("npu" in k or "ascend" in k for k in args):
            p.framework = "MindSpeed-LLM"
    p.info["version"] = version(p.features)
    finish_records(p, args)
    return p


def _named(segment, name):
    for part in segment.split("|"):
        key, _, value = part.rpartition(":")
        if key.strip().lower() == name:
            return number(value)
    return None


def _pairs(segment):
    out = {}
    for part in segment.split("|"):
        key, _, value = part.rpartition(":")
        v = number(value)
        if key.strip() and v is not None:
            out[key.strip()] = v
    return out


def attach_timer(rec, timers):
    """The data wait of the interval from Megatron's batch-generator timer (ms per iteration, averaged over the
    interval like the elapsed time)."""
    if rec is None or "batch-generator" not in timers:
        return
    ms = rec.get("ms_per_step")
    if isinstance(ms, float) and ms > 0:
        rec["data_wait_frac"] = min(1.0, timers["batch-generator"] / ms)


def parse_valid(m, last):
    """{"step", "val_loss"} of a validation line; None for the test set or a line without its iteration."""
    where = m.group(2)
    if "test set" in where:
        return None
    it = re.search(r"iteration (\d+)", where)
    step = int(it.group(1)) if it else (last["step"] if last else None)
    if step is None:
        return None
    value = None
    for part in m.group(3).split("|"):
        key, _, v = part.rpartition(":")
        k = key.strip().lower()
        if k.endswith("value") and ("lm loss" in k or value is None):
            value = number(v)
    if value is None:
        return None
    ev = {"step": step, "val_loss": value}
    if m.group(1):
        ev["split"] = m.group(1).lstrip("-")
    return ev


def finish_records(p, args):
    """What a missing or zero loss means, from the other fields of the same line; tokens where the sequence
    length is known."""
    seq = _int(args.get("seq_length")) if args else None
    prev = {}
    for rank, _, rec in p.train:
        step = rec["step"]
        n = step - prev.get(rank, step - _int(args.get("log_interval") if args else None, 1))
        n = n if n > 0 else 1
        prev[rank] = step
        skipped = rec.get("skipped_interval")
        nan = rec.get("nan_interval") or 0
        if "loss" in rec and nan:
            rec["loss_applied"] = rec["loss"]
            rec["loss"] = float("nan")  # ms_llm's interval mean takes every step: one NaN makes it NaN
        elif "loss" not in rec and any(k in rec for k in ("skipped_interval", "loss_scale")):
            if nan:
                rec["loss"] = float("nan")
            elif skipped is not None and skipped >= n:
                rec["loss"] = None  # every iteration skipped: nothing to average
                rec["loss_note"] = "all iterations of the interval skipped"
            else:
                rec["loss"] = float("nan")  # left out because the mean was NaN (or negative)
                rec["loss_note"] = "lm loss left out: its mean was not >= 0 (NaN)"
        elif rec.get("loss") == 0.0 and skipped is not None and skipped >= n:
            rec["loss"] = None
            rec["loss_note"] = "all iterations of the interval skipped (Megatron prints 0)"
        ms = rec.get("ms_per_step")
        if isinstance(ms, float) and ms > 0:
            rec["interval_s"] = round(ms * n / 1000, 6)
            gbs = rec.get("global_batch_size") or (_int(args.get("global_batch_size")) if args else None)
            if seq and gbs and "tokens_per_s" not in rec:
                rec["tokens_per_s"] = gbs * seq / (ms / 1000)
        if seq and isinstance(rec.get("consumed_samples"), int) and "tokens" not in rec:
            rec["tokens"] = rec["consumed_samples"] * seq
        if "mfu" in rec and isinstance(rec["mfu"], float) and rec["mfu"] > 1:
            rec["mfu"] /= 100  # MindSpeed-LLM's FSDP2 monitor prints a percentage


def version(features):
    """The revisions of the line this log's fields match (Megatron-LM's training_log history)."""
    if "MindSpeed-LLM FSDP2 logger" in features:
        return "MindSpeed-LLM FSDP2 trainer line (train_monitor.py, 2026)"
    if "timestamp with microseconds" in features:
        return "Megatron-LM 2026-01 or later (timestamp with microseconds, 6cf285b)"
    if "timestamp" in features:
        return ("Megatron-LM 2025-06 to 2025-12 (energy fields)" if "energy_j" in features else
                "Megatron-LM 2024-07 to 2025-12 (skipped samples)" if "skipped_samples" in features else
                "Megatron-LM 2024-01 to 2025-12 (timestamp, f427c6f)")
    if "tflops" in features:
        return "Megatron-LM 2023-11 to 2024-01 (throughput, no timestamp)"
    if "global_batch_size" in features:
        return "Megatron-LM 2020-12 to 2023-11 (consumed samples, global batch size)"
    if "nan_interval" in features:
        return "Megatron-LM 2020-09 to 2020-12"
    return "Megatron-LM 2019-10 to 2020-09 (the first form)" if features else ""


# --- the argument dump → ms_llm's config ---------------------------------------------------------------

def _value(text):
    if text is None:
        return None
    t = text.strip()
    if t == "None":
        return None
    try:
        return ast.literal_eval(t)
    except (ValueError, SyntaxError):
        return t


def _int(text, default=None):
    v = _value(text) if isinstance(text, str) else text
    return v if isinstance(v, int) and not isinstance(v, bool) else default


# Megatron's argparse defaults (megatron/training/arguments.py, core_v0.12.0) of the keys the settings rules
# read: a dump that was cut before them still means these.
DEFAULTS = {"lr_warmup_iters": 0, "lr_decay_style": "linear", "min_lr": 0.0, "weight_decay": 0.01,
            "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_eps": 1e-08, "clip_grad": 1.0, "init_method_std": 0.02,
            "log_interval": 100}


def config_from_args(args):
    """ms_llm's nested config from Megatron's parsed arguments (Megatron's defaults for the schedule keys a cut
    dump lacks), with notes on what does not map."""
    a = {**DEFAULTS, **{k: _value(v) for k, v in args.items()}}
    notes = []

    def n(key):  # a number, or None (a value the dump garbled is not arithmetic)
        v = a.get(key)
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    model, train, precision, parallel, recompute, checkpoint = {}, {}, {}, {}, {}, {}

    def put(section, key, value):
        if value is not None:
            section[key] = value

    swiglu = bool(a.get("swiglu"))
    rms = str(a.get("normalization", "")).lower() == "rmsnorm"
    if any(k in a for k in ("swiglu", "normalization", "position_embedding_type")):
        model["arch"] = "llama" if swiglu or rms or a.get("position_embedding_type") == "rope" else "gpt2"
    put(model, "num_layers", a.get("num_layers"))
    put(model, "hidden_size", a.get("hidden_size"))
    put(model, "num_heads", a.get("num_attention_heads"))
    if a.get("group_query_attention") and a.get("num_query_groups"):
        model["num_kv_heads"] = a["num_query_groups"]
    put(model, "ffn_hidden_size", a.get("ffn_hidden_size"))
    put(model, "seq_length", a.get("seq_length"))
    put(model, "vocab_size", a.get("padded_vocab_size") or a.get("vocab_size"))
    put(model, "init_std", a.get("init_method_std"))
    put(model, "dropout", a.get("hidden_dropout"))
    if "untie_embeddings_and_output_weights" in a:
        model["tie_embeddings"] = not a["untie_embeddings_and_output_weights"]
    put(model, "norm_eps", a.get("norm_epsilon", a.get("layernorm_epsilon")))
    put(model, "rope_theta", a.get("rotary_base"))
    if a.get("num_experts"):
        moe = {"num_experts": a["num_experts"]}
        put(moe, "top_k", a.get("moe_router_topk"))
        put(moe, "aux_loss_coef", a.get("moe_aux_loss_coeff"))
        put(moe, "z_loss_coef", a.get("moe_z_loss_coeff"))
        put(moe, "ffn_hidden_size", a.get("moe_ffn_hidden_size"))
        model["moe"] = moe
    put(train, "global_batch_size", a.get("global_batch_size"))
    put(train, "micro_batch_size", a.get("micro_batch_size"))
    iters = n("train_iters")
    if iters is None and n("train_samples") and n("global_batch_size"):
        iters = int(n("train_samples") // n("global_batch_size"))
    put(train, "max_steps", iters)
    put(train, "lr", a.get("lr"))
    put(train, "min_lr", a.get("min_lr"))
    decay = n("lr_decay_iters")
    if decay is None and n("lr_decay_samples") and n("global_batch_size"):
        decay = int(n("lr_decay_samples") // n("global_batch_size"))
    warm = n("lr_warmup_iters")
    if n("lr_warmup_fraction") is not None:
        warm = round(n("lr_warmup_fraction") * (decay or iters or 0))
    elif n("lr_warmup_samples") and n("global_batch_size"):
        warm = int(n("lr_warmup_samples") // n("global_batch_size"))
    put(train, "warmup_steps", warm)
    style = a.get("lr_decay_style")
    if style in ("cosine", "linear", "constant"):
        train["lr_schedule"] = style
    elif style:
        notes.append(f"lr_decay_style = {style}: ms_llm has no such schedule; the schedule rules read the peak LR, "
                     f"warmup and min LR only")
    put(train, "decay_steps", decay)
    put(train, "weight_decay", a.get("weight_decay"))
    put(train, "beta1", a.get("adam_beta1"))
    put(train, "beta2", a.get("adam_beta2"))
    put(train, "eps", a.get("adam_eps"))
    put(train, "clip_grad", a.get("clip_grad"))
    put(train, "seed", a.get("seed"))
    put(train, "log_interval", a.get("log_interval"))
    put(train, "eval_interval", a.get("eval_interval"))
    put(train, "eval_steps", a.get("eval_iters"))
    if a.get("fp16") is True:
        precision["compute_dtype"] = "float16"
        if n("loss_scale"):
            precision.update(loss_scale="static", init_scale=float(n("loss_scale")))
        else:
            precision["loss_scale"] = "dynamic"
            put(precision, "init_scale", float(n("initial_loss_scale")) if n("initial_loss_scale") else None)
            put(precision, "scale_window", a.get("loss_scale_window"))
    elif a.get("bf16") is True:
        precision.update(compute_dtype="bfloat16", loss_scale="none")
    elif "fp16" in a or "bf16" in a:
        precision.update(compute_dtype="float32", loss_scale="none")
    put(parallel, "data_parallel", a.get("data_parallel_size"))
    put(parallel, "model_parallel", a.get("tensor_model_parallel_size"))
    put(parallel, "pipeline_stage", a.get("pipeline_model_parallel_size"))
    put(parallel, "expert_parallel", a.get("expert_model_parallel_size"))
    put(parallel, "use_seq_parallel", a.get("sequence_parallel"))
    put(parallel, "optimizer_shard", a.get("use_distributed_optimizer"))
    gran = a.get("recompute_granularity")
    if gran == "full":
        recompute["recompute"] = True
    elif gran == "selective":
        recompute["select_recompute"] = True
    put(checkpoint, "save_interval", a.get("save_interval"))
    if a.get("optimizer") not in (None, "adam", "adamw"):
        notes.append(f"optimizer = {a['optimizer']}: the AdamW settings (betas, eps) do not apply")
    sections = {"model": model, "train": train, "precision": precision, "parallel_config": parallel,
                "recompute_config": recompute, "checkpoint": checkpoint}
    return {k: v for k, v in sections.items() if v}, notes
