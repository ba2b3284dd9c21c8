"""Saving during training: synchronous or in a background thread, then mirrored to remote storage.

The training thread only takes a host copy of the state (`state.capture`); writing, checksumming,
pruning and uploading happen after. With `async_save`, at most one save is in flight: a new one first
waits for the previous, and `close()` waits for the last, so the on-disk guarantees of `store.save`
hold unchanged. Uploads never wait in the training thread: each checkpoint is queued for the upload
worker process (remote/uploads.py), and a checkpoint still queued is not pruned until it is sent.
"""
import os
import re
import threading

from ms_llm.checkpoint import remote, store
from ms_llm.checkpoint.remote.uploads import RemoteMirror
from ms_llm.rundir import names

# the run's own files, mirrored beside the checkpoints (and pulled back by a fresh machine): names.RUN_FILES
RUN_FILES = names.RUN_FILES


class CheckpointSaver:
    def __init__(self, run_dir, rank, ckpt_cfg, log=print, events=None):
        """`events`: where upload outcomes go as metrics records (MetricsWriter.write); None: nowhere."""
        self.run_dir, self.rank, self.cfg, self.log = run_dir, rank, ckpt_cfg, log
        self.directory = store.rank_dir(run_dir, rank)
        self.remote = ckpt_cfg.remote_dir
        self.mirror = None
        if self.remote:
            remote.make_uploader(self.remote, ckpt_cfg.uploader, ckpt_cfg.remote_endpoint)  # bad input: refused now
            self.mirror = RemoteMirror(self.remote, ckpt_cfg.uploader, ckpt_cfg.remote_endpoint,
                                       ckpt_cfg.upload_budget_s, log, events)
        self._thread = None
        self.error = None  # a background save's exception, until it is raised in the training thread
        self.last_path = None

    def save(self, step, arrays, meta):
        self.wait()
        if self.cfg.async_save:
            self._thread = threading.Thread(target=self._write, args=(step, arrays, meta), daemon=True)
            self._thread.start()
        else:
            self._write(step, arrays, meta)
            self._raise()
        return os.path.join(self.directory, f"step_{step:08d}{store.EXTENSIONS[self.cfg.format]}")

    def _write(self, step, arrays, meta):
        try:
            self.last_path = store.save(self.directory, step, arrays, meta, self.cfg.format, keep_last=None)
            self.upload(step)
            self.prune()
        except Exception as e:  # surfaced in the training thread by wait()
            self.error = e

    def prune(self):
        if self.cfg.keep_last:
            store.prune(self.directory, self.cfg.keep_last,
                        protect=self.mirror.pending_steps() if self.mirror is not None else ())

    def upload(self, step=None):
        """Queue the checkpoint `step` (tensors, manifest, then `latest`) for the remote, or, without a step, the
        run's files (rank 0), and then wait for everything queued: the end of training (at most
        checkpoint.upload_budget_s)."""
        if self.mirror is None:
            return
        if step is not None:
            name = f"step_{step:08d}"
            tensors = [f for f in os.listdir(self.directory) if f.startswith(name + ".") and not f.endswith(".json")]
            files = [os.path.join(self.directory, f) for f in tensors + [name + ".json", "latest"]]
            self.mirror.submit(step, [(f, os.path.relpath(f, self.run_dir)) for f in files])
            return
        if self.rank == 0:
            self.mirror.submit(None, [(os.path.join(self.run_dir, f), f) for f in RUN_FILES])
        self.mirror.drain()
        self.prune()  # what waited for its upload may go now

    def check(self):
        """Raise the error of a background save that failed (the loop calls it once `error` is set: training stops at
        the next step)."""
        if self.error is not None and (self._thread is None or not self._thread.is_alive()):
            self.wait()

    def wait(self):
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._raise()

    def _raise(self):
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def close(self):
        self.wait()


def pull_newest(remote_dir, uploader, run_dir, rank, log=print):
    """Copy the newest complete remote checkpoint of `rank` into an empty local run dir. Returns its step or None.

    Complete: its manifest is there, the tensor file has the manifest's size on the remote (checked before it is
    downloaded) and, downloaded, its SHA-256; a newer one that fails any of these is reported and skipped."""
    remote_rank = remote.join(remote_dir, names.CHECKPOINTS, f"rank_{rank}")
    listed = uploader.listdir(remote_rank)
    steps = sorted({int(n[5:13]) for n in listed if re.match(r"^step_\d{8}\.json$", n)}, reverse=True)
    local = store.rank_dir(run_dir, rank)
    for step in steps:
        name = f"step_{step:08d}"
        why = fetch_checkpoint(uploader, remote_rank, local, name)
        if why is None:
            manifest, why = store.verify(local, step)
        if why is None:
            top = uploader.listdir(remote_dir)
            for f in RUN_FILES:  # the run's history comes along, so it continues in one metrics file
                if f in top and not os.path.exists(os.path.join(run_dir, f)):
                    uploader.get(remote.join(remote_dir, f), os.path.join(run_dir, f))
            log(f"pulled checkpoint step {step} from {remote.redact(remote_dir)}")
            return step
        log(f"warning: remote checkpoint step {step} is unusable ({why}); trying the previous one")
        for n in os.listdir(local) if os.path.isdir(local) else []:
            if n.startswith(name + "."):
                os.remove(os.path.join(local, n))
    return None


def fetch_checkpoint(uploader, remote_rank, local, name):
    """Download checkpoint `name`'s manifest, then its tensor file if the remote one has the manifest's size.
    Returns None, or why the checkpoint is unusable."""
    import json

    manifest_path = os.path.join(local, name + ".json")
    uploader.get(remote.join(remote_rank, name + ".json"), manifest_path)
    try:
        with open(manifest_path, encoding="utf-8") as f:
            manifest = json.load(f)
        tensors, expected = manifest["file"], manifest["bytes"]
    except (OSError, ValueError, KeyError) as e:
        return f"unreadable manifest ({type(e).__name__})"
    size = remote.remote_size(uploader, remote.join(remote_rank, tensors))
    if size is not None and size != expected:
        return f"the remote {tensors} has {size} bytes, its manifest says {expected} (half-written)"
    try:
        uploader.get(remote.join(remote_rank, tensors), os.path.join(local, tensors))
    except Exception as e:  # noqa: BLE001 (absent or unreadable: either way not a checkpoint)
        return f"{tensors} cannot be downloaded ({type(e).__name__})"
    return None
