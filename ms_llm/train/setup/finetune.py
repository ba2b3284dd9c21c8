"""Fine-tuning inside the ordinary session: what a run with `finetune.lora` and `data.extra_val` change, kept here so
that the session, step and trainer each change by a line. (Chat/instruction data, a dataset with a loss_mask column,
is the masked loss's: ms_llm/train/losses/masked.py.)

  * LoRA: adapters applied to the model from outside (ms_llm/nn/lora.py) before the optimizer sees its trainable
    parameters; the base weights come from checkpoint.load_weights and are frozen; checkpoints hold the adapters and
    the base's identity (ms_llm/checkpoint/lora.py);
  * data.extra_val: a second validation set, plain text, evaluated beside the first as extra_val_loss.
"""
from dataclasses import dataclass, field
from typing import Any, List, Optional

import numpy as np

from ms_llm.data.manifest import has_loss_mask
from ms_llm.errors import UserError
from model_zoo import weights


def check(cfg, manifest, parallel):
    """Refuse what fine-tuning cannot run, before anything is built."""
    ft = cfg.finetune
    if ft.preference is not None and manifest.get("format") != "preference":
        raise UserError(f"finetune.preference is set but data.dataset_dir = '{cfg.data.dataset_dir}' holds "
                        f"{manifest.get('format') or 'text'} data, not preference pairs. Preprocess chosen/rejected "
                        f"pairs with `ms-llm preprocess --format preference` (docs/preference.md), or remove "
                        f"finetune.preference.")
    if ft.lora is not None and not cfg.checkpoint.load_weights:
        raise UserError("finetune.lora is set but checkpoint.load_weights is not: LoRA adapts existing weights, which "
                        "stay frozen. Set checkpoint.load_weights to the base model's checkpoint (e.g. the model.ckpt "
                        "of `ms-llm convert --from-hf`), or remove finetune.lora for training from scratch.")
    if manifest.get("blend") and any(has_loss_mask(c["manifest"]) for c in manifest["blend"]):
        raise UserError("data.blend mixes in a chat/instruction dataset (one with a loss mask): blends of fine-tuning "
                        "datasets are not supported yet (the blend would drop the mask and train on the prompts). "
                        "Train on the fine-tuning dataset alone (data.dataset_dir).")
    if has_loss_mask(manifest) and (parallel.pp > 1 or parallel.semi_auto):
        raise UserError("a chat/instruction dataset (loss mask, packed conversations) with model or pipeline "
                        "parallelism: the masked loss and the per-conversation attention mask run under data "
                        "parallelism only for now. Set parallel_config.model_parallel: 1 and pipeline_stage: 1 "
                        "(LoRA's small optimizer state often makes the model fit without them).")
    if ft.lora is not None and (parallel.pp > 1 or parallel.semi_auto):
        raise UserError("finetune.lora with model or pipeline parallelism: the adapters are not in the layouts' "
                        "sharding tables yet. Use data parallelism (model_parallel: 1, pipeline_stage: 1).")


@dataclass
class FinetuneState:
    """What a session holds for LoRA and data.extra_val (None for a run with neither)."""
    lora: Any = None  # the finetune.lora section, when set
    adapted: List[str] = field(default_factory=list)  # paths of the projections that got adapters
    base: Optional[dict] = None  # identity of the base weights (LoRA)
    extra_val: List[Any] = field(default_factory=list)  # data.extra_val batches
    extra_loss: Any = None  # the loss cell data.extra_val is evaluated with (plain text: ms_llm/train/losses)


def prepare(cfg, manifest, model, log):
    """Apply LoRA to the freshly built model (before the optimizer takes its trainable parameters); returns the
    session's FinetuneState, or None for a run without LoRA and data.extra_val."""
    ft = cfg.finetune
    if has_loss_mask(manifest) and manifest.get("format") != "preference":
        describe_masked_data(cfg, manifest, log)
    if ft.lora is None and not cfg.data.extra_val:
        return None
    state = FinetuneState(lora=ft.lora)
    if ft.lora is not None:
        from model_zoo import count_params
        from ms_llm.nn.lora import apply_lora

        l = ft.lora
        state.adapted = apply_lora(model, l.rank, l.alpha, l.dropout, l.targets, cfg.train.seed)
        if not state.adapted:
            raise UserError(f"finetune.lora.targets = {l.targets} match no projection of this {cfg.model.arch} model. "
                            f"Use qkv, out, gate_up, down (llama) or qkv, out, up, down (gpt2).")
        trainable = sum(int(np.prod(p.shape)) for p in model.trainable_params())
        log(f"LoRA: rank {l.rank}, alpha {l.alpha:g} on {len(state.adapted)} projections "
            f"({', '.join(sorted({p.rsplit('.', 1)[-1] for p in state.adapted}))}); trainable {trainable:,} of "
            f"{count_params(model):,} parameters ({100 * trainable / count_params(model):.2f}%), base weights frozen")
    return state


def describe_masked_data(cfg, manifest, log):
    from ms_llm.train.losses.masked import documents

    f = manifest.get("finetune", {}).get("train", {})
    log(f"fine-tuning data ({manifest.get('format')}): "
        + (f"the loss counts the response tokens only ({100 * (f.get('loss_fraction') or 0):.1f}% of tokens)"
           if cfg.finetune.loss_mask else "finetune.loss_mask = false: the loss counts every token, prompts included")
        + ("; packed conversations are kept apart (block-diagonal attention, positions per conversation)"
           if documents(cfg, manifest) else ""))


def load_extra_val(state, cfg, manifest, dp, data_rank, accum):
    """data.extra_val's validation batches, checked against the training data. Returns its manifest (the session
    chooses the loss they are evaluated with from it), or None without data.extra_val."""
    path = cfg.data.extra_val
    if not path or state is None:
        return None
    from ms_llm.data.loader import eval_batches
    from ms_llm.data.manifest import load_manifest
    from ms_llm.data.tokenizers import same_tokenizer

    extra = load_manifest(path)
    if not same_tokenizer(extra["tokenizer"], manifest["tokenizer"]):
        raise UserError(f"data.extra_val = '{path}' was made with another tokenizer than data.dataset_dir: its loss "
                        f"would not be comparable. Preprocess it with the training data's tokenizer "
                        f"(--tokenizer {manifest['tokenizer'].get('path', '...')}).")
    if extra["seq_length"] < cfg.model.seq_length:
        raise UserError(f"data.extra_val = '{path}' holds samples of {extra['seq_length'] + 1} tokens, shorter than "
                        f"model.seq_length + 1 = {cfg.model.seq_length + 1}. Preprocess it with --seq-length "
                        f"{cfg.model.seq_length}.")
    if has_loss_mask(extra):
        raise UserError(f"data.extra_val = '{path}' is a chat/instruction dataset: the second validation set is "
                        f"plain text (the base model's domain), to see what fine-tuning costs there.")
    state.extra_val = eval_batches(path, extra, cfg.train.micro_batch_size, cfg.train.eval_steps, dp, data_rank,
                                   cfg.model.seq_length, cfg.data.num_workers, accum)
    return extra


# --- LoRA weights -----------------------------------------------------------------------------------------

def load_base(session, path, log):
    """checkpoint.load_weights of a LoRA run: the base weights into the frozen parameters (the adapters keep their
    initialisation: B = 0, so the model starts as the base model); remembers the base's identity."""
    import mindspore as ms
    from ms_llm.checkpoint import store
    from ms_llm.checkpoint.lora import base_identity

    try:
        arrays = store.read_tensors(path)
    except Exception as e:  # noqa: BLE001 (any unreadable file gets the same explanation)
        raise UserError(f"checkpoint.load_weights = '{path}' cannot be read ({type(e).__name__}): not a MindSpore "
                        f"or safetensors checkpoint, or truncated.") from None
    frozen = [p for p in weights(session.model).values() if not p.requires_grad]
    missing = [p.name for p in frozen if p.name not in arrays]
    bad = [f"{p.name} {arrays[p.name].shape} vs {tuple(p.shape)}" for p in frozen
           if p.name in arrays and tuple(arrays[p.name].shape) != tuple(p.shape)]
    if missing or bad:
        raise UserError(f"checkpoint.load_weights = '{path}' does not fit this model: "
                        + (f"missing {', '.join(missing[:6])}; " if missing else "")
                        + (f"shape mismatch {'; '.join(bad[:6])}" if bad else "")
                        + ". LoRA needs the base model's own checkpoint and config.")
    for p in frozen:
        p.set_data(ms.Tensor(arrays[p.name]).astype(p.dtype))
    session.finetune.base = base_identity(path)
    log(f"LoRA base weights from {path} (SHA-256 {session.finetune.base['sha256'][:16]}…)")


def load_base_for_resume(session, manifest, path, log):
    """Resuming a LoRA run: its checkpoint holds the adapters; the base comes from the identity it recorded."""
    import mindspore as ms
    from ms_llm.checkpoint.lora import BASE_KEY, read_base

    identity = manifest.get(BASE_KEY)
    if identity is None:
        raise UserError(f"checkpoint '{path}' records no LoRA base weights ({BASE_KEY}): it was not written by a run "
                        f"with finetune.lora. Resume it without finetune.lora.")
    arrays = read_base(identity, f"checkpoint '{path}'")
    for p in weights(session.model).values():
        if not p.requires_grad:
            p.set_data(ms.Tensor(arrays[p.name]).astype(p.dtype))
    session.finetune.base = identity
    log(f"LoRA base weights from {identity['path']} (SHA-256 checked)")
