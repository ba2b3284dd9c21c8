"""Mirroring a run to remote storage without ever holding up a training step: the training side of the uploads.

Each completed checkpoint is one job — its tensor file, then its manifest (size + SHA-256), then `latest`, so that a
checkpoint is complete on the remote only once its manifest is there — handed to the upload worker, a process of
its own at the lowest CPU priority (remote/worker.py), which uploads, reads back to verify (size and SHA-256),
and retries with backoff (1 s doubling to 30 s) until the job's `checkpoint.upload_budget_s` is spent; then the
checkpoint stays only local, with one warning. Jobs run one at a time, oldest first; the end of training waits for
each to succeed or spend its budget. Each outcome is an event in metrics.jsonl, which `ms-llm report` and
`ms-llm diagnose` read:

    {"step": 20, "event": "upload", "remote": "s3://bucket/run", "files": 3, "mib": 0.3, "attempts": 2, "upload_s": 4.8}
    {"step": 10, "event": "upload_failed", "remote": ..., "error": "EndpointConnectionError: ...", "attempts": 7, ...}

Small files that change while the run goes on (metrics.jsonl, `latest`) are copied aside when the job is queued,
and the copy is uploaded: what is verified is what was sent. A worker that dies (killed, out of memory) fails its
jobs with one warning each; the next job starts a new one.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from ms_llm.checkpoint.remote import redact
from ms_llm.checkpoint.remote.worker import failure

SNAPSHOT_BYTES = 1 << 20  # files below this are copied aside when queued (they may change before they are sent)
GRACE_S = 60  # at the end, beyond the jobs' budgets: a request stuck past its budget


class RemoteMirror:
    def __init__(self, remote_dir, spec=None, endpoint=None, budget_s=600.0, log=print, event=None, part_mib=None):
        self.remote_dir, self.budget_s, self.log = remote_dir, budget_s, log
        self.event = event or (lambda record, echo=False: None)
        self.config = {"remote_dir": remote_dir, "spec": spec, "endpoint": endpoint, "budget_s": budget_s,
                       "part_mib": part_mib}
        self.cond = threading.Condition()
        self.pending = {}  # job id → its step (None: the run's files), until the worker says done
        self.next_id = 0
        self.proc = None

    # --- the training side ---------------------------------------------------------------------------------

    def submit(self, step, files):
        """Queue `files` ([(local path, path under remote_dir)]), a checkpoint's when `step` is set."""
        staging = tempfile.mkdtemp(prefix="ms_llm_upload_")
        staged = []
        for local, rel in files:
            if not os.path.isfile(local):
                continue
            if os.path.getsize(local) < SNAPSHOT_BYTES:
                copy = os.path.join(staging, f"{len(staged)}-{os.path.basename(local)}")
                shutil.copyfile(local, copy)
                local = copy
            staged.append([os.path.abspath(local), rel])
        with self.cond:
            job, self.next_id = self.next_id, self.next_id + 1
            self.pending[job] = step
            try:
                self._send({"job": job, "step": step, "files": staged, "staging": staging})
            except OSError as e:  # the worker could not be started or written to
                del self.pending[job]
                shutil.rmtree(staging, ignore_errors=True)
                self._report(failure(step, self.remote_dir, f"the upload worker is unavailable ({e})"))

    def pending_steps(self):
        """Checkpoint steps queued or being uploaded (their local files must not be pruned yet)."""
        with self.cond:
            return {s for s in self.pending.values() if s is not None}

    def drain(self):
        """At the end of training: wait until each queued upload has succeeded or spent its upload_budget_s.
        Returns the steps of the checkpoints that this wait had to leave (only local)."""
        with self.cond:
            n = len(self.pending)
        if not n:
            self._stop(kill=False)
            return []
        with self.cond:
            deadline = time.monotonic() + n * self.budget_s
            try:
                self._send({"deadline_s": n * self.budget_s})
            except OSError:
                pass
        self.log(f"waiting for {n} upload(s) to {redact(self.remote_dir)} (at most {self.budget_s:g} s each)")
        with self.cond:
            while self.pending and time.monotonic() < deadline + GRACE_S:
                self.cond.wait(timeout=1.0)
            left = dict(self.pending)
            self.pending.clear()
        self._stop(kill=bool(left))  # nothing queued: the worker exits (the next job starts another)
        for step in left.values():  # a worker stuck in a request was given up on
            self._report(failure(step, self.remote_dir, "the upload time budget ran out at the end of training"))
        return [s for s in left.values() if s is not None]

    def close(self):
        self._stop(kill=False)

    # --- the worker process --------------------------------------------------------------------------------

    def _send(self, message):
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def _start(self):
        env = dict(os.environ)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.proc = subprocess.Popen([sys.executable, "-m", "ms_llm.checkpoint.remote.worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1, env=env, start_new_session=True)
        self.proc.stdin.write(json.dumps(self.config) + "\n")
        self.proc.stdin.flush()
        threading.Thread(target=self._read, args=(self.proc,), name="ms_llm-uploads", daemon=True).start()

    def _read(self, proc):
        for line in proc.stdout:  # a blocking read: the training thread keeps the GIL meanwhile
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if "done" in message:
                with self.cond:
                    self.pending.pop(message["done"], None)
                    self.cond.notify_all()
            else:
                self._report(message)
        code = proc.wait()
        with self.cond:
            if proc is not self.proc:
                return
            lost, self.pending = dict(self.pending), {}
            self.cond.notify_all()
        for step in lost.values():
            self._report(failure(step, self.remote_dir, f"the upload worker exited (code {code})"))

    def _report(self, message):
        if "log" in message:
            self.log(message["log"])
        if "event" in message:
            self.event(message["event"], echo=False)

    def _stop(self, kill):
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            if kill:
                proc.kill()
            else:
                proc.stdin.close()
            proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
