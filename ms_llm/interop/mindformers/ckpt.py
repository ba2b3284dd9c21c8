"""MindFormers Llama checkpoints ↔ ms_llm checkpoints.

    ms-llm convert --from-mindformers CKPT_OR_RANK_DIR --config C --output DIR [--fused-layout L] [--strategy S]
        DIR/model.ckpt (float32 masters), DIR/config.yaml, DIR/mindformers_origin.json
    ms-llm convert --to-mindformers DIR/model.ckpt [--config C] --output MF_DIR [--dtype D] [--fused-layout L]
        MF_DIR/rank_0/model.ckpt in MindFormers' names

`mindformers_origin.json` remembers each tensor's original name (plain, `._layer.` or fused), dtype
(float16/bfloat16 are exact in float32) and order, so converting back reproduces the file's weights bit for
bit. Optimizer and loss-scale state in a MindFormers checkpoint are not converted (ms_llm's AdamW starts
fresh from checkpoint.load_weights); they are counted in the log line.
"""
import json
import os
import tempfile

import numpy as np

from ms_llm.errors import UserError
from ms_llm.fileio import read_user_json
from ms_llm.interop.mindformers import names
from ms_llm.config.validate import head_dim

ORIGIN = "mindformers_origin.json"
MS_DTYPES = ("float32", "float16", "bfloat16")
SAFETENSORS_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


# --- files ------------------------------------------------------------------------------------------------

def read_checkpoint(path):
    """({name: float32 array}, {name: dtype}, [names in file order]) from a MindSpore .ckpt or .safetensors."""
    if path.endswith(".safetensors"):
        from ms_llm.checkpoint import safetensors_io

        arrays, dtypes, _ = safetensors_io.load(path)
        dtypes = {k: SAFETENSORS_DTYPES.get(v, v) for k, v in dtypes.items()}
        return {k: np.asarray(v, np.float32) for k, v in arrays.items()}, dtypes, list(arrays)
    from ms_llm.checkpoint.store import load_mindspore_checkpoint

    params = load_mindspore_checkpoint(path)
    arrays, dtypes = {}, {}
    for k, p in params.items():
        dtypes[k] = str(p.dtype).replace("mindspore.", "").lower()
        arrays[k] = p.float().asnumpy() if dtypes[k] == "bfloat16" else p.asnumpy()
    return arrays, dtypes, list(params)


def write_checkpoint(path, arrays, dtypes):
    """`arrays` (float32, or numbers a dtype represents exactly) saved in the per-tensor `dtypes`."""
    import mindspore as ms

    wanted = {"float32": ms.float32, "float16": ms.float16, "bfloat16": ms.bfloat16}
    items = []
    for k, a in arrays.items():
        dtype = dtypes.get(k, "float32")
        if dtype not in wanted:
            raise UserError(f"cannot write tensor {k} as {dtype}: choose float32, float16 or bfloat16.")
        data = ms.Tensor(np.asarray(a, np.float32), wanted[dtype]) if dtype == "bfloat16" else \
            ms.Tensor(np.asarray(a, np.float16 if dtype == "float16" else np.float32))
        items.append({"name": k, "data": data})
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    ms.save_checkpoint(items, path)


def model_config(path):
    """Our validated config from `path`: an ms_llm config, or a MindFormers YAML (its model part is imported)."""
    from ms_llm.config import config_from_dict, load_config
    from ms_llm.config.loader import read_yaml
    from ms_llm.config.foreign import looks_like_mindformers

    if not path:
        raise UserError("--from-mindformers needs --config: the model's config (an ms_llm config, e.g. one written "
                        "by --from-mindformers-config, or the MindFormers YAML itself) gives the shapes.")
    raw = read_yaml(path)
    if looks_like_mindformers(raw):
        from ms_llm.interop.mindformers.config import import_config

        ours, _, _ = import_config(raw, path=f"'{path}'")
        cfg = config_from_dict(ours)
    else:
        cfg = load_config(path)
    if cfg.model.arch != "llama":
        raise UserError(f"{path}: model.arch = {cfg.model.arch}: MindFormers checkpoints are converted for Llama.")
    m = cfg.model
    apart = head_dim(m) != m.hidden_size // m.num_heads
    beyond = [k for k, v in (("qk_norm", m.qk_norm), ("head_dim", apart), ("sliding_window", m.sliding_window)) if v]
    if beyond:  # MindFormers' LlamaForCausalLM has none of these; its Qwen3 is another model with its own names
        raise UserError(f"{path}: model.{beyond[0]} is set, which MindFormers' LlamaForCausalLM (the model whose "
                        f"checkpoint names ms_llm knows: Llama 2/3, Qwen2.5) does not have. For Qwen3 or Mistral "
                        f"weights, convert the Hugging Face checkpoint with --from-hf.")
    if cfg.model.vocab_size is None:
        raise UserError(f"{path}: model.vocab_size is null; the checkpoint's embedding needs it. Set it (32000 for "
                        f"Llama 2).")
    return cfg


# --- MindFormers → ms_llm ---------------------------------------------------------------------------------

def from_mindformers(src, config_path, out_dir, fused_layout=None, strategy=None, fmt="ckpt", log=print):
    from ms_llm.checkpoint import store
    from ms_llm.config import save_config

    cfg = model_config(config_path)
    if os.path.exists(os.path.join(out_dir, "config.yaml")):
        raise UserError(f"'{out_dir}' already holds a converted model (config.yaml). Choose another --output.")
    with tempfile.TemporaryDirectory(prefix="ms_llm_mf_") as work:
        if os.path.isdir(src):
            from ms_llm.interop.mindformers.shards import merge_rank_shards

            path = merge_rank_shards(src, strategy, work, log)
        elif os.path.isfile(src):
            if strategy:
                raise UserError(f"--strategy applies to a folder of rank_<r>/ shards; '{src}' is one file (a full "
                                f"checkpoint). Drop --strategy, or give the folder.")
            path = src
        else:
            raise UserError(f"--from-mindformers '{src}' does not exist. Give a MindFormers .ckpt file, or the folder "
                            f"holding its rank_<r>/ shards (with --strategy).")
        arrays, dtypes, order = read_checkpoint(path)
    ours, origin, skipped = convert_in(arrays, dtypes, order, cfg.model, fused_layout)
    os.makedirs(out_dir, exist_ok=True)
    out = os.path.join(out_dir, "model" + store.EXTENSIONS[fmt])
    store.write_tensors(out, ours, fmt)
    save_config(cfg, os.path.join(out_dir, "config.yaml"))
    with open(os.path.join(out_dir, ORIGIN), "w", encoding="utf-8") as f:
        json.dump(origin, f, indent=1)
    n = sum(a.size for a in ours.values())
    kinds = sorted(set(origin["dtypes"].values()))
    log(f"converted MindFormers llama ({n:,} parameters from {len(origin['names'])} tensors, {'/'.join(kinds)}"
        + (f"; {skipped} optimizer/training-state tensors not converted" if skipped else "")
        + f") → {out} + config.yaml. Train from it: --set checkpoint.load_weights={out}")
    return out


def convert_in(arrays, dtypes, order, m, fused_layout):
    """(our arrays, origin record, number of training-state tensors left out); every mismatch listed at once."""
    canon, skipped = {}, 0
    for name in order:
        if names.is_training_state(name):
            skipped += 1
            continue
        canon[names.canonical(name)] = name
    fused_qkv = any(k.endswith("w_qkv.weight") for k in canon)
    fused_ffn = any(k.endswith("w_gate_hidden.weight") for k in canon)
    if (fused_qkv or fused_ffn) and fused_layout not in names.FUSED_LAYOUTS:
        which = "w_qkv" if fused_qkv else "w_gate_hidden"
        raise UserError(f"the checkpoint has fused {which} tensors (qkv_concat: true), whose row order depends on "
                        f"the MindFormers version that wrote it, and nothing in the file says which. Add "
                        f"--fused-layout grouped (MindFormers 1.4 and later: rows grouped per key/value head, gate/up "
                        f"rows interleaved) or --fused-layout concatenated (MindFormers 1.3 and earlier: [q; k; v] "
                        f"and [gate; up]).")
    expected = names.expected_shapes(m, fused_qkv, fused_ffn)
    missing = [k for k in expected if k not in canon]
    unexpected = [canon[k] for k in canon if k not in expected]
    wrong = [f"{canon[k]}: checkpoint {tuple(arrays[canon[k]].shape)}, config {expected[k]}" for k in canon
             if k in expected and tuple(arrays[canon[k]].shape) != expected[k]]
    if missing or unexpected or wrong:
        parts = ([f"missing {', '.join(missing)}"] if missing else []) + \
                ([f"unexpected {', '.join(unexpected)}"] if unexpected else []) + \
                ([f"wrong shape {'; '.join(wrong)}"] if wrong else [])
        raise UserError(f"the MindFormers checkpoint does not match the config (model.num_layers = {m.num_layers}, "
                        f"hidden_size = {m.hidden_size}, num_heads = {m.num_heads}, num_kv_heads = {m.num_kv_heads}, "
                        f"ffn_hidden_size = {m.ffn_hidden_size}, vocab_size = {m.vocab_size}, tie_embeddings = "
                        f"{str(m.tie_embeddings).lower()}): " + "; ".join(parts)
                        + ". Give the config the checkpoint was trained with.")
    mf = {k: np.asarray(arrays[canon[k]], np.float32) for k in expected}
    ours = names.to_ours(mf, m, fused_layout)
    origin = {"names": {k: canon[k] for k in expected}, "order": [canon[k] for k in canon],
              "dtypes": {canon[k]: dtypes[canon[k]] for k in expected},
              "fused_layout": fused_layout if (fused_qkv or fused_ffn) else None,
              "fused_qkv": fused_qkv, "fused_ffn": fused_ffn, "training_state_skipped": skipped}
    return ours, origin, skipped


# --- ms_llm → MindFormers ---------------------------------------------------------------------------------

def to_mindformers(checkpoint, config_path, out_dir, dtype=None, fused_layout=None, log=print):
    from ms_llm.checkpoint import store

    if not os.path.isfile(checkpoint):
        raise UserError(f"--to-mindformers '{checkpoint}' does not exist. Give an ms_llm checkpoint (.ckpt or "
                        f".safetensors), e.g. runs/x/checkpoints/rank_0/step_00002000.ckpt.")
    here = os.path.dirname(os.path.abspath(checkpoint))
    cfg = model_config(config_path or os.path.join(here, "config.yaml"))
    m = cfg.model
    origin, origin_path = find_origin(here, cfg.checkpoint.load_weights)
    if fused_layout is not None and fused_layout not in names.FUSED_LAYOUTS:
        raise UserError(f"--fused-layout {fused_layout}: choose grouped or concatenated.")
    if dtype is not None and dtype not in MS_DTYPES:
        raise UserError(f"--dtype {dtype}: choose float32, float16 or bfloat16.")
    arrays = store.read_tensors(checkpoint)
    fused_qkv = origin.get("fused_qkv", False) if fused_layout is None else True
    fused_ffn = origin.get("fused_ffn", False) if fused_layout is None else True
    layout = fused_layout or origin.get("fused_layout")
    wanted = ours_names(m)
    missing = [n for n in wanted if n not in arrays]
    if missing:
        raise UserError(f"'{checkpoint}' lacks {', '.join(missing)}: not a checkpoint of the model in "
                        f"{config_path or 'config.yaml'}.")
    mf = names.to_mindformers({k: np.asarray(arrays[k], np.float32) for k in wanted}, m, fused_qkv, fused_ffn, layout)
    original = origin.get("names", {})
    renamed = {original.get(k, k): v for k, v in mf.items()}
    order = [k for k in origin.get("order", []) if k in renamed] + [k for k in renamed if k not in original.values()]
    dtypes = {k: dtype or origin.get("dtypes", {}).get(k, "float32") for k in order}
    path = os.path.join(out_dir, "rank_0", "model.ckpt")
    if os.path.exists(path):
        raise UserError(f"'{path}' already exists. Choose another --output.")
    write_checkpoint(path, {k: renamed[k] for k in order}, dtypes)
    log(f"names, order and dtypes from {origin_path}" if origin_path else
        "no mindformers_origin.json next to the checkpoint or its run's checkpoint.load_weights: plain names"
        + (f", {dtype}" if dtype else ", float32") + (f", fused ({layout})" if fused_qkv else ""))
    log(f"wrote {len(order)} MindFormers tensors ({'/'.join(sorted(set(dtypes.values())))}) → {path}. In MindFormers: "
        f"load_checkpoint: {path} on one device, or load_checkpoint: {out_dir} with auto_trans_ckpt: True for a "
        f"distributed layout.")
    return path


def find_origin(here, load_weights):
    """The record of the MindFormers file a checkpoint descends from: next to it (a converted checkpoint), or
    next to the weights its run started from (a run fine-tuned from one; --config runs/x/config.yaml)."""
    for folder in (here, os.path.dirname(os.path.abspath(load_weights)) if load_weights else None):
        if folder and os.path.isfile(os.path.join(folder, ORIGIN)):
            path = os.path.join(folder, ORIGIN)
            return read_user_json(path, "conversion record", fix="Convert the MindFormers checkpoint again, or "
                                  "remove the file to convert without it."), path
    return {}, None


def ours_names(m):
    """Our model's parameter names: a training checkpoint also holds optimizer state, which is left out."""
    top = ["embedding", "final_norm.weight"] + ([] if m.tie_embeddings else ["lm_head"])
    per_layer = list(names.LAYER) + list(names.split(m))
    return top + [f"layers.{i}.{k}" for i in range(m.num_layers) for k in per_layer]
