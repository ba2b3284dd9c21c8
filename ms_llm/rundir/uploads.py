"""Which of a run's checkpoints reached checkpoint.remote_dir, read from the upload events the trainer writes to
metrics.jsonl (ms_llm/checkpoint/remote/uploads.py): what `ms-llm report` and `ms-llm diagnose` say about them."""
from dataclasses import dataclass, field


@dataclass
class RemoteCopies:
    remote: str
    saved: list = field(default_factory=list)       # steps of the checkpoint events, in order
    uploaded: dict = field(default_factory=dict)    # step → its upload event
    failed: dict = field(default_factory=dict)      # step → its last upload_failed event (and no upload after)
    only_local: list = field(default_factory=list)  # saved, never uploaded (failed, or no outcome recorded)

    def describe(self, step):
        e = self.failed.get(step)
        if e is None:
            return f"step {step}: no upload recorded (the process ended before it finished, or it is still going)"
        how = f", {e['attempts']} attempts in {e['upload_s']:.0f} s" if isinstance(e.get("upload_s"), (int, float)) \
            and e.get("attempts") else ""
        return f"step {step}: upload failed ({e.get('error', '?')}{how})"


def remote_copies(run):
    """RemoteCopies of a parsed run (rundir.reader.Run), or None when it mirrors to no remote_dir."""
    remote = run.cfg("checkpoint.remote_dir")
    outcomes = [e for e in run.events if e.get("event") in ("upload", "upload_failed")]
    if not remote and not outcomes:
        return None
    out = RemoteCopies(remote=str(next((e.get("remote") for e in outcomes if e.get("remote")), remote)))
    for e in run.events:
        step = e.get("step")
        if e.get("event") == "checkpoint" and step not in out.saved:
            out.saved.append(step)
        elif e.get("event") == "upload":
            out.uploaded[step] = e
            out.failed.pop(step, None)
        elif e.get("event") == "upload_failed" and step not in out.uploaded:
            out.failed[step] = e
    out.only_local = [s for s in out.saved if s not in out.uploaded]
    return out
