"""torchtitan's training log (MetricsProcessor.log in torchtitan/components/metrics.py; train.py before 2025-03),
read into ms_llm's records.

The line, after the logger's '[titan] 2026-02-24 19:46:17,508 - root - INFO - ' (and torchrun's '[rankK]:' when
every rank's output is teed), each field coloured with ANSI codes unless metrics.disable_color_printing:

  2026-02 on:   step: 10  loss:  7.62585  grad_norm: 26.6250  memory: 66.91GiB(37.51%)  tps: 10,050
                tflops: 314.71  mfu: 13.99%                      (mfu 'N/A' under float8/MX quantisation)
  2025-06 on:   the same with loss to 4 decimals; grad_norm from 2025-06-25
  2025-02 on:   ... tps: 10,050  tflops: 314.71  mfu: 13.99%     (no grad_norm)
  2024-11 on:   ... tps: ...  mfu: ...%                          (no tflops)
  2024-03-20 on: step: 10  loss:  7.6258  memory: 66.91GiB(37.51%)  wps: 10,050  mfu: 13.99%
  2024-03-15 on: ... wps: 10,050                                 (no mfu)
  2024-03-12 on: step: 10  loss:  7.6258  wps:  10,050  peak_memory:  37.5%
and 'validate step: N  loss: ...  memory: ...  tps: ...' for validation (2025-06 on).

What a field means:
  loss      the global average over data-parallel ranks; under pipeline parallelism a stage without the loss
            prints -1.0 (the placeholder its train step returns), so the last stage's rank is the one to read.
  tps/wps   tokens per second per device; ms_llm's tokens_per_s is the whole job's: tps x devices.
  memory    the device's peak reserved memory in GiB (and the share of the device).
  mfu       percent of the device's peak; tflops per device.
Every rank prints the same line (torchrun without --local-ranks-filter): the loss is identical, tps and tflops
differ slightly. Around the line: 'Building device mesh with parallelism: pp=.., dp_replicate=.., dp_shard=..,
cp=.., tp=..' (or 'Building N-D device mesh with [...], [...]'), 'Training starts at step N', 'Training completed'.
"""
import os
import re

from ms_llm.rundir.foreign.logtext import begins_any, number
from ms_llm.rundir.foreign.parsed import Parsed

NAME, TITLE = "torchtitan", "torchtitan"
TRAIN = re.compile(r"(?:^|-\s|\s)step:\s*(\d+)\s+loss:")
VALIDATE = re.compile(r"validate step:\s*(\d+)\s+loss:\s*(\S+)")
KEYS = ("loss", "grad_norm", "memory", "tps", "wps", "tflops", "mfu", "peak_memory")
KEY = re.compile(r"\b(" + "|".join(KEYS) + r"):\s*")
MESH = re.compile(r"Building device mesh with parallelism: (.*)$")
MESH_OLD = re.compile(r"Building (\d+)-D device mesh with \[([^\]]*)\], \[([^\]]*)\]")
STARTS = re.compile(r"Training starts at step (\d+)")
LOADING = re.compile(r"Loading the checkpoint (?:at step (\d+)|from (\S+))")
COMPLETED = re.compile(r"Training completed")
OUT_OF_DATA = re.compile(r"Ran out of data")
SIGNATURES = (TRAIN, re.compile(r"\[titan\]"))
ABSENT = {
    "ms_per_step": "torchtitan prints tokens per second, not the step time",
    "loss_scale": "torchtitan trains in bfloat16 without a loss scale",
    "skipped_interval": "torchtitan does not skip steps",
    "data_wait_frac": "torchtitan keeps the data-loading time for its metrics backends (TensorBoard, W&B), not the "
                      "console line",
    "grad_norm": "this torchtitan version prints no grad_norm (2025-06-25 on)",
    "mfu": "no mfu field (2024-03-20 on), or N/A under quantised training",
    "val_loss": "no validation line (validation.enable off, or a version before 2025-06)",
}


def starts(text):
    return bool(TRAIN.search(text)) and not VALIDATE.search(text)


def complete(text):
    """A whole line ends with its last field: mfu (x.xx% or N/A) since 2024-03-20, else wps/peak_memory."""
    t = text.rstrip()
    if re.search(r"mfu:\s*(?:[\d.]+%|N/A)$", t):
        return True
    if "mfu" in t or re.search(r"\b(?:tps|tflops|grad_norm):", t):
        return False  # these forms end with mfu
    return bool(re.search(r"wps:\s*[\d,]+$|peak_memory:\s*[\d.]+%$", t))  # 2024-03-12..20: no mfu yet


def begins_line(text):
    return begins_any(text) or bool(TRAIN.search(text))


def parse_fields(body, whole):
    found = [(m.group(1), m.start(), m.end()) for m in KEY.finditer(body)]
    values = {}
    for i, (key, _, end) in enumerate(found):
        stop = found[i + 1][1] if i + 1 < len(found) else len(body)
        if i + 1 == len(found) and not whole:
            break
        values[key] = body[end:stop].strip()
    rec = {}
    if "loss" in values:
        rec["loss"] = number(values["loss"])
    if "grad_norm" in values:
        rec["grad_norm"] = number(values["grad_norm"])
    if "memory" in values:
        m = re.match(r"([\d.]+)GiB\(([\d.]+)%\)", values["memory"])
        if m:
            rec["mem_gib"], rec["mem_share"] = float(m.group(1)), float(m.group(2)) / 100
    if "peak_memory" in values:
        v = number(values["peak_memory"].rstrip("%"))
        if v is not None:
            rec["mem_share"] = v / 100
    for key in ("tps", "wps"):
        if key in values:
            rec["tokens_per_s_per_device"] = number(values[key])
    if "tflops" in values:
        rec["tflops"] = number(values["tflops"])
    if "mfu" in values and values["mfu"].endswith("%"):
        v = number(values["mfu"].rstrip("%"))
        if v is not None:
            rec["mfu"] = v / 100
    return {k: v for k, v in rec.items() if v is not None}, set(values)


def read(lines, counts):
    p = Parsed(TITLE, counts=counts, absent=dict(ABSENT))
    order = 0
    for line in lines:
        text = line.text
        order += 1
        m = VALIDATE.search(text)
        if m or "validate step:" in text:
            v = number(m.group(2)) if m and not (line.last and m.end() >= len(text.rstrip())) else None
            if v is not None:
                p.evals.append((line.rank, order, {"step": int(m.group(1)), "val_loss": v}))
                counts["validation lines"] += 1
            continue
        m = TRAIN.search(text)
        if m:
            body = text[m.start():]
            rec, keys = parse_fields(body, not line.last)
            p.features.update(keys)
            if rec.get("loss") == -1.0:
                rec["loss"] = None
                rec["loss_note"] = "a pipeline stage without the loss prints -1.0"
                counts["placeholder losses of pipeline stages without the loss"] += 1
            p.train.append((line.rank, order, {"step": int(m.group(1)), **rec}))
            counts["training lines"] += 1
            continue
        m = MESH.search(text)
        if m:
            degrees = {k: int(v) for k, v in re.findall(r"(\w+)=(-?\d+)", m.group(1))}
            p.info["mesh"] = degrees
            world = 1
            for k in ("pp", "dp_replicate", "dp_shard", "cp", "tp"):
                world *= max(1, degrees.get(k, 1))
            p.info["world_size"] = world
            continue
        m = MESH_OLD.search(text)
        if m:
            sizes = [int(x) for x in re.findall(r"\d+", m.group(3))]
            names = re.findall(r"'(\w+)'", m.group(2))
            p.info["mesh"] = dict(zip(names, sizes))
            world = 1
            for s in sizes:
                world *= s
            p.info["world_size"] = world
            continue
        m = STARTS.search(text)
        if m:
            start = int(m.group(1))
            if start > 1:
                p.events.append((line.rank, order, {"step": start - 1, "event": "resume"}))
            p.restarts.append((line.rank, order, start - 1))
            continue
        if COMPLETED.search(text):
            p.ended = True
            continue
        if OUT_OF_DATA.search(text):
            p.events.append((line.rank, order, {"step": p.train[-1][2]["step"] if p.train else 0,
                                                "event": "stop_at_step", "detail": "ran out of data"}))
            continue
        counts["other lines (not metrics)"] += 1
    p.info["version"] = version(p.features)
    return p


def version(features):
    if "grad_norm" in features:
        return "torchtitan 2025-06 or later (grad_norm)"
    if "tflops" in features:
        return "torchtitan 2025-02 to 2025-06 (tflops)"
    if "tps" in features:
        return "torchtitan 2024-11 to 2025-02 (tps)"
    if "mfu" in features:
        return "torchtitan 2024-03 to 2024-11 (wps, mfu)"
    if "wps" in features:
        return "torchtitan 2024-03 (wps, the first form)"
    return ""


# --- the TOML beside the log → ms_llm's config ----------------------------------------------------------

# Llama 3 flavors (torchtitan/models/llama3/__init__.py at 9810191~1): dim, layers, heads, kv heads, vocab
FLAVORS = {"debugmodel": (256, 6, 16, None, 2048), "8B": (4096, 32, 32, 8, 128256),
           "70B": (8192, 80, 64, 8, 128256), "405B": (16384, 126, 128, 8, 128256)}
# torchtitan/config/job_config.py defaults (the same revision) of the keys mapped below
DEFAULTS = {"optimizer": {"lr": 8e-4, "eps": 1e-8, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95},
            "lr_scheduler": {"warmup_steps": 200, "decay_type": "linear", "min_lr_factor": 0.0},
            "training": {"local_batch_size": 8, "global_batch_size": -1, "seq_len": 2048, "max_norm": 1.0,
                         "steps": 10000, "mixed_precision_param": "bfloat16", "seed": None},
            "parallelism": {"data_parallel_replicate_degree": 1, "data_parallel_shard_degree": -1,
                            "tensor_parallel_degree": 1, "pipeline_parallel_degree": 1,
                            "context_parallel_degree": 1, "expert_parallel_degree": 1},
            "metrics": {"log_freq": 10}, "checkpoint": {"interval": 500}, "validation": {"freq": 10}}


def load_toml(path):
    """(mapping, note): tomllib on Python 3.11+, tomli before it where installed, else nothing with a note."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python < 3.11
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            return None, f"{path}: not read (Python < 3.11 needs 'pip install tomli' to read TOML)"
    try:
        with open(path, "rb") as f:
            return tomllib.load(f), ""
    except (OSError, ValueError) as e:
        return None, f"{path}: not read as TOML ({e})"


def find_toml(paths):
    seen = set()
    for path in paths:
        d = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
        for _ in range(3):
            if d in seen or not os.path.isdir(d):
                break
            seen.add(d)
            for name in sorted(os.listdir(d)):
                if name.endswith(".toml") and name != "pyproject.toml":
                    return os.path.join(d, name)
            d = os.path.dirname(d)
    return None


def config_from_toml(raw, world=None):
    """ms_llm's nested config from a torchtitan job TOML, torchtitan's defaults for the keys it leaves out (older
    TOMLs keep warmup_steps and the parallel degrees under [training]; those are read too)."""
    def get(section, key):
        for where in ((section,), ("training",)):
            node = raw.get(where[0]) or {}
            if key in node:
                return node[key]
        return DEFAULTS.get(section, {}).get(key)

    notes = []
    model = {"arch": "llama"}
    flavor = (raw.get("model") or {}).get("flavor")
    name = (raw.get("model") or {}).get("name", "llama3")
    if flavor in FLAVORS and str(name).startswith("llama"):
        dim, layers, heads, kv, vocab = FLAVORS[flavor]
        model.update(hidden_size=dim, num_layers=layers, num_heads=heads, vocab_size=vocab)
        if kv:
            model["num_kv_heads"] = kv
    elif flavor:
        notes.append(f"model {name} {flavor}: its shape is not in the Llama 3 table; the model section has the "
                     f"sequence length only")
    seq = get("training", "seq_len")
    model["seq_length"] = seq
    lr = get("optimizer", "lr")
    train = {"lr": lr, "eps": get("optimizer", "eps"), "weight_decay": get("optimizer", "weight_decay"),
             "beta1": get("optimizer", "beta1"), "beta2": get("optimizer", "beta2"),
             "warmup_steps": get("lr_scheduler", "warmup_steps"), "max_steps": get("training", "steps"),
             "clip_grad": get("training", "max_norm"), "micro_batch_size": get("training", "local_batch_size"),
             "log_interval": get("metrics", "log_freq")}
    decay = get("lr_scheduler", "decay_type")
    if decay in ("linear", "cosine"):
        train["lr_schedule"] = decay
    else:
        notes.append(f"lr_scheduler.decay_type = {decay}: ms_llm has no such schedule")
    factor = (raw.get("lr_scheduler") or {}).get("min_lr_factor")
    lr_min = (raw.get("lr_scheduler") or {}).get("lr_min", factor)
    if lr is not None:
        train["min_lr"] = lr * (lr_min if lr_min is not None else DEFAULTS["lr_scheduler"]["min_lr_factor"])
    if (raw.get("lr_scheduler") or {}).get("decay_ratio") is not None:
        notes.append("lr_scheduler.decay_ratio: torchtitan holds the LR at its peak before decaying "
                     "(warmup-stable-decay); ms_llm's schedule rules read the warmup and the peak only")
    replicate = get("parallelism", "data_parallel_replicate_degree") or 1
    shard = get("parallelism", "data_parallel_shard_degree")
    if shard is None:
        shard = get("parallelism", "data_parallel_degree")
    tp = get("parallelism", "tensor_parallel_degree") or 1
    pp = get("parallelism", "pipeline_parallel_degree") or 1
    cp = get("parallelism", "context_parallel_degree") or 1
    if shard == -1 and world:
        shard = world // max(1, replicate * tp * pp * cp)
    parallel = {"model_parallel": tp, "pipeline_stage": pp}
    if isinstance(shard, int) and shard > 0:
        dp = replicate * shard
        parallel["data_parallel"] = dp
        glob = get("training", "global_batch_size")
        train["global_batch_size"] = glob if glob and glob > 0 else train["micro_batch_size"] * dp
    mixed = get("training", "mixed_precision_param")
    precision = {"compute_dtype": "bfloat16" if mixed == "bfloat16" else "float32", "loss_scale": "none"}
    train = {k: v for k, v in train.items() if v is not None}
    return {"model": model, "train": train, "precision": precision, "parallel_config": parallel}, notes
