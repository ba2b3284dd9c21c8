"""The model and tokenizer an evaluation runs on: a run directory (its newest or a chosen checkpoint, the tokenizer
its dataset was made with), a checkpoint file with its config.yaml (a converted model: `ms-llm convert --from-hf`),
or a Hugging Face folder converted in memory (config.json + safetensors + tokenizer.json)."""
import json
import os
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ms_llm.errors import UserError
from ms_llm.eval.tokenizer import EvalTokenizer, read_tokenizer_config


@dataclass
class LoadedModel:
    model: Any  # a CausalLM in eval mode
    tokenizer: EvalTokenizer
    context: int  # tokens the model takes at most (lm-eval's max_length)
    name: str  # what was loaded, for the results


def load_model(run_dir=None, hf=None, checkpoint=None, config=None, tokenizer=None, max_length=None, log=print):
    """Exactly one of run_dir / hf / checkpoint (checkpoint may also pick a run's checkpoint). `tokenizer`: a
    tokenizer file in place of the source's own; `max_length`: the context (default: the model's seq_length)."""
    if sum(x is not None for x in (run_dir, hf)) + (checkpoint is not None and run_dir is None) != 1:
        raise UserError("evaluate one model: --run-dir RUN [--checkpoint F], --hf HF_DIR, or --checkpoint F (with the "
                        "config.yaml beside it or --config, and --tokenizer).")
    if max_length is not None and int(max_length) < 2:
        raise UserError(f"--max-length = {max_length} must be at least 2 tokens.")
    if hf is not None:
        return from_hf_folder(hf, tokenizer, max_length, log)
    if run_dir is not None:
        return from_run(run_dir, checkpoint, tokenizer, max_length, log)
    return from_checkpoint(checkpoint, config, tokenizer, max_length, log)


def setup(context_cfg):
    from ms_llm.train.setup.context import setup_context

    setup_context(context_cfg)


def context_config(cfg, max_length):
    """(config, context): the context is max_length (default seq_length); a longer one than the model was built for
    rebuilds it with that seq_length (masks and RoPE tables), which a GPT-2's learned positions cannot follow."""
    if max_length is None:
        return cfg, cfg.model.seq_length
    n = int(max_length)
    if n <= cfg.model.seq_length:
        return cfg, n
    if cfg.model.arch == "gpt2":
        raise UserError(f"--max-length = {n}: this GPT-2 has learned positions for {cfg.model.seq_length} tokens "
                        f"only. Pass at most {cfg.model.seq_length}.")
    return replace(cfg, model=replace(cfg.model, seq_length=n)), n


def build(cfg, arrays, what):
    """The model of `cfg` with `arrays` as its weights, in eval mode."""
    import mindspore as ms

    from model_zoo import build_model
    from ms_llm.nn.backend import for_device

    model = build_model(cfg.model, cfg.precision.compute_dtype,
                        for_device(ms.get_context("device_target"), cfg.context.cpu_kernels))
    params = {p.name: p for p in model.get_parameters()}
    missing = [n for n in params if n not in arrays]
    if missing:
        raise UserError(f"{what} lacks {len(missing)} model tensors (e.g. {missing[0]}): it was not written for this "
                        f"model config.")
    for name, p in params.items():
        p.set_data(ms.Tensor(np.asarray(arrays[name])).astype(p.dtype))
    model.set_train(False)
    return model


# --- the three sources -------------------------------------------------------------------------------------

def from_run(run_dir, checkpoint, tokenizer, max_length, log):
    from ms_llm.train.setup.run_model import load_run_config, load_run_model

    cfg = load_run_config(run_dir)
    setup(cfg.context)
    tok = EvalTokenizer(*run_tokenizer(run_dir, cfg, tokenizer))
    raised, context = context_config(cfg, max_length)
    overrides = [f"model.seq_length={context}"] if raised is not cfg else []
    _, model, path = load_run_model(run_dir, overrides=overrides, checkpoint=checkpoint, log=log)
    return LoadedModel(model, tok, context, f"{run_dir} ({os.path.basename(path)})")


def run_tokenizer(run_dir, cfg, tokenizer):
    """(tokenizer, its tokenizer_config, source) of a run: --tokenizer, else the one its dataset was made with."""
    if tokenizer is not None:
        return tokenizer_file(tokenizer)
    from ms_llm.data.manifest import read_manifest
    from ms_llm.data.tokenizers import from_spec

    dirs = [w[1] for w in cfg.data.blend] if cfg.data.blend else [cfg.data.dataset_dir]
    try:
        with open(os.path.join(run_dir, "run_info.json"), encoding="utf-8") as f:
            dirs.append((json.load(f).get("dataset") or {}).get("dir"))
    except (OSError, ValueError, AttributeError):
        pass
    for d in dirs:
        if d and os.path.isfile(os.path.join(d, "manifest.json")):
            spec = read_manifest(d).get("tokenizer")
            if spec:
                return from_spec(spec), {}, f"the tokenizer of dataset {d}"
    raise UserError(f"run '{run_dir}' has no tokenizer that lm-eval could use: it is recorded in its dataset's "
                    f"manifest, and no manifest.json is found in {', '.join(repr(d) for d in dirs if d)}. lm-eval "
                    f"turns every task's text into tokens, so the evaluation needs it: pass --tokenizer (the "
                    f"tokenizer.json or tokenizer.model the run was trained with), or run from the folder the run was "
                    f"trained from so that data.dataset_dir is found.")


def tokenizer_file(path):
    from ms_llm.data.tokenizers import build_tokenizer

    if path == "char":
        raise UserError("--tokenizer char: a char tokenizer's vocabulary comes from its corpus; evaluate the run with "
                        "its own dataset's tokenizer (leave --tokenizer out).")
    if path != "byte" and not os.path.isfile(path):
        raise UserError(f"--tokenizer '{path}' does not exist. Give a tokenizer.json, a tokenizer.model or byte.")
    folder = os.path.dirname(os.path.abspath(path)) if path != "byte" else ""
    return build_tokenizer(path), read_tokenizer_config(folder) if folder else {}, path


def from_checkpoint(checkpoint, config, tokenizer, max_length, log):
    from ms_llm.checkpoint import store
    from ms_llm.config import load_config

    if not os.path.isfile(checkpoint):
        raise UserError(f"--checkpoint '{checkpoint}' does not exist. Give a .ckpt or .safetensors file.")
    config = config or os.path.join(os.path.dirname(os.path.abspath(checkpoint)), "config.yaml")
    if not os.path.isfile(config):
        raise UserError(f"--checkpoint '{checkpoint}' has no config.yaml beside it: pass the model's config with "
                        f"--config.")
    if tokenizer is None:
        raise UserError(f"--checkpoint '{checkpoint}' comes without a tokenizer, and lm-eval turns every task's text "
                        f"into tokens: pass --tokenizer (the model's tokenizer.json or tokenizer.model). For a Hugging "
                        f"Face folder, evaluate it directly with --hf DIR.")
    cfg = load_config(config)
    setup(cfg.context)
    tok = EvalTokenizer(*tokenizer_file(tokenizer))
    cfg, context = context_config(cfg, max_length)
    model = build(cfg, store.read_tensors(checkpoint), f"checkpoint '{checkpoint}'")
    return LoadedModel(model, tok, context, checkpoint)


def from_hf_folder(folder, tokenizer, max_length, log):
    from ms_llm.config import from_dict
    from ms_llm.config.validate import validate_config
    from ms_llm.interop import huggingface as hf

    if not os.path.isdir(folder):
        raise UserError(f"--hf '{folder}' is not a folder. Give a Hugging Face model folder (config.json, "
                        f"*.safetensors, tokenizer.json).")
    hf_cfg, section = hf.hf_model_section(folder)
    positions = hf_cfg.get("max_position_embeddings") or hf_cfg.get("n_positions")
    if max_length is None and positions and positions > section["seq_length"]:
        log(f"note: evaluating at a context of {section['seq_length']:,} tokens; config.json allows {positions:,} "
            f"(lm-eval's hf model uses all of them): pass --max-length {positions} to match it on longer requests")
    cfg = validate_config(from_dict({"model": section, "train": {"seed": 0}}))
    setup(cfg.context)
    tok = EvalTokenizer(*(tokenizer_file(tokenizer) if tokenizer else hf_tokenizer(folder)))
    tensors, _ = hf.read_hf_tensors(folder)
    arrays = hf.hf_to_ours(tensors, cfg.model, hf.detect_prefix(tensors, cfg.model.arch))
    cfg, context = context_config(cfg, max_length)
    model = build(cfg, arrays, f"'{folder}'")
    return LoadedModel(model, tok, context, os.path.abspath(folder))


def hf_tokenizer(folder):
    from ms_llm.data.tokenizers import HFTokenizer, SentencePieceTokenizer

    config = read_tokenizer_config(folder)
    path = os.path.join(folder, "tokenizer.json")
    if os.path.isfile(path):
        return HFTokenizer(path), config, path
    model = os.path.join(folder, "tokenizer.model")
    if os.path.isfile(model):
        return SentencePieceTokenizer(model), config, model
    raise UserError(f"--hf '{folder}' has no tokenizer.json (or tokenizer.model), and lm-eval turns every task's text "
                    f"into tokens. Save the tokenizer into the folder (tokenizer.save_pretrained(DIR)) or pass "
                    f"--tokenizer FILE.")
