"""What a checkpoint holds, and putting it back.

Tensors: every parameter of the training step — fp32 master weights, AdamW moments and step, loss scale
and its clean-step counter, the global step that indexes the LR schedule — and MindSpore's RNG state.
Manifest (JSON): the data position (samples consumed, epoch), the numpy/Python RNG states, the resolved
config, versions, and the host-side state of the current log interval, so a resumed run logs exactly the
lines an uninterrupted one would.
"""
import platform
import random

import numpy as np

from ms_llm.config import to_dict
from ms_llm.errors import UserError

OPTIMIZER_PREFIXES = ("adam_m.", "adam_v.")
OPTIMIZER_NAMES = ("adam_step",)
# config keys that must match between a checkpoint and the run resuming it
MUST_MATCH = {"model": ("arch", "num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size",
                        "seq_length", "vocab_size", "bias", "tie_embeddings", "moe"),
              "parallel_config": ("data_parallel", "model_parallel", "pipeline_stage")}


def capture(session):
    """A host copy of the training state: safe to write from another thread while training goes on."""
    import mindspore as ms

    arrays = {name: np.array(p.asnumpy(), copy=True) for name, p in session.checkpoint_parameters().items()}
    arrays["rng_state"] = np.array(ms.get_rng_state().asnumpy(), copy=True)
    return arrays


def describe(session, step, host_state):
    import mindspore as ms

    np_state = np.random.get_state()
    return {
        "step": step,
        "consumed_samples": session.data.consumed,
        "epoch": session.data.epoch,
        "world_size": session.rt.world_size,
        "config": to_dict(session.cfg),
        "versions": {"python": platform.python_version(), "mindspore": ms.__version__, "numpy": np.__version__},
        "rng": {"numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
                "python": repr(random.getstate())},
        "host": host_state,
        **lora_base(session),
    }


def lora_base(session):
    """{"lora_base": identity of the base weights} for a LoRA run's checkpoints (checkpoint/lora.py), else {}."""
    from ms_llm.checkpoint.lora import BASE_KEY

    base = getattr(getattr(session, "finetune", None), "base", None)
    return {BASE_KEY: base} if base else {}


def check_compatible(cfg, manifest, path):
    """Refuse (exit 2) a checkpoint whose shape, vocabulary or parallel layout differs from this run's."""
    old, new = manifest.get("config", {}), to_dict(cfg)
    diffs = [f"{sec}.{k}: checkpoint {old.get(sec, {}).get(k)!r}, now {new[sec][k]!r}"
             for sec, keys in MUST_MATCH.items() for k in keys if old.get(sec, {}).get(k) != new[sec][k]]
    if diffs:
        raise UserError(f"checkpoint '{path}' was written by a different model or parallel layout: "
                        + "; ".join(diffs) + ". Resume with the config it was trained with, or start a new run "
                        "(--set checkpoint.load_weights=<file> loads weights into a model of the same shape).")
    return [f"{sec}.{k}: {old[sec].get(k)!r} -> {v!r}" for sec, values in new.items() if sec in old
            for k, v in values.items() if old[sec].get(k) != v]


def restore(session, arrays, path, weights_only=False, warn=print):
    """Load `arrays` into the training step's parameters; explain every mismatch, change nothing on error."""
    import mindspore as ms

    params = session.checkpoint_parameters()
    model_names = session.model_parameter_names() & set(params)
    wanted = model_names if weights_only else set(params)
    missing = sorted(n for n in wanted if n not in arrays)
    shape_bad = sorted(f"{n} {tuple(arrays[n].shape)} vs {tuple(params[n].shape)}" for n in wanted
                       if n in arrays and tuple(arrays[n].shape) != tuple(params[n].shape))
    missing_model = [n for n in missing if n in model_names]
    if missing_model or shape_bad:
        raise UserError(f"checkpoint '{path}' does not fit this model: "
                        + (f"missing {', '.join(missing_model[:8])}{' ...' if len(missing_model) > 8 else ''}; "
                           if missing_model else "")
                        + (f"shape mismatch {'; '.join(shape_bad[:8])}" if shape_bad else "")
                        + ". Use the config the checkpoint was trained with.")
    if missing and not weights_only:
        raise UserError(f"checkpoint '{path}' has the model weights but no optimizer/training state "
                        f"({', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}). Pass --weights-only to "
                        f"continue with a fresh optimizer (AdamW moments restart at zero).")
    if weights_only and any(n not in arrays for n in params if n not in model_names):
        warn("warning: --weights-only: optimizer state, loss scale and step counters start fresh")
    for n in wanted:
        params[n].set_data(ms.Tensor(arrays[n]).astype(params[n].dtype))
    if not weights_only and "rng_state" in arrays:
        ms.set_rng_state(ms.Tensor(arrays["rng_state"]))


def restore_host_rng(manifest):
    rng = manifest.get("rng") or {}
    if "numpy" in rng:
        kind, keys, pos, has_gauss, cached = rng["numpy"]
        keys = np.asarray(keys)
        if keys.dtype.kind not in "iu" or (keys.size and (keys.min() < 0 or keys.max() > 0xFFFFFFFF)):
            raise ValueError("the numpy generator's keys are not 32-bit unsigned integers")  # NumPy 1 would wrap them
        np.random.set_state((kind, keys.astype(np.uint32), pos, has_gauss, cached))
    if "python" in rng:
        import ast

        random.setstate(ast.literal_eval(rng["python"]))
