"""Saving during training: synchronous or in a background thread, then mirrored to remote storage.

The training thread only takes a host copy of the state (`state.capture`); writing, checksumming,
pruning and uploading happen after. With `async_save`, at most one save is in flight: a new one first
waits for the previous, and `close()` waits for the last, so the on-disk guarantees of `store.save`
hold unchanged.
"""
import os
import threading

from ms_llm.checkpoint import remote, store

RUN_FILES = ("metrics.jsonl", "config.yaml", "run_info.json")


class CheckpointSaver:
    def __init__(self, run_dir, rank, ckpt_cfg, log=print):
        self.run_dir, self.rank, self.cfg, self.log = run_dir, rank, ckpt_cfg, log
        self.directory = store.rank_dir(run_dir, rank)
        self.remote = ckpt_cfg.remote_dir
        self.uploader = remote.make_uploader(self.remote, ckpt_cfg.uploader) if self.remote else None
        self._thread = None
        self._error = None
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
            self.last_path = store.save(self.directory, step, arrays, meta, self.cfg.format, self.cfg.keep_last)
            self.upload(step)
        except Exception as e:  # surfaced in the training thread by wait()
            self._error = e

    def upload(self, step=None):
        """Mirror the newest checkpoint (if `step`) and the run's metrics/config to checkpoint.remote_dir."""
        if self.uploader is None:
            return
        files = []
        if step is not None:
            name = f"step_{step:08d}"
            files += [os.path.join(self.directory, f) for f in os.listdir(self.directory)
                      if f.startswith(name + ".")] + [os.path.join(self.directory, "latest")]
        if self.rank == 0:
            files += [os.path.join(self.run_dir, f) for f in RUN_FILES]
        for f in files:
            if os.path.isfile(f):
                rel = os.path.relpath(f, self.run_dir)
                remote.with_retries(lambda f=f, rel=rel: self.uploader.put(f, remote.join(self.remote, rel)),
                                    f"upload of {rel} to {remote.redact(self.remote)}", self.log)

    def check(self):
        """Raise the error of a background save that failed (called every step: training stops at the next step)."""
        if self._error is not None and (self._thread is None or not self._thread.is_alive()):
            self.wait()

    def wait(self):
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._raise()

    def _raise(self):
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def close(self):
        self.wait()


def pull_newest(remote_dir, uploader, run_dir, rank, log=print):
    """Copy the newest remote checkpoint of `rank` into an empty local run dir. Returns its step or None."""
    remote_rank = remote.join(remote_dir, "checkpoints", f"rank_{rank}")
    names = uploader.listdir(remote_rank)
    steps = sorted({int(n[5:13]) for n in names if n.startswith("step_") and n.endswith(".json")}, reverse=True)
    local = store.rank_dir(run_dir, rank)
    for step in steps:
        files = [n for n in names if n.startswith(f"step_{step:08d}.")]
        for n in files:
            uploader.get(remote.join(remote_rank, n), os.path.join(local, n))
        manifest, why = store.verify(local, step)
        if manifest is not None:
            top = uploader.listdir(remote_dir)
            for f in RUN_FILES:  # the run's history comes along, so it continues in one metrics file
                if f in top and not os.path.exists(os.path.join(run_dir, f)):
                    uploader.get(remote.join(remote_dir, f), os.path.join(run_dir, f))
            log(f"pulled checkpoint step {step} from {remote.redact(remote_dir)}")
            return step
        log(f"warning: remote checkpoint step {step} is unusable ({why}); trying the previous one")
        for n in files:
            os.remove(os.path.join(local, n))
    return None
