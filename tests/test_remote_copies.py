"""What `ms-llm diagnose` and the report say about checkpoints that never reached checkpoint.remote_dir, on a
synthetic run whose upload events say so (the real ones come from tests/test_remote_runs.py)."""
import json

from synthetic_run import make_run
from ms_llm.diagnose.engine import diagnose
from ms_llm.rundir.reader import load_run
from ms_llm.rundir.uploads import remote_copies


def run_with_uploads(tmp_path, outcomes, remote="s3://bkt/run"):
    """A 300-step run with checkpoints at 100, 200, 300 and the given upload events ({step: event})."""
    path = make_run(str(tmp_path / "run"), steps=300, overrides=[f"checkpoint.remote_dir={remote}",
                                                                 "checkpoint.save_interval=100"])
    with open(f"{path}/metrics.jsonl", "a", encoding="utf-8") as f:
        for step in (100, 200, 300):
            f.write(json.dumps({"step": step, "event": "checkpoint", "duration_s": 0.1}) + "\n")
            event = outcomes.get(step)
            if event == "upload":
                f.write(json.dumps({"step": step, "event": "upload", "remote": remote, "files": 3, "attempts": 1,
                                    "upload_s": 0.5}) + "\n")
            elif event == "upload_failed":
                f.write(json.dumps({"step": step, "event": "upload_failed", "remote": remote, "attempts": 7,
                                    "upload_s": 601.0, "error": "EndpointConnectionError: Could not connect"}) + "\n")
    return path


def finding(path):
    _, findings = diagnose(path)
    return {f.id: f for f in findings}.get("remote_copies")


def test_the_newest_checkpoint_only_local_is_a_warning_naming_the_error(tmp_path):
    path = run_with_uploads(tmp_path, {100: "upload", 200: "upload", 300: "upload_failed"})
    f = finding(path)
    assert f is not None and f.severity == "warning" and "the newest checkpoint only local" in f.symptom, f
    assert "steps 300" in f.symptom and "never reached s3://bkt/run" in f.symptom
    assert any("step 300: upload failed (EndpointConnectionError" in e and "7 attempts in 601 s" in e
               for e in f.evidence), f.evidence
    assert "in s3://bkt/run: steps 100, 200" in f.evidence[-1]
    assert "unreachable" in f.causes[0] and "aws s3 cp --recursive" in f.actions[0]


def test_older_checkpoints_only_local_are_a_note_and_no_outcome_counts_as_local(tmp_path):
    path = run_with_uploads(tmp_path, {100: "upload_failed", 300: "upload"})
    f = finding(path)
    assert f.severity == "info" and "2 older checkpoint(s) only local" in f.symptom, f
    assert any("step 200: no upload recorded" in e for e in f.evidence), f.evidence
    copies = remote_copies(load_run(path))
    assert copies.only_local == [100, 200] and sorted(copies.uploaded) == [300]


def test_all_uploaded_or_no_remote_is_silent(tmp_path):
    assert finding(run_with_uploads(tmp_path, {100: "upload", 200: "upload", 300: "upload"})) is None
    plain = make_run(str(tmp_path / "plain"), steps=300)
    assert remote_copies(load_run(plain)) is None and finding(plain) is None


def test_the_report_lists_the_checkpoints_only_local(tmp_path):
    from ms_llm.pages.sections import remote_section
    from ms_llm.pages.runs import load_runs

    path = run_with_uploads(tmp_path, {100: "upload", 200: "upload_failed", 300: "upload"})
    html = remote_section(load_runs([path], "step"))
    assert "remote copies in s3://bkt/run: checkpoints at steps 100, 300; only local: step 200: upload failed " \
           "(EndpointConnectionError: Could not connect, 7 attempts in 601 s)" in html, html
