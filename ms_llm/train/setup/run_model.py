"""A finished (or stopped) run's model, loaded the one way every tool does: `ms-llm sample`, `debug dump`,
`debug nan` and `compare` all call `load_run_model`."""
import os

from ms_llm.errors import UserError
from ms_llm.rundir.names import run_config_path


def load_run_config(run_dir, overrides=()):
    """The config the run ended with (after a resume: the resumed one), with `overrides` applied."""
    from ms_llm.config import load_config

    path = run_config_path(run_dir)
    if not os.path.isfile(path):
        raise UserError(f"'{run_dir}' is not a run directory (no config.yaml). Pass the --run-dir of a training run.")
    return load_config(path, list(overrides))


def find_run_checkpoint(run_dir, step=None, log=print):
    """(path, manifest) of checkpoint `step` (default: the newest intact one) of rank 0, in whatever format the
    run saved it, found through the checkpoint store's own lookup."""
    from ms_llm.checkpoint import store

    directory = store.rank_dir(run_dir, 0)
    if step is None:
        step, manifest = store.newest_valid(directory, warn=log)
        if step is None:
            raise UserError(f"run '{run_dir}' has no complete checkpoint in {directory}. Train it to the end (or to a "
                            f"checkpoint.save_interval) first.")
    else:
        manifest, why = store.verify(directory, step)
        if manifest is None:
            raise UserError(f"checkpoint step {step} in {directory} is unusable ({why}). Steps available: "
                            f"{store.list_checkpoints(directory) or 'none'}.")
    return store.checkpoint_path(directory, manifest), manifest


def load_run_model(run_dir, step=None, overrides=(), checkpoint=None, log=print):
    """(config, model in eval mode with the run's weights, checkpoint path). `checkpoint`: an explicit file
    instead of the run's own step."""
    import mindspore as ms

    from model_zoo import build_model, weights
    from ms_llm.checkpoint import store

    cfg = load_run_config(run_dir, overrides)
    path = checkpoint or find_run_checkpoint(run_dir, step, log)[0]
    if not os.path.isfile(path):
        raise UserError(f"checkpoint '{path}' does not exist. Pass a .ckpt or .safetensors file, or leave it out to "
                        f"use the run's newest checkpoint.")
    try:
        arrays = store.read_tensors(path)
    except Exception as e:  # noqa: BLE001 (any unreadable file gets the same explanation)
        raise UserError(f"checkpoint '{path}' cannot be read ({type(e).__name__}): not a MindSpore or safetensors "
                        f"checkpoint, or truncated.") from None
    from ms_llm.nn.backend import for_device

    # the run's own kernels (context.cpu_kernels), so that a dump or a NaN hunt computes what training computed
    model = build_model(cfg.model, cfg.precision.compute_dtype,
                        for_device(ms.get_context("device_target"), cfg.context.cpu_kernels))
    if cfg.finetune.lora is not None:  # the checkpoint holds the adapters; the base weights come from its record
        arrays = with_lora(model, cfg, arrays, path)
    params = weights(model)
    missing = [n for n in params if n not in arrays]
    if missing:
        raise UserError(f"checkpoint '{path}' lacks {len(missing)} model tensors (e.g. {missing[0]}): it was not "
                        f"written for this run's model. Pass the run's own checkpoint.")
    for name, p in params.items():
        p.set_data(ms.Tensor(arrays[name]).astype(p.dtype))
    model.set_train(False)
    return cfg, model, path


def with_lora(model, cfg, arrays, path):
    """A LoRA run's model: adapters applied (ms_llm/nn/lora.py), weights = the recorded base + the checkpoint's
    adapters (ms_llm/checkpoint/lora.py)."""
    import json

    from ms_llm.checkpoint.lora import BASE_KEY, full_weights
    from ms_llm.nn.lora import apply_lora

    manifest_path = os.path.splitext(path)[0] + ".json"
    try:
        with open(manifest_path, encoding="utf-8") as f:
            identity = json.load(f)[BASE_KEY]
    except (OSError, ValueError, KeyError):
        raise UserError(f"checkpoint '{path}' of a finetune.lora run has no readable manifest with its base weights "
                        f"('{manifest_path}', key {BASE_KEY}). Use the run's own checkpoints, or merge them "
                        f"(ms-llm convert --merge-lora) while the manifest is there.") from None
    lora = cfg.finetune.lora
    apply_lora(model, lora.rank, lora.alpha, lora.dropout, lora.targets, cfg.train.seed)
    return full_weights(arrays, identity, f"checkpoint '{path}'")
