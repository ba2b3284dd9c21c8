"""Fine-tuning inside the ordinary session: what a run on chat/instruction data (a dataset with a loss_mask column)
and a run with `finetune.lora` change, kept here so that the session, step and trainer each change by a line.

  * data: micro-batches are (ids, loss mask, segment ids) (`ms_llm.data.loader.Batch`); the step gets
    (ids, token weights, segment ids, the rank's count of masked-in tokens) per micro-batch (`FinetuneState.inputs`),
    the loss is `masked_loss.MaskedLossFn`, validation `MaskedEvalStep` (the masked mean, and the prompt tokens'
    loss beside it);
  * LoRA: adapters applied to the model from outside (ms_llm/nn/lora.py) before the optimizer sees its trainable
    parameters; the base weights come from checkpoint.load_weights and are frozen; checkpoints hold the adapters and
    the base's identity (ms_llm/checkpoint/lora.py);
  * data.extra_val: a second validation set, plain text, evaluated beside the first as extra_val_loss.
"""
from dataclasses import dataclass, field
from typing import Any, List, Optional

import numpy as np

from ms_llm.errors import UserError


def has_loss_mask(manifest):
    return "loss_mask" in (manifest.get("columns") or ())


def check(cfg, manifest, parallel):
    """Refuse what fine-tuning cannot run, before anything is built."""
    ft = cfg.finetune
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
    if has_loss_mask(manifest) and cfg.model.moe is not None:
        raise UserError("a chat/instruction dataset (loss mask) with model.moe: the masked loss does not add the "
                        "router's load-balancing loss yet, so the experts would collapse unnoticed. Fine-tune a dense "
                        "model, or train the MoE model on plain text (a dataset without a loss mask).")
    if ft.lora is not None and (parallel.pp > 1 or parallel.semi_auto):
        raise UserError("finetune.lora with model or pipeline parallelism: the adapters are not in the layouts' "
                        "sharding tables yet. Use data parallelism (model_parallel: 1, pipeline_stage: 1).")


@dataclass
class FinetuneState:
    """What a session holds for fine-tuning (None for a plain run)."""
    masked: bool  # the dataset has a loss mask (the masked loss and evaluation are used)
    use_mask: bool  # finetune.loss_mask: the loss counts the response tokens only
    lora: Any = None  # the finetune.lora section, when set
    adapted: List[str] = field(default_factory=list)  # paths of the projections that got adapters
    base: Optional[dict] = None  # identity of the base weights (LoRA)
    extra_val: List[Any] = field(default_factory=list)  # data.extra_val batches
    extra_eval_step: Any = None
    loss_tokens: float = 0.0  # masked-in targets of this rank's micro-batches since the last log line
    target_tokens: float = 0.0  # real (non-padding) targets of the same micro-batches

    def inputs(self, batches):
        """The step's arguments per micro-batch: plain batches as they are; fine-tuning batches with their token
        weights and the count of the rank's masked-in tokens over the whole step (masked_loss)."""
        import mindspore as ms
        from ms_llm.train.masked_loss import target_weights

        if not self.masked:
            return [(b,) for b in batches]
        cols = [(b.loss_mask.asnumpy(), b.segments.asnumpy()) for b in batches]
        weights = [target_weights(m, s, self.use_mask) for m, s in cols]
        count = ms.Tensor(np.float32(sum(float(w.sum()) for w in weights)))
        self.loss_tokens += float(sum(w.sum() for w in weights))
        self.target_tokens += float(sum(target_weights(m, s, False).sum() for m, s in cols))
        return [(b.ids, ms.Tensor(w), b.segments, count) for b, w in zip(batches, weights)]

    def log_fields(self):
        """Fields of a log record: the share of this rank's target tokens the loss counted since the last record."""
        if not self.masked or not self.target_tokens:
            return {}
        out = {"loss_tokens_frac": round(self.loss_tokens / self.target_tokens, 5)}
        self.loss_tokens = self.target_tokens = 0.0
        return out


def prepare(cfg, manifest, model, log):
    """Apply LoRA to the freshly built model (before the optimizer takes its trainable parameters); returns the
    session's FinetuneState, or None for a plain run."""
    ft = cfg.finetune
    masked = has_loss_mask(manifest)
    if not masked and ft.lora is None and not cfg.data.extra_val:
        return None
    state = FinetuneState(masked=masked, use_mask=ft.loss_mask, lora=ft.lora)
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
    if masked:
        f = manifest.get("finetune", {}).get("train", {})
        log(f"fine-tuning data ({manifest.get('format')}): "
            + (f"the loss counts the response tokens only ({100 * (f.get('loss_fraction') or 0):.1f}% of tokens)"
               if ft.loss_mask else "finetune.loss_mask = false: the loss counts every token, prompts included")
            + ("; packed conversations are kept apart (block-diagonal attention, positions per conversation)"
               if documents(cfg, manifest) else ""))
    return state


def documents(cfg, manifest):
    """Whether the model gets segment ids: packed samples, unless finetune.document_mask is off. One conversation
    per sample (--no-pack) needs no mask: its padding comes after it, which causal attention never sees."""
    return bool(manifest.get("packed")) and cfg.finetune.document_mask


def loss_fn(model, cfg, manifest, accum, dp):
    """The step's loss for fine-tuning data (None: the plain LossFn)."""
    if not has_loss_mask(manifest):
        return None
    from ms_llm.train.masked_loss import MaskedLossFn

    return MaskedLossFn(model, accum, dp, documents(cfg, manifest))


def eval_step(model, cfg, manifest):
    if not has_loss_mask(manifest):
        return None
    from ms_llm.train.masked_loss import MaskedEvalStep

    return MaskedEvalStep(model, documents(cfg, manifest))


def load_extra_val(state, cfg, manifest, model, micro_batch, dp, data_rank, accum):
    """data.extra_val's validation batches (and its plain evaluation step), checked against the training data."""
    path = cfg.data.extra_val
    if not path or state is None:
        return
    from ms_llm.data.loader import eval_batches
    from ms_llm.data.manifest import load_manifest
    from ms_llm.data.tokenizers import same_tokenizer
    from ms_llm.train.evaluate import EvalStep

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
    state.extra_val = eval_batches(path, extra, micro_batch, cfg.train.eval_steps, dp, data_rank,
                                   cfg.model.seq_length, cfg.data.num_workers, accum)
    state.extra_eval_step = EvalStep(model)


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
    frozen = [p for p in session.model.get_parameters() if not p.requires_grad]
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
    for p in session.model.get_parameters():
        if not p.requires_grad:
            p.set_data(ms.Tensor(arrays[p.name]).astype(p.dtype))
    session.finetune.base = identity
    log(f"LoRA base weights from {identity['path']} (SHA-256 checked)")


def evaluate_session(s):
    """The evaluation record of a session: val_loss and val_tokens (for fine-tuning data: over the response tokens,
    with val_loss_prompt beside it), and data.extra_val's extra_val_loss when set."""
    from ms_llm.train.evaluate import evaluate, evaluate_masked

    st = s.finetune
    if st is not None and st.masked:
        record = evaluate_masked(s.model, s.eval_step, s.val, s.rt) if s.val else {"val_loss": float("nan")}
    else:
        record = {"val_loss": evaluate(s.model, s.eval_step, s.val, s.rt),
                  "val_tokens": len(s.val) * int(s.val[0].shape[0]) * s.cfg.model.seq_length * s.rt.world_size}
    if st is not None and st.extra_val:
        record["extra_val_loss"] = evaluate(s.model, st.extra_eval_step, st.extra_val, s.rt)
    return record
