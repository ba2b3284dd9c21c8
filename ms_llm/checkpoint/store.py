"""Checkpoint files on disk: atomic, checksummed, with a `latest` pointer written last.

    checkpoints/rank_<r>/step_<n>.ckpt         tensors (MindSpore format; .safetensors with checkpoint.format)
    checkpoints/rank_<r>/step_<n>.json         manifest: file, size, SHA-256, step, and the run state
    checkpoints/rank_<r>/latest                name of the newest complete checkpoint

Order of writing: tensors to a temporary file, fsync, rename; then the manifest the same way; then
`latest`; then pruning of old checkpoints. A crash at any point leaves every earlier checkpoint intact
and, at worst, a newest one without a manifest, which `newest_valid` skips with a one-line warning.
"""
import json
import os
import re

import numpy as np

from ms_llm.fileio import atomic_write_bytes, sha256_file
from ms_llm.rundir import names

STEP_RE = re.compile(r"^step_(\d+)\.(ckpt|safetensors)$")
EXTENSIONS = {"ckpt": ".ckpt", "safetensors": ".safetensors"}


def rank_dir(run_dir, rank):
    return names.rank_checkpoints(run_dir, rank)


def _fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path):
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def write_tensors(path, arrays, fmt):
    """`arrays` {name: numpy array} to `path` in `fmt` (not atomic by itself)."""
    if fmt == "safetensors":
        from safetensors.numpy import save_file

        save_file({k: np.asarray(v, order="C") for k, v in arrays.items()}, path)  # keeps 0-d arrays 0-d
    else:
        import mindspore as ms

        ms.save_checkpoint([{"name": k, "data": ms.Tensor(v)} for k, v in arrays.items()], path)


def read_tensors(path):
    """{name: numpy array} from a .ckpt or .safetensors file; a damaged one is a UserError naming it."""
    if path.endswith(".safetensors"):
        from ms_llm.checkpoint import safetensors_io

        return safetensors_io.load(path)[0]  # its header checked against the file first (bfloat16 as float32)
    params = load_mindspore_checkpoint(path)
    odd = [k for k, v in params.items() if not hasattr(v, "asnumpy")]  # a map tensor or a string: not a weight
    if odd:
        from ms_llm.errors import UserError

        raise UserError(f"checkpoint '{path}' holds {len(odd)} value(s) that are not tensors ({', '.join(odd[:3])}): "
                        f"not a checkpoint of model weights, or a damaged one. Copy it again, or give another.")
    return {k: v.asnumpy() for k, v in params.items()}


def load_mindspore_checkpoint(path):
    """{name: Parameter} of a MindSpore .ckpt. MindSpore reports a cut or corrupt file as a ValueError (and logs
    it); here it is one paragraph naming the file."""
    import mindspore as ms

    from ms_llm.errors import UserError

    if not os.path.isfile(path):
        raise UserError(f"checkpoint '{path}' does not exist{' (it is a folder)' if os.path.isdir(path) else ''}. "
                        f"Give the path of a .ckpt or .safetensors file.")
    from ms_llm.checkpoint import ckpt_check

    problem = ckpt_check.check(path)  # before MindSpore: it trusts a tensor's dims, and a lie corrupts its heap
    if problem:
        raise UserError(f"checkpoint '{path}' ({os.path.getsize(path):,} bytes) is not a readable MindSpore "
                        f"checkpoint: {problem}. The file is truncated or corrupt: copy it again, or give an earlier "
                        f"checkpoint.")
    try:
        return ms.load_checkpoint(path)
    except (ValueError, RuntimeError, OSError, TypeError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise UserError(f"checkpoint '{path}' ({os.path.getsize(path):,} bytes) cannot be read as a MindSpore "
                        f"checkpoint ({first}). The file is truncated or corrupt: copy it again, or give an "
                        f"earlier checkpoint.") from None


def save(directory, step, arrays, meta, fmt="ckpt", keep_last=None):
    """Write `arrays` ({name: numpy array}) and `meta` (JSON-able) as checkpoint `step`; returns its path.

    A write that fails (a full disk, a lost mount) removes what it had written, leaves every earlier checkpoint
    and `latest` as they were, and raises a UserError naming the path (and, for a full disk, the space)."""
    name = f"step_{step:08d}"
    final = os.path.join(directory, name + EXTENSIONS[fmt])
    tmp = os.path.join(directory, f".tmp-{name}{EXTENSIONS[fmt]}")
    try:
        os.makedirs(directory, exist_ok=True)
        write_tensors(tmp, arrays, fmt)
        _fsync_file(tmp)
        os.replace(tmp, final)
        manifest = dict(meta, step=step, file=os.path.basename(final), format=fmt, bytes=os.path.getsize(final),
                        sha256=sha256_file(final))
        atomic_write_bytes(os.path.join(directory, name + ".json"), json.dumps(manifest, indent=1).encode())
        atomic_write_bytes(os.path.join(directory, "latest"), name.encode())
        _fsync_dir(directory)
    except (OSError, RuntimeError) as e:
        for path in (tmp, final, os.path.join(directory, name + ".json"),
                     os.path.join(directory, f".tmp-{name}.json"), os.path.join(directory, ".tmp-latest")):
            try:
                os.remove(path)
            except OSError:
                pass
        raise write_failure(directory, step, arrays, e) from None
    if keep_last:
        prune(directory, keep_last)
    return final


def write_failure(directory, step, arrays, error):
    """The one-paragraph explanation of a checkpoint that could not be written."""
    import errno
    import shutil

    from ms_llm.errors import UserError

    need = sum(int(np.asarray(a).nbytes) for a in arrays.values())
    full = getattr(error, "errno", None) == errno.ENOSPC or "No space left" in str(error)
    try:
        free = shutil.disk_usage(directory if os.path.isdir(directory) else os.path.dirname(directory)).free
    except OSError:
        free = None
    space = f"; it needs about {need / 2**20:,.1f} MiB and {free / 2**20:,.1f} MiB are free" if free is not None \
        else ""
    what = "the disk is full" if full else f"{type(error).__name__}: {error}"
    return UserError(f"checkpoint step {step} could not be written to {directory}: {what}{space}. The partial file "
                     f"was removed and earlier checkpoints are intact. Free space there (or lower "
                     f"checkpoint.keep_last), then resume with --resume.")


def list_checkpoints(directory):
    """Step numbers of the checkpoints in `directory` (complete or not), newest first."""
    if not os.path.isdir(directory):
        return []
    steps = {int(m.group(1)) for m in map(STEP_RE.match, os.listdir(directory)) if m}
    steps |= {int(f[5:-5]) for f in os.listdir(directory) if re.match(r"^step_\d+\.json$", f)}
    return sorted(steps, reverse=True)


def verify(directory, step):
    """(manifest, None) when checkpoint `step` is complete and intact, else (None, reason)."""
    man = os.path.join(directory, f"step_{step:08d}.json")
    if not os.path.isfile(man):
        return None, "no manifest (the save did not finish)"
    try:
        with open(man, "rb") as f:
            manifest = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError, RecursionError) as e:  # ValueError: not JSON, or not UTF-8
        return None, f"unreadable manifest ({type(e).__name__}: {str(e)[:120]})"
    wrong = manifest_problem(manifest)
    if wrong:
        return None, f"manifest {wrong}"
    path = os.path.join(directory, manifest["file"])
    if not os.path.isfile(path):
        return None, "tensor file missing"
    size = os.path.getsize(path)
    if size != manifest.get("bytes"):
        return None, f"{size} bytes, manifest says {manifest.get('bytes')} (truncated?)"
    if sha256_file(path) != manifest.get("sha256"):
        return None, "SHA-256 mismatch (corrupted)"
    return manifest, None


# What resume reads of a checkpoint's manifest, by type (save() writes them so).
MANIFEST_FIELDS = {"file": str, "bytes": int, "sha256": str, "step": int, "consumed_samples": int, "epoch": int}
OPTIONAL_FIELDS = ("epoch",)  # a training checkpoint has it; one saved by a tool may not


def manifest_problem(manifest):
    """None when a checkpoint manifest has the fields resume reads, of their types; else what is wrong."""
    if not isinstance(manifest, dict):
        return f"is a JSON {type(manifest).__name__}, not an object"
    for key, kind in MANIFEST_FIELDS.items():
        v = manifest.get(key)
        if key in OPTIONAL_FIELDS and key not in manifest:
            continue
        if not isinstance(v, kind) or isinstance(v, bool):
            return f"field {key!r} is {str(v)[:40]!r}, not {'a whole number' if kind is int else 'a string'}"
    if os.path.basename(manifest["file"]) != manifest["file"] or not STEP_RE.match(manifest["file"]):
        return f"field 'file' is {manifest['file'][:60]!r}, not a checkpoint file name of this folder"
    for key in ("config", "host", "rng"):
        if manifest.get(key) is not None and not isinstance(manifest[key], dict):
            return f"field {key!r} is a {type(manifest[key]).__name__}, not an object"
    return None


def newest_valid(directory, warn=print):
    """(step, manifest) of the newest intact checkpoint, warning in one line about each bad newer one."""
    for step in list_checkpoints(directory):
        manifest, why = verify(directory, step)
        if manifest is not None:
            return step, manifest
        warn(f"warning: checkpoint step {step} in {directory} is unusable ({why}); falling back to the previous one")
    return None, None


def checkpoint_path(directory, manifest):
    return os.path.join(directory, manifest["file"])


def prune(directory, keep_last, protect=()):
    """Delete all but the newest `keep_last` complete checkpoints (incomplete newer ones are left alone, and so are
    the steps in `protect`: checkpoints still waiting for their upload)."""
    complete = [s for s in list_checkpoints(directory) if verify_quick(directory, s)]
    for step in complete[keep_last:]:
        if step in protect:
            continue
        for f in os.listdir(directory):
            if f.startswith(f"step_{step:08d}."):
                try:
                    os.remove(os.path.join(directory, f))
                except FileNotFoundError:
                    pass


def verify_quick(directory, step):
    """A manifest and a tensor file of the recorded size exist (no checksum: used for pruning order)."""
    man = os.path.join(directory, f"step_{step:08d}.json")
    try:
        with open(man, "rb") as f:
            m = json.loads(f.read().decode("utf-8"))
        return manifest_problem(m) is None and os.path.getsize(os.path.join(directory, m["file"])) == m["bytes"]
    except (OSError, ValueError, RecursionError):
        return False
