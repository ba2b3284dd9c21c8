"""Checkpoint files on disk: atomic, checksummed, with a `latest` pointer written last.

    checkpoints/rank_<r>/step_<n>.ckpt    tensors (MindSpore format)
    checkpoints/rank_<r>/step_<n>.json    manifest: size + SHA-256 of the .ckpt, step, and the run state
    checkpoints/rank_<r>/latest           name of the newest complete checkpoint

A checkpoint exists only once its manifest does; the manifest is written after the tensors are on
disk (temp file, fsync, rename), and `latest` after the manifest. Pruning happens after all three.
"""
import hashlib
import json
import os
import re

STEP_RE = re.compile(r"^step_(\d+)\.ckpt$")


def rank_dir(run_dir, rank):
    return os.path.join(run_dir, "checkpoints", f"rank_{rank}")


def _fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_write_bytes(path, data):
    tmp = os.path.join(os.path.dirname(path), f".tmp-{os.path.basename(path)}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def save(directory, step, tensors, meta, keep_last=None):
    """Write `tensors` ({name: Tensor/Parameter}) and `meta` (JSON-able) as checkpoint `step`."""
    import mindspore as ms

    os.makedirs(directory, exist_ok=True)
    name = f"step_{step:08d}"
    final = os.path.join(directory, name + ".ckpt")
    tmp = os.path.join(directory, f".tmp-{name}.ckpt")
    ms.save_checkpoint([{"name": k, "data": v} for k, v in tensors.items()], tmp)
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, final)
    manifest = dict(meta, step=step, file=name + ".ckpt", bytes=os.path.getsize(final), sha256=sha256_file(final))
    _atomic_write_bytes(os.path.join(directory, name + ".json"), json.dumps(manifest, indent=1).encode())
    _atomic_write_bytes(os.path.join(directory, "latest"), name.encode())
    _fsync_dir(directory)
    if keep_last:
        prune(directory, keep_last)
    return final


def list_checkpoints(directory):
    """Step numbers of the checkpoints in `directory` (complete or not), newest first."""
    if not os.path.isdir(directory):
        return []
    steps = [int(m.group(1)) for m in map(STEP_RE.match, os.listdir(directory)) if m]
    return sorted(steps, reverse=True)


def verify(directory, step):
    """(manifest, None) when checkpoint `step` is complete and intact, else (None, reason)."""
    name = f"step_{step:08d}"
    ckpt, man = os.path.join(directory, name + ".ckpt"), os.path.join(directory, name + ".json")
    if not os.path.isfile(man):
        return None, "no manifest (the save did not finish)"
    try:
        with open(man, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        return None, f"unreadable manifest ({e})"
    if not os.path.isfile(ckpt):
        return None, "tensor file missing"
    size = os.path.getsize(ckpt)
    if size != manifest.get("bytes"):
        return None, f"size {size} bytes, manifest says {manifest.get('bytes')} (truncated?)"
    if sha256_file(ckpt) != manifest.get("sha256"):
        return None, "SHA-256 mismatch (corrupted)"
    return manifest, None


def newest_valid(directory, warn=print):
    """(step, manifest) of the newest intact checkpoint, warning in one line about each bad newer one."""
    for step in list_checkpoints(directory):
        manifest, why = verify(directory, step)
        if manifest is not None:
            return step, manifest
        warn(f"checkpoint {os.path.join(directory, f'step_{step:08d}.ckpt')} is unusable: {why}; trying the previous one")
    return None, None


def load_tensors(directory, step):
    import mindspore as ms

    return ms.load_checkpoint(os.path.join(directory, f"step_{step:08d}.ckpt"))


def prune(directory, keep_last):
    complete = [s for s in list_checkpoints(directory) if os.path.isfile(os.path.join(directory, f"step_{s:08d}.json"))]
    for step in complete[keep_last:]:
        for ext in (".ckpt", ".json"):
            try:
                os.remove(os.path.join(directory, f"step_{step:08d}{ext}"))
            except FileNotFoundError:
                pass
