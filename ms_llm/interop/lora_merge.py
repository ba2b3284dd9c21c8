"""`ms-llm convert --merge-lora CHECKPOINT --output DIR`: a LoRA run's checkpoint (adapters + the identity of its base
weights) → DIR/model.ckpt with each adapter folded into its weight, W + (alpha / rank) · B A, and DIR/config.yaml
(the run's model, no finetune.lora). The merged model computes what base + adapters computed (to float32 rounding:
tests/test_finetune_train.py compares logits), trains and samples like any checkpoint, and converts to Hugging Face
with `convert --to-hf DIR/model.ckpt` (the base's hf_origin.json is copied beside it when it has one, so the
tensors get their original names and dtypes back).
"""
import json
import os
import shutil
from dataclasses import replace

from ms_llm.errors import UserError


def checkpoint_manifest(checkpoint):
    """The manifest (step_N.json) written beside a training checkpoint."""
    path = os.path.splitext(checkpoint)[0] + ".json"
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        raise UserError(f"--merge-lora '{checkpoint}': its manifest '{path}' is missing or unreadable. Give a "
                        f"checkpoint of a LoRA run (runs/NAME/checkpoints/rank_0/step_N.ckpt) with its .json.") from None


def merge_lora_checkpoint(checkpoint, out_dir, fmt="ckpt", log=print):
    from ms_llm.checkpoint import store
    from ms_llm.checkpoint.lora import BASE_KEY, read_base
    from ms_llm.checkpoint.state import OPTIMIZER_PREFIXES
    from ms_llm.config import config_from_dict, save_config
    from ms_llm.interop.huggingface import check_shapes
    from ms_llm.nn.lora import is_adapter, merge_lora

    if not os.path.isfile(checkpoint):
        raise UserError(f"--merge-lora '{checkpoint}' does not exist. Give a checkpoint of a run with finetune.lora.")
    manifest = checkpoint_manifest(checkpoint)
    cfg = config_from_dict(manifest.get("config") or {})
    lora = cfg.finetune.lora
    if lora is None or BASE_KEY not in manifest:
        raise UserError(f"--merge-lora '{checkpoint}' is not a LoRA checkpoint (its run had no finetune.lora): it "
                        f"already holds whole weights. Convert it directly (--to-hf).")
    if os.path.exists(os.path.join(out_dir, "config.yaml")):
        raise UserError(f"'{out_dir}' already holds a model (config.yaml). Choose another --output.")
    arrays = store.read_tensors(checkpoint)
    adapters = {k: v for k, v in arrays.items() if is_adapter(k) and not k.startswith(OPTIMIZER_PREFIXES)}
    if not adapters:
        raise UserError(f"--merge-lora '{checkpoint}' holds no adapter tensors (*.lora_a / *.lora_b).")
    base = read_base(manifest[BASE_KEY], f"checkpoint '{checkpoint}'")
    plain = replace(cfg, finetune=replace(cfg.finetune, lora=None),
                    checkpoint=replace(cfg.checkpoint, load_weights=None))
    names = model_names(plain)  # a base that is itself a training checkpoint also holds optimizer state
    merged = merge_lora({**{k: base[k] for k in names if k in base}, **adapters}, lora.alpha / lora.rank)
    check_shapes(plain, merged)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "model" + store.EXTENSIONS[fmt])
    store.write_tensors(path, merged, fmt)
    save_config(plain, os.path.join(out_dir, "config.yaml"))
    origin = os.path.join(os.path.dirname(manifest[BASE_KEY]["path"]), "hf_origin.json")
    if os.path.isfile(origin):
        shutil.copy2(origin, os.path.join(out_dir, "hf_origin.json"))
    n = len([k for k in adapters if k.endswith(".lora_a")])
    log(f"merged {n} LoRA adapters (rank {lora.rank}, alpha {lora.alpha:g}) of {checkpoint} into the base "
        f"{manifest[BASE_KEY]['path']} → {path} + config.yaml"
        + (" + hf_origin.json (convert --to-hf gives the base's names and dtypes)" if os.path.isfile(origin) else ""))
    return path


def model_names(cfg):
    """The parameter names of the config's model (shapes only: no memory)."""
    from mindspore.nn.utils import no_init_parameters

    from model_zoo import build_model

    m = cfg.model if cfg.model.arch == "gpt2" else replace(cfg.model, seq_length=min(cfg.model.seq_length, 16))
    with no_init_parameters():
        return {n for n, _ in build_model(m).parameters_and_names()}
