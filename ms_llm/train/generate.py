"""Text generation from a finished run: `ms-llm sample --run-dir D --prompt "ROMEO:"`.

The model is always called on a fixed (1, seq_length) window so the graph compiles once: the context is
right-padded and the logits are read at the last real position (causal attention never looks right).
"""
import os

import numpy as np

from ms_llm.errors import UserError


def load_run(run_dir, checkpoint=None):
    """(config, tokenizer, model with the run's weights) for a run directory."""
    from ms_llm.checkpoint import store
    from ms_llm.config import load_config
    from ms_llm.data.manifest import load_manifest
    from ms_llm.data.tokenizers import from_spec

    cfg_path = os.path.join(run_dir, "config.yaml")
    if not os.path.isfile(cfg_path):
        raise UserError(f"'{run_dir}' is not a run directory (no config.yaml). Pass the --run-dir of a training run.")
    cfg = load_config(cfg_path)
    tokenizer = from_spec(load_manifest(cfg.data.dataset_dir)["tokenizer"])
    directory = store.rank_dir(run_dir, 0)
    if checkpoint is None:
        step, _ = store.newest_valid(directory)
        if step is None:
            raise UserError(f"run '{run_dir}' has no complete checkpoint in {directory}. Train it to the end (or to a "
                            f"checkpoint.save_interval) first.")
        checkpoint = os.path.join(directory, f"step_{step:08d}.ckpt")
    import mindspore as ms
    from model_zoo import build_model

    model = build_model(cfg.model, cfg.precision.compute_dtype)
    params = ms.load_checkpoint(checkpoint)
    missing, _ = ms.load_param_into_net(model, params, strict_load=False)
    if missing:
        raise UserError(f"checkpoint '{checkpoint}' lacks {len(missing)} model tensors (e.g. {missing[0]}): it was not "
                        f"written for this run's model. Pass the run's own checkpoint.")
    model.set_train(False)
    return cfg, tokenizer, model


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


def sample(run_dir, prompt="\n", max_new_tokens=500, temperature=0.8, top_k=200, seed=0, num_samples=1, checkpoint=None):
    from ms_llm.train.context import setup_context

    from ms_llm.config import load_config

    cfg_path = os.path.join(run_dir, "config.yaml")
    if os.path.isfile(cfg_path):
        setup_context(load_config(cfg_path).context)
    cfg, tokenizer, model = load_run(run_dir, checkpoint)
    prompt_ids = tokenizer.encode(prompt) if prompt else np.array([tokenizer.eod_id], np.int32)
    outs = []
    for i in range(num_samples):
        ids = generate(model, prompt_ids.tolist(), max_new_tokens, cfg.model.seq_length, temperature, top_k, seed + i)
        outs.append(tokenizer.decode(ids))
    return outs
