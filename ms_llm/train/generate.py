"""Text generation from a finished run: `ms-llm sample --run-dir D --prompt "ROMEO:"`.

The model is always called on a fixed (1, seq_length) window so the graph compiles once: the context is
right-padded and the logits are read at the last real position (causal attention never looks right).
"""
import numpy as np


def load_run(run_dir, checkpoint=None, with_manifest=False):
    """(config, tokenizer, model with the run's weights) for a run directory (+ the dataset manifest)."""
    from ms_llm.data.manifest import load_manifest
    from ms_llm.data.tokenizers import from_spec
    from ms_llm.train.run_model import load_run_model

    cfg, model, _ = load_run_model(run_dir, checkpoint=checkpoint)
    manifest = load_manifest(cfg.data.dataset_dir, blend=cfg.data.blend)
    out = (cfg, from_spec(manifest["tokenizer"]), model)
    return out + (manifest,) if with_manifest else out


def chat_prompt(manifest, tokenizer, prompt, run_dir):
    """(prompt ids, stop id) for `sample --chat`: the prompt as the user's message, rendered with the chat template
    the run's data was made with and the assistant header after it; generation stops at the template's eos_token."""
    from ms_llm.data.templates import ChatTemplate
    from ms_llm.errors import UserError

    spec = manifest.get("chat_template")
    if not spec:
        raise UserError(f"sample --chat: the dataset of run '{run_dir}' has no chat template (it was not made with "
                        f"`ms-llm preprocess --format chat|instruction`). Sample without --chat, or from a run "
                        f"fine-tuned on chat data.")
    template = ChatTemplate.from_spec(spec)
    text = template.render([{"role": "user", "content": prompt}], add_generation_prompt=True)
    eos = template.special_tokens.get("eos_token")
    stop = tokenizer.token_id(eos) if eos and hasattr(tokenizer, "token_id") else None
    return tokenizer.encode(text), (tokenizer.eod_id if stop is None else stop)


def generate(model, ids, max_new_tokens, seq_length, temperature=0.8, top_k=200, seed=0, eod_id=None):
    import mindspore as ms

    rng = np.random.default_rng(seed)
    ids = list(ids)
    window = np.zeros((1, seq_length), np.int32)
    for _ in range(max_new_tokens):
        ctx = ids[-seq_length:]
        window[0, :] = 0
        window[0, : len(ctx)] = ctx
        logits = model(ms.Tensor(window)).asnumpy()[0, len(ctx) - 1].astype(np.float64)
        if temperature <= 0:
            nxt = int(np.argmax(logits))
        else:
            logits = logits / temperature
            if top_k and top_k < logits.size:
                cutoff = np.partition(logits, -top_k)[-top_k]
                logits[logits < cutoff] = -np.inf
            p = np.exp(logits - logits.max())
            nxt = int(rng.choice(p.size, p=p / p.sum()))
        ids.append(nxt)
        if eod_id is not None and nxt == eod_id:
            break
    return ids


def sample(run_dir, prompt="\n", max_new_tokens=500, temperature=0.8, top_k=200, seed=0, num_samples=1, checkpoint=None,
           chat=False):
    """Generated texts; with `chat`, the assistant's replies to `prompt` (rendered with the run's chat template)."""
    from ms_llm.train.context import setup_context
    from ms_llm.train.run_model import load_run_config

    setup_context(load_run_config(run_dir).context)
    cfg, tokenizer, model, manifest = load_run(run_dir, checkpoint, with_manifest=True)
    stop = None
    if chat:
        prompt_ids, stop = chat_prompt(manifest, tokenizer, prompt, run_dir)
    else:
        prompt_ids = tokenizer.encode(prompt) if prompt else np.array([tokenizer.eod_id], np.int32)
    outs = []
    for i in range(num_samples):
        ids = generate(model, prompt_ids.tolist(), max_new_tokens, cfg.model.seq_length, temperature, top_k, seed + i,
                       eod_id=stop)
        outs.append(tokenizer.decode(ids[len(prompt_ids):] if chat else ids))
    return outs
