"""The upload worker: a process of its own (`python -m ms_llm.checkpoint.remote.worker`), at the lowest CPU
priority, that uploads what the training process queues (remote/uploads.py) and verifies it. A process and not a
thread: boto3's Python-heavy requests, the hashing and the read-back then never hold the training process's GIL
(a low-priority thread holding it on a busy host stalls the training thread with it).

Protocol, one JSON object per line. The first line on stdin configures the uploader ({"remote_dir", "spec",
"endpoint", "budget_s", "part_mib"}); then jobs {"job": id, "step": n or null, "files": [[local, rel], ...]} and
{"deadline_s": s} (the end of training: stop retrying s seconds from now); end of stdin: finish the queue and exit.
On stdout: {"log": line}, {"event": record}, {"done": id}.

Each job is a checkpoint's tensor file, then its manifest, then `latest` (or the run's files). A file counts as
uploaded when the object read back has the local file's size and SHA-256. A failure is retried with backoff from
FIRST_DELAY_S doubling to MAX_DELAY_S until the job's budget is spent.
"""
import json
import os
import queue
import shutil
import sys
import threading
import time

FIRST_DELAY_S, MAX_DELAY_S = 1.0, 30.0


class Mismatch(Exception):
    pass


class Worker:
    def __init__(self, uploader, remote_dir, budget_s, send):
        self.uploader, self.remote_dir, self.budget_s, self.send = uploader, remote_dir, budget_s, send
        self.deadline = None  # monotonic time after which no job retries (the end of training)

    def run(self, job):
        from ms_llm.checkpoint.remote import join, redact, remote_digest
        from ms_llm.fileio import sha256_file

        step, where = job["step"], redact(self.remote_dir)
        what = f"checkpoint step {step}" if step is not None else "the run's files"
        t0 = time.monotonic()
        attempts, warned, total = 1, False, 0  # attempts: 1 + the retries
        for local, rel in job["files"]:
            remote = join(self.remote_dir, rel)
            delay = FIRST_DELAY_S
            size, sha = os.path.getsize(local), sha256_file(local)
            while True:
                try:
                    self.uploader.put(local, remote)
                    got = remote_digest(self.uploader, remote)
                    if got != (size, sha):
                        raise Mismatch(f"the object read back has {got[0]} bytes, SHA-256 {got[1][:12]}…; the "
                                       f"local file {size} bytes, {sha[:12]}…")
                    break
                except Exception as e:  # noqa: BLE001 (stores fail in many ways: all are retried alike)
                    limit = t0 + self.budget_s if self.deadline is None else min(t0 + self.budget_s, self.deadline)
                    now = time.monotonic()
                    if now >= limit:
                        return self.failed(job, error_text(e), attempts, now - t0)
                    if not warned:
                        self.send({"log": f"warning: upload of {what} to {where} failed ({error_text(e)}); retrying "
                                          f"in the background for up to {self.budget_s:g} s, training continues"})
                        warned = True
                    time.sleep(min(delay, limit - now))  # the last attempt comes when the budget ends
                    delay = min(2 * delay, MAX_DELAY_S)
                    attempts += 1
            total += size
        if step is not None:
            self.send({"event": {"step": step, "event": "upload", "remote": where, "files": len(job["files"]),
                                 "mib": round(total / 2**20, 3), "attempts": attempts,
                                 "upload_s": round(time.monotonic() - t0, 3)}})
        if warned:
            self.send({"log": f"{what} is now in {where} (after {attempts} attempts)"})

    def failed(self, job, error, attempts, seconds):
        self.send(failure(job["step"], self.remote_dir, error, attempts, seconds))


def failure(step, remote_dir, error, attempts=None, seconds=None):
    """The message (a log line, and for a checkpoint the upload_failed event) of an upload given up."""
    from ms_llm.checkpoint.remote import redact

    where = redact(remote_dir)
    if step is None:
        return {"log": f"warning: the run's files were not copied to {where} ({error}); the run directory keeps them"}
    how = f", {attempts} attempts in {seconds:.0f} s" if attempts else ""
    record = {"step": step, "event": "upload_failed", "remote": where, "error": error}
    if attempts:
        record.update(attempts=attempts, upload_s=round(seconds, 3))
    return {"log": f"warning: checkpoint step {step} was not copied to {where} ({error}{how}); it is only local",
            "event": record}


def error_text(e):
    """`Type: message`, cut to 200 characters, with any credentials or signed query strings in URLs masked."""
    import re

    text = " ".join(str(e).split())[:200]
    text = re.sub(r"(://)[^/@\s]+@", r"\1***@", text)
    text = re.sub(r"(://[^\s?\"']*)\?[^\s\"']*", r"\1?***", text)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def main():
    try:
        os.setpriority(os.PRIO_PROCESS, 0, 19)  # the training process comes first
    except (AttributeError, OSError):
        pass
    out, lock = sys.stdout, threading.Lock()
    sys.stdout = sys.stderr  # the protocol owns stdout: nothing else may print there

    def send(message):
        with lock:
            out.write(json.dumps(message) + "\n")
            out.flush()

    config = json.loads(sys.stdin.readline())
    from ms_llm.checkpoint.remote import make_uploader

    uploader = make_uploader(config["remote_dir"], config.get("spec"), config.get("endpoint"),
                             part_mib=config.get("part_mib"))
    worker = Worker(uploader, config["remote_dir"], config["budget_s"], send)
    jobs = queue.Queue()

    def read():
        for line in sys.stdin:
            message = json.loads(line)
            if "deadline_s" in message:
                worker.deadline = time.monotonic() + message["deadline_s"]
            else:
                jobs.put(message)
        jobs.put(None)

    threading.Thread(target=read, daemon=True).start()
    while True:
        job = jobs.get()
        if job is None:
            return
        try:
            worker.run(job)
        except Exception as e:  # noqa: BLE001 (one broken job must not end the others)
            send(failure(job["step"], config["remote_dir"], error_text(e)))
        finally:
            if job.get("staging"):
                shutil.rmtree(job["staging"], ignore_errors=True)
            send({"done": job["job"]})


if __name__ == "__main__":
    main()
