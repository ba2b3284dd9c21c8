"""A run that lives in an S3 bucket and in two experiment trackers, end to end against real servers on 127.0.0.1:
moto's S3 server behind a fault proxy, and `mlflow server` on SQLite; SwanLab offline, read back from its files.

One scenario, trained once for the module (tests read it):
  machine 1  ACCUM2 with remote_dir s3://bkt/run and monitor.trackers [mlflow, swanlab], stopped at step 30, while
             the store answers HTTP 500 to everything of checkpoint 10 (past checkpoint.upload_budget_s), answers
             500 three times to metrics.jsonl, and is stopped for 3 s between checkpoint 20's tensors and manifest;
  then       machine 1's run directory is deleted, and the bucket gets a half-written step 40 (a manifest whose
             tensor object is cut short) and a step 50 without a manifest;
  machine 2  `--resume` into an empty folder: it must pull step 30 and end bit-exactly like the uninterrupted
             ACCUM2 run (conftest.accum2_run), continuing the same MLflow run.
"""
import json
import os
import re
import shutil

import pytest
import yaml

from conftest import ACCUM2, ms_llm, tiny_train_args
from object_store import FaultProxy, MlflowServer, MotoS3, isolated_aws_env, outage

pytestmark = pytest.mark.slow
BUDGET = "6"


def records(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def digest(stdout):
    return re.search(r"parameter digest \(rank 0\): (\w+)", stdout).group(1)


def bucket(client):
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket="bkt"):
        out.update({o["Key"]: o["Size"] for o in page.get("Contents", [])})
    return out


@pytest.fixture(scope="module")
def scenario(dataset, accum2_run, tmp_path_factory):
    root = tmp_path_factory.mktemp("remote_runs")
    (root / "mlflow").mkdir()
    mlflow_server = MlflowServer(str(root / "mlflow"))
    moto = MotoS3()
    proxy = FaultProxy(moto.port)
    try:
        key, secret = moto.auth()
        client = moto.client(key, secret)
        client.create_bucket(Bucket="bkt")
        env = dict(isolated_aws_env(str(root), key, secret), MLFLOW_TRACKING_URI=mlflow_server.url,
                   SWANLAB_LOG_DIR=str(root / "swanlog"))
        remote = ["--set", "checkpoint.remote_dir=s3://bkt/run", "--set", f"checkpoint.remote_endpoint={proxy.url}",
                  "--set", f"checkpoint.upload_budget_s={BUDGET}", "--set", "monitor.trackers=[mlflow,swanlab]"]
        after_outage = []  # what the bucket held of checkpoint 20 while the server was away
        proxy.add("PUT", r"/step_00000010\.", "500")
        proxy.add("PUT", r"/run/metrics\.jsonl", "500", times=3)
        proxy.add("PUT", r"/step_00000020\.json", outage(moto, 3.0, lambda m: after_outage.append(sorted(
            k for k in bucket(m.client(key, secret)) if "step_00000020" in k))), times=1)
        machine1 = root / "machine1" / "shakespeare-s3"
        first = ms_llm(*tiny_train_args(dataset, machine1, *ACCUM2, *remote, "--set", "train.stop_at_step=30"),
                       env=env)
        assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
        first_metrics = records(machine1 / "metrics.jsonl")
        first_files = files_text(root / "machine1")
        bucket_after_first = bucket(client)
        proxy.clear()
        shutil.rmtree(root / "machine1")  # machine 1 is gone; the bucket is all that is left
        rank0 = "run/checkpoints/rank_0/"
        t30 = client.get_object(Bucket="bkt", Key=rank0 + "step_00000030.ckpt")["Body"].read()
        m30 = json.loads(client.get_object(Bucket="bkt", Key=rank0 + "step_00000030.json")["Body"].read())
        client.put_object(Bucket="bkt", Key=rank0 + "step_00000040.ckpt", Body=t30[:len(t30) // 3])
        client.put_object(Bucket="bkt", Key=rank0 + "step_00000040.json",
                          Body=json.dumps(dict(m30, step=40, file="step_00000040.ckpt")).encode())
        client.put_object(Bucket="bkt", Key=rank0 + "step_00000050.ckpt", Body=t30)
        machine2 = root / "machine2" / "shakespeare-s3"
        second = ms_llm(*tiny_train_args(dataset, machine2, *ACCUM2, *remote, "--set", "monitor.report=true"),
                        "--resume", env=env)
        assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-3000:]
        from mlflow.tracking import MlflowClient

        tracking = MlflowClient(tracking_uri=mlflow_server.url)
        runs = tracking.search_runs(tracking.get_experiment_by_name("ms_llm").experiment_id)
        histories = {k: tracking.get_metric_history(runs[0].info.run_id, k) for k in runs[0].data.metrics}
        artifacts = [a.path for a in tracking.list_artifacts(runs[0].info.run_id)]
        yield {"root": root, "first": first, "second": second, "first_metrics": first_metrics,
               "first_files": first_files, "machine2": machine2, "bucket_after_first": bucket_after_first,
               "bucket": bucket(client), "client": client, "after_outage": after_outage, "key": key,
               "secret": secret, "mlflow_runs": runs, "histories": histories, "artifacts": artifacts,
               "reference": accum2_run, "second_files": files_text(root / "machine2")}
    finally:
        proxy.close()
        moto.close()
        mlflow_server.close()


def files_text(folder):
    """{path: bytes} of every file under `folder` (to look for credentials in)."""
    out = {}
    for base, _, names in os.walk(folder):
        for n in names:
            with open(os.path.join(base, n), "rb") as f:
                out[os.path.join(base, n)] = f.read()
    return out


def test_a_fresh_machine_resumes_from_the_bucket_and_ends_bit_exactly(scenario):
    ref_dir, ref_stdout = scenario["reference"]
    second = scenario["second"].stdout
    assert "pulled checkpoint step 30 from s3://bkt/run" in second and "resuming at step 30" in second, second[-3000:]
    assert re.search(r"remote checkpoint step 40 is unusable \(the remote step_00000040\.ckpt has \d+ bytes, its "
                     r"manifest says \d+ \(half-written\)\)", second), second[-3000:]
    assert digest(second) == digest(ref_stdout)
    losses = lambda recs: [(r["step"], r["loss"]) for r in recs if "loss" in r and "event" not in r]  # noqa: E731
    assert losses(records(scenario["machine2"] / "metrics.jsonl")) == losses(records(ref_dir / "metrics.jsonl"))
    objects, client = scenario["bucket"], scenario["client"]
    for step in (40, 50, 60):  # the planted objects replaced by real ones, each as its manifest says
        key = f"run/checkpoints/rank_0/step_{step:08d}"
        manifest = json.loads(client.get_object(Bucket="bkt", Key=key + ".json")["Body"].read())
        assert objects[key + ".ckpt"] == manifest["bytes"] and manifest["step"] == step


def test_uploads_fail_and_retry_in_the_background_while_training_goes_on(scenario):
    """Checkpoint 10 met HTTP 500s for the whole budget and stayed only local; checkpoint 20 met a server that
    went away after its tensors and before its manifest (no complete checkpoint 20 existed meanwhile) and was
    retried until the restarted server took it; checkpoint 30 went up at once. Meanwhile no step waited."""
    recs = scenario["first_metrics"]
    events = {(e["step"], e["event"]): e for e in recs if e.get("event") in ("upload", "upload_failed")}
    failed = events[(10, "upload_failed")]
    assert "InternalError" in failed["error"] and failed["upload_s"] >= float(BUDGET), failed
    assert (10, "upload") not in events
    assert events[(20, "upload")]["attempts"] >= 2 and events[(30, "upload")]["attempts"] == 1, events
    assert scenario["after_outage"] == [["run/checkpoints/rank_0/step_00000020.ckpt"]]  # tensors, no manifest
    first = scenario["first"].stdout
    assert "warning: checkpoint step 10 was not copied to s3://bkt/run" in first and "it is only local" in first
    assert "retrying in the background" in first
    # the training thread never waited: step 11 was logged long before checkpoint 10's upload gave up, and no
    # step took half the budget while uploads were failing
    train = {r["step"]: r for r in recs if "loss" in r and "event" not in r}
    assert train[11]["time"] < failed["time"] - 3, (train[11]["time"], failed["time"])
    gaps = [train[s + 1]["elapsed_s"] - train[s]["elapsed_s"] for s in range(11, 30) if s != 20]
    assert max(gaps) < 3.0, gaps  # a step that waited for the failing upload would take its 6 s
    objects = scenario["bucket_after_first"]
    assert not any("step_00000010" in k for k in objects), objects
    for name in ("step_00000020.ckpt", "step_00000020.json", "step_00000030.ckpt", "step_00000030.json", "latest"):
        assert f"run/checkpoints/rank_0/{name}" in objects
    for name in ("metrics.jsonl", "config.yaml", "run_info.json", "trackers.json"):
        assert f"run/{name}" in objects


def test_report_and_diagnose_name_the_checkpoints_only_local(scenario):
    from ms_llm.diagnose.engine import diagnose

    html = (scenario["machine2"] / "report.html").read_text(encoding="utf-8")
    assert re.search(r"remote copies in s3://bkt/run: checkpoints at steps 20, 30, 40, 50, 60; only local: step "
                     r"10: upload failed \(S3UploadFailedError", html), re.findall(r"remote copies[^<]*", html)
    _, findings = diagnose(str(scenario["machine2"]))
    found = {f.id: f for f in findings}["remote_copies"]
    assert found.severity == "info" and "steps 10" in found.symptom, found  # the newest is in the bucket
    assert any("HTTP 5xx" in c for c in found.causes), found.causes


def test_credentials_are_never_printed_or_written(scenario):
    key, secret = scenario["key"], scenario["secret"]
    texts = [scenario["first"].stdout, scenario["first"].stderr, scenario["second"].stdout,
             scenario["second"].stderr]
    blobs = list(scenario["first_files"].values()) + list(scenario["second_files"].values())
    client = scenario["client"]
    blobs += [client.get_object(Bucket="bkt", Key=k)["Body"].read() for k in scenario["bucket"]
              if not k.endswith(".ckpt")]
    for run in scenario["mlflow_runs"]:
        texts += list(run.data.params.values()) + list(run.data.tags.values())
    assert len(blobs) > 20
    for needle in (key, secret):
        assert not any(needle in t for t in texts)
        assert not any(needle.encode() in b for b in blobs)


def expected_metrics(recs):
    """{(name, step): [values]} as docs/trackers.md says trackers get them, written out independently here: every
    number of every record but step and time; evaluation fields other than val_* under eval/, an event's under
    <event>/."""
    out = {}
    for r in recs:
        for k, v in r.items():
            if k in ("step", "time") or isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            if "event" in r:
                name = f"{r['event']}/{k}"
            elif "val_loss" in r and not k.startswith("val_"):
                name = f"eval/{k}"
            else:
                name = k
            out.setdefault((name, r["step"]), []).append(float(v))
    return out


def compare(expected, got):
    """(count, largest |difference|) of the values both hold; asserts they hold the same (name, step) keys."""
    assert sorted(expected) == sorted(got), sorted(set(expected) ^ set(got))[:20]
    worst = 0.0
    for k in expected:
        a, b = sorted(expected[k]), sorted(got[k])
        assert len(a) == len(b), (k, a, b)
        worst = max([worst] + [abs(x - y) for x, y in zip(a, b)])
    return sum(len(v) for v in expected.values()), worst


def test_mlflow_holds_every_metric_of_metrics_jsonl_in_one_run(scenario):
    runs = scenario["mlflow_runs"]
    assert len(runs) == 1, [r.info.run_name for r in runs]  # the resume continued the run
    run = runs[0]
    assert run.info.run_name == "shakespeare-s3" and run.info.status == "FINISHED"
    got = {}
    for name, history in scenario["histories"].items():
        for m in history:
            got.setdefault((name, m.step), []).append(m.value)
    count, worst = compare(expected_metrics(records(scenario["machine2"] / "metrics.jsonl")), got)
    print(f"MLflow: {count} metric values, largest difference from metrics.jsonl {worst}")
    assert count > 500 and worst == 0.0
    config = yaml.safe_load(open(scenario["machine2"] / "config.yaml"))
    flat = {}

    def walk(d, prefix=""):
        for k, v in d.items():
            if isinstance(v, dict) and v:
                walk(v, f"{prefix}{k}.")
            else:
                flat[prefix + k] = v

    walk(config)
    assert set(run.data.params) == set(flat)
    assert run.data.params["train.max_steps"] == "60" and run.data.params["model.hidden_size"] == "32"
    tags = run.data.tags
    assert json.loads(tags["event/00000010/upload_failed"])["remote"] == "s3://bkt/run"
    assert "event/00000030/resume" in tags and "event/00000060/checkpoint" in tags
    assert {"report.html", "config.yaml", "run_info.json", "metrics.jsonl"} <= set(scenario["artifacts"])


def test_swanlab_holds_every_metric_of_metrics_jsonl(scenario):
    """SwanLab 0.6.4 cannot resume: machine 2's run is a second experiment of the same name tagged resumed@30, and
    the two together hold every metric of metrics.jsonl (read back with SwanLab's own reader of its log)."""
    from swanlab.log.backup.datastore import DataStore

    got, texts, experiments = {}, 0, []
    logdir = scenario["root"] / "swanlog"
    for run_dir in sorted(p for p in logdir.iterdir() if p.is_dir()):
        store = DataStore()
        store.open_for_scan(str(run_dir / "backup.swanlab"))
        for raw in store:
            entry = json.loads(raw)
            kind, data = entry["model_type"], entry["data"]
            if kind == "Experiment":
                experiments.append((data["name"], data["tags"]))
            elif kind == "Scalar":
                value = data["metric"]["data"]
                got.setdefault((data["key"], data["step"]), []).append(float(value))
            elif kind == "Media":
                texts += 1
    assert experiments == [("shakespeare-s3", []), ("shakespeare-s3", ["resumed@30"])], experiments
    count, worst = compare(expected_metrics(records(scenario["machine2"] / "metrics.jsonl")), got)
    print(f"SwanLab: {count} metric values, largest difference from metrics.jsonl {worst}")
    assert count > 500 and worst == 0.0
    state = json.loads((scenario["machine2"] / "trackers.json").read_text())
    assert state["mlflow"]["run_id"] == scenario["mlflow_runs"][0].info.run_id
    assert len(state["swanlab"]["resumed_runs"]) == 1
