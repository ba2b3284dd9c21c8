"""Hugging Face checkpoints (safetensors + config.json) ↔ ms_llm checkpoints + config.

    ms-llm convert --from-hf DIR --output OUT        OUT/model.ckpt, OUT/config.yaml, OUT/hf_origin.json
    ms-llm convert --to-hf OUT/model.ckpt --config OUT/config.yaml --output HF_DIR

One module per family says how its config.json and tensor names map to ours: gpt2.py (model_type gpt2),
llama.py (llama, mistral, qwen2, qwen3: one decoder layer with options; RoPE settings in rope.py) and moe.py
(mixtral, qwen3_moe: that layer with mixture-of-experts MLPs). This module
reads and writes the folders and dispatches on model_type.
Weights become float32 masters; `hf_origin.json` remembers the original key prefix, dtypes, config.json and whether
an lm_head tensor was present, so converting back reproduces the original tensors bit for bit.
"""
import json
import os
from dataclasses import replace

import numpy as np

from ms_llm.checkpoint import safetensors_io
from ms_llm.errors import UserError
from ms_llm.fileio import interpreting, read_user_json
from ms_llm.interop.huggingface import gpt2, llama, moe

MAX_HF_CONFIG_BYTES = 16 * 1024 * 1024  # a config.json is a few KiB
FAMILIES = {kind: module for module in (gpt2, llama, moe) for kind in module.MODEL_TYPES}


# --- reading and writing Hugging Face folders ------------------------------------------------------------

def read_hf_config(path):
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        raise UserError(f"'{path}' has no config.json: give a Hugging Face model folder (config.json + "
                        f"*.safetensors).")
    return read_user_json(cfg_path, "Hugging Face config", limit=MAX_HF_CONFIG_BYTES)


def hf_model_section(path):
    """(config.json as read, our `model:` section): a key config.json lacks or a value of the wrong type is one
    paragraph naming the file."""
    hf_cfg = read_hf_config(path)
    with interpreting(os.path.join(path, "config.json"), "Hugging Face config",
                      "Download config.json again, or fix that value."):
        return hf_cfg, model_section(hf_cfg)


def read_hf_tensors(path):
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        try:
            with open(index, encoding="utf-8") as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
            if not all(isinstance(f, str) and f and os.path.basename(f) == f for f in files):
                raise ValueError("a shard in weight_map is not a file name of the folder")
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
            raise UserError(f"'{index}' cannot be read as a safetensors index ({type(e).__name__}: {e}); it needs a "
                            f"\"weight_map\" of tensor names to shard files. Download it again.") from None
        if not files:
            raise UserError(f"'{index}' has an empty \"weight_map\": it names no shard files. Download it again.")
        missing = [f for f in files if not os.path.isfile(os.path.join(path, f))]
        if missing:
            raise UserError(f"'{index}' names {len(files)} shard(s), and {len(missing)} of them are not in '{path}': "
                            f"{', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}. The download is incomplete: "
                            f"fetch the missing file(s) (e.g. `huggingface-cli download <repo> {missing[0]} "
                            f"--local-dir {path}`).")
    else:
        files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise UserError(f"'{path}' holds no .safetensors weights (PyTorch .bin files are not read: convert them to "
                        f"safetensors with the transformers library first).")
    tensors, dtypes = {}, {}
    for f in files:
        t, d, _ = safetensors_io.load(os.path.join(path, f))
        tensors.update(t)
        dtypes.update(d)
    return tensors, dtypes


def family(kind):
    if not isinstance(kind, str) or kind not in FAMILIES:
        raise UserError(f"config.json has model_type {kind!r}: the Hugging Face families ms_llm converts are "
                        f"{', '.join(repr(k) for k in FAMILIES)} (docs/models.md).")
    return FAMILIES[kind]


def model_section(hf_cfg):
    """Our `model:` config section from a Hugging Face config.json; refuses what our model cannot express."""
    return family(hf_cfg.get("model_type")).model_section(hf_cfg)


def hf_config(m):
    """A config.json for our model config `m` (used when no original config.json was recorded)."""
    return module_for(m).hf_config(m)


# --- the name/layout maps ---------------------------------------------------------------------------------

def module_for(m):
    if m.arch == "gpt2":
        return gpt2
    return moe if m.moe is not None else llama


def detect_prefix(tensors, arch):
    probe = (gpt2 if arch == "gpt2" else llama).EMBEDDING  # before a config is validated: by arch
    for p in ("", "transformer.", "model."):
        if p + probe in tensors:
            return p
    raise UserError(f"cannot find '{probe}' (with or without a 'transformer.'/'model.' prefix) in the checkpoint: "
                    f"not a {arch} checkpoint in Hugging Face layout.")


def hf_to_ours(tensors, m, prefix):
    """{our name: float32 array}; raises with the list of missing / unexpected / mis-shaped tensors."""
    out, used, missing = {}, set(), []

    def take(key):
        used.add(key)
        if key not in tensors:
            raise KeyError(key)
        return np.asarray(tensors[key], dtype=np.float32)

    def put(name, fn):
        try:
            out[name] = fn()
        except KeyError as e:
            missing.append(str(e.args[0]))

    module_for(m).to_ours(m, prefix, take, put, used)
    ignored = {k for k in tensors if k.endswith((".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq"))}
    unexpected = sorted(set(tensors) - used - ignored)
    if missing or unexpected:
        raise UserError("the Hugging Face checkpoint does not match its config.json: "
                        + (f"missing {', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''}; " if missing else "")
                        + (f"unexpected {', '.join(unexpected[:10])}{' ...' if len(unexpected) > 10 else ''}"
                           if unexpected else "") + ".")
    return out


def ours_to_hf(arrays, m, origin):
    """Inverse of hf_to_ours, using the key prefix and tensor set recorded in `origin`."""
    module = module_for(m)
    return module.to_hf(arrays, m, origin.get("prefix", module.DEFAULT_PREFIX), origin)


# --- the two directions -----------------------------------------------------------------------------------

def from_hf(hf_dir, out_dir, fmt="ckpt", log=print):
    from ms_llm.checkpoint import store
    from ms_llm.config import config_from_dict, save_config

    hf_cfg, section = hf_model_section(hf_dir)  # refuses unsupported models before reading gigabytes of weights
    tensors, dtypes = read_hf_tensors(hf_dir)
    cfg = config_from_dict({"model": section, "train": {"seed": 0}})
    prefix = detect_prefix(tensors, cfg.model.arch)
    ours = hf_to_ours(tensors, cfg.model, prefix)
    check_shapes(cfg, ours)
    if os.path.exists(os.path.join(out_dir, "config.yaml")):
        raise UserError(f"'{out_dir}' already holds a converted model (config.yaml). Choose another --output.")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "model" + store.EXTENSIONS[fmt])
    store.write_tensors(path, ours, fmt)
    save_config(cfg, os.path.join(out_dir, "config.yaml"))
    origin = {"prefix": prefix, "has_lm_head": "lm_head.weight" in tensors, "dtypes": dtypes, "hf_config": hf_cfg}
    if cfg.model.moe is not None:  # written back in the layout it came in
        origin["expert_layout"] = moe.expert_layout(tensors, prefix)
    with open(os.path.join(out_dir, "hf_origin.json"), "w", encoding="utf-8") as f:
        json.dump(origin, f, indent=1)
    n = sum(a.size for a in ours.values())
    log(f"converted {hf_cfg.get('model_type')} as model.arch {cfg.model.arch} ({n:,} parameters, {len(tensors)} "
        f"Hugging Face tensors) → {path} + config.yaml")
    for note in getattr(family(hf_cfg.get("model_type")), "notes", lambda c: [])(hf_cfg):
        log(f"note: {note}")
    positions = hf_cfg.get("max_position_embeddings")
    if cfg.model.arch == "llama" and positions and positions > cfg.model.seq_length:
        log(f"note: model.seq_length = {cfg.model.seq_length} (the tokens per training sample); config.json allows up "
            f"to {positions:,} positions: raise it with --set model.seq_length=N")
    return path


def check_shapes(cfg, ours):
    """Every converted tensor against the shape the config implies; all offenders listed at once."""
    from mindspore.nn.utils import no_init_parameters

    from model_zoo import build_model

    m = cfg.model  # a Llama's weights do not depend on seq_length; its (seq, seq) masks would cost memory
    m = m if m.arch == "gpt2" else replace(m, seq_length=min(m.seq_length, 16))
    with no_init_parameters():  # shapes only, no memory
        shapes = {n: tuple(p.shape) for n, p in build_model(m).parameters_and_names()}
    bad = [f"{n}: checkpoint {tuple(a.shape)}, config {shapes.get(n)}" for n, a in ours.items()
           if shapes.get(n) != tuple(a.shape)]
    bad += [f"{n}: in the model, not converted" for n in shapes if n not in ours]  # would keep its random init
    if bad:
        raise UserError("tensor shapes do not match config.json: " + "; ".join(bad[:10])
                        + (" ..." if len(bad) > 10 else "") + ".")


def to_hf(checkpoint, config_path, out_dir, log=print):
    from ms_llm.checkpoint import store
    from ms_llm.config import load_config

    cfg = load_config(config_path)
    arrays = store.read_tensors(checkpoint)
    origin_path = os.path.join(os.path.dirname(os.path.abspath(checkpoint)), "hf_origin.json")
    origin = {}
    if os.path.isfile(origin_path):
        origin = read_user_json(origin_path, "conversion record", fix="Convert the Hugging Face folder again "
                                "(ms-llm convert --from-hf), or remove the file to convert without it.")
    # a value of the wrong type in the record is one paragraph naming it; the converter's own refusals stay as they are
    with interpreting(origin_path, "conversion record", "Convert the Hugging Face folder again, or remove the file.",
                      name_refusals=False):
        config_json = origin.get("hf_config") or hf_config(cfg.model)  # refuses a model no HF family computes
        hf = ours_to_hf(arrays, cfg.model, origin)
        dtypes = {k: origin.get("dtypes", {}).get(k, "F32") for k in hf}
    os.makedirs(out_dir, exist_ok=True)
    safetensors_io.save(os.path.join(out_dir, "model.safetensors"), hf, dtypes, {"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config_json, f, indent=1)
    log(f"wrote {len(hf)} tensors → {os.path.join(out_dir, 'model.safetensors')} + config.json")
    return out_dir
