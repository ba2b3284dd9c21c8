"""Where a run starts from: a resumed checkpoint, weights to load, or the config's own initialisation."""
import json
import os

from ms_llm.checkpoint import state as ckpt_state
from ms_llm.checkpoint import store
from ms_llm.errors import UserError
from ms_llm.train.setup.context import all_ranks_ok
from ms_llm.rundir import names


def has_checkpoints(run_dir, ckpt_rank, rt, cfg, log):
    """Local checkpoints exist, or remote ones were pulled into the (empty) local run dir."""
    directory = store.rank_dir(run_dir, ckpt_rank)
    if store.list_checkpoints(directory):
        return True
    if cfg.checkpoint.remote_dir and ckpt_rank == rt.rank:
        from ms_llm.checkpoint import remote
        from ms_llm.checkpoint.saver import pull_newest

        up = remote.make_uploader(cfg.checkpoint.remote_dir, cfg.checkpoint.uploader, cfg.checkpoint.remote_endpoint)
        pull_newest(cfg.checkpoint.remote_dir, up, run_dir, ckpt_rank, log)
    found = bool(store.list_checkpoints(directory))
    return all_ranks_ok(rt, found) if rt.world_size > 1 else found


def check_remote(ckpt_cfg):
    from ms_llm.checkpoint import remote

    uploader = remote.make_uploader(ckpt_cfg.remote_dir, ckpt_cfg.uploader, ckpt_cfg.remote_endpoint)
    remote.check_remote_readable(uploader, ckpt_cfg.remote_dir, writable=True)


def find_checkpoint(run_dir, ckpt_rank, log):
    directory = store.rank_dir(run_dir, ckpt_rank)
    step, manifest = store.newest_valid(directory, warn=log)
    if step is None:
        raise UserError(f"no usable checkpoint in {directory} to resume from. Nothing was changed; start a new run "
                        f"with another --run-dir, or drop --resume.")
    return store.checkpoint_path(directory, manifest), manifest


def resume_from(s, checkpoint, weights_only, log):
    """Put a checkpoint back into the session; returns (step, host state of the log interval)."""
    path, manifest = checkpoint
    changed = ckpt_state.check_compatible(s.cfg, manifest, path)
    if changed:
        log("note: resuming with changed settings: " + "; ".join(changed))
    if s.finetune is not None and s.finetune.lora is not None:  # the checkpoint holds the adapters: base first
        from ms_llm.train.setup.finetune import load_base_for_resume

        load_base_for_resume(s, manifest, path, log)
    ckpt_state.restore(s, store.read_tensors(path), path, weights_only, warn=log)
    step = manifest["step"]
    if not weights_only:
        restore_host_rng(manifest, path)
    s.data.seek(manifest["consumed_samples"])
    log(f"resumed from {path}: step {step}, {manifest['consumed_samples']:,} samples consumed "
        f"(epoch {manifest.get('epoch', '?')})")
    return step, manifest.get("host") or {}


def restore_host_rng(manifest, path):
    """The host's random generators as checkpoint `path` recorded them; a state that cannot be restored (an edited
    or damaged manifest) is one paragraph naming the manifest."""
    try:
        ckpt_state.restore_host_rng(manifest)
    except (ValueError, TypeError, KeyError, IndexError, OverflowError, SyntaxError, MemoryError, RecursionError) as e:
        manifest_path = os.path.splitext(path)[0] + ".json"
        raise UserError(f"checkpoint manifest '{manifest_path}' holds a random-number state that cannot be restored "
                        f"({type(e).__name__}: {str(e)[:120]}): the file was edited or damaged. Resume from an "
                        f"earlier checkpoint (remove this one), or pass --weights-only to restart the optimizer and "
                        f"generators from the weights.") from None


def load_initial_weights(s, path, log):
    if not os.path.isfile(path):
        raise UserError(f"checkpoint.load_weights = '{path}' does not exist. Give a .ckpt or .safetensors file "
                        f"(e.g. from `ms-llm convert`).")
    if s.finetune is not None and s.finetune.lora is not None:  # the frozen base; the adapters start at B = 0
        from ms_llm.train.setup.finetune import load_base

        return load_base(s, path, log)
    try:
        arrays = store.read_tensors(path)
    except Exception as e:
        raise UserError(f"checkpoint.load_weights = '{path}' cannot be read ({type(e).__name__}): not a MindSpore "
                        f"or safetensors checkpoint, or truncated.") from None
    ckpt_state.restore(s, arrays, path, weights_only=True, warn=lambda *_: None)
    log(f"initialised model weights from {path}")


def keep_metrics_until(run_dir, step):
    """Records after the resumed checkpoint are superseded by the rerun: set them aside, keep the rest."""
    path = os.path.join(run_dir, names.METRICS)
    if not os.path.isfile(path):
        return
    keep, drop = [], []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                (keep if json.loads(line).get("step", 0) <= step else drop).append(line)
            except json.JSONDecodeError:  # a line cut by a crash mid-write
                drop.append(line)
    if drop:
        with open(os.path.join(run_dir, "metrics.superseded.jsonl"), "a", encoding="utf-8") as f:
            f.writelines(drop)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(keep)
    os.replace(tmp, path)
