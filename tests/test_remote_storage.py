"""Object storage against a real S3-compatible server (moto's, on 127.0.0.1) with real faults in front of it: the
uploaders (boto3 for s3://, esdk-obs-python for obs://), the background mirror's verification and retries, the
pull of the newest complete checkpoint, and the refusals before training. No training here: the end-to-end round
trip is tests/test_remote_runs.py."""
import os
import time

import numpy as np
import pytest

from object_store import FaultProxy, MotoS3, outage
from ms_llm.checkpoint import store
from ms_llm.checkpoint.remote import make_uploader
from ms_llm.checkpoint.remote.s3 import S3Uploader
from ms_llm.checkpoint.remote.uploads import RemoteMirror
from ms_llm.checkpoint.saver import pull_newest
from ms_llm.errors import UserError

MIB = 1 << 20
pytestmark = pytest.mark.slow  # each test talks to a server over HTTP; the module starts one


@pytest.fixture(scope="module")
def s3():
    moto = MotoS3()
    key, secret = moto.auth()
    proxy = FaultProxy(moto.port)
    moto.client(key, secret).create_bucket(Bucket="bkt")
    yield moto, proxy, key, secret
    proxy.close()
    moto.close()


@pytest.fixture
def env(s3, monkeypatch, tmp_path):
    moto, proxy, key, secret = s3
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    proxy.clear()
    yield moto, proxy
    proxy.clear()
    moto.enforce(False)


def mirror_of(remote, endpoint, budget, lines, events, spec=None, part_mib=None):
    return RemoteMirror(remote, spec, endpoint, budget, lines.append, lambda r, echo=False: events.append(r),
                        part_mib=part_mib)


def random_file(path, size):
    path.write_bytes(np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes())
    return str(path)


def test_a_multipart_upload_counts_once_the_object_read_back_matches(env, tmp_path):
    moto, proxy = env
    big = random_file(tmp_path / "big.bin", 12 * MIB)  # three 5 MiB parts (S3's smallest)
    lines, events = [], []
    mirror = mirror_of("s3://bkt/a", proxy.url, 30, lines, events, part_mib=5)
    mirror.submit(10, [(big, "checkpoints/big.bin")])
    assert mirror.drain() == []
    head = moto.client("x", "x").head_object(Bucket="bkt", Key="a/checkpoints/big.bin")
    assert head["ContentLength"] == 12 * MIB and head["ETag"].endswith('-3"'), head  # three parts
    assert sum(1 for m, p in proxy.seen if m == "PUT" and "partNumber=" in p) == 3
    assert [e["event"] for e in events] == ["upload"] and events[0]["attempts"] == 1 and lines[-1:] != ["warning"]


def test_an_object_that_differs_from_the_local_file_is_not_counted(env, tmp_path):
    """The proxy lets the upload through but the object on the server is then replaced by a truncated one before
    the read-back: the mirror must see the mismatch, retry, and count the upload only when the object is right."""
    moto, proxy = env
    f = random_file(tmp_path / "f.bin", 200_000)
    client = moto.client("x", "x")

    seen = []

    def first_get():  # runs before the first read-back is forwarded
        seen.append(client.head_object(Bucket="bkt", Key="b/f.bin")["ContentLength"])
        client.put_object(Bucket="bkt", Key="b/f.bin", Body=open(f, "rb").read()[:1000])

    proxy.add("GET", r"^/bkt/b/f\.bin$", first_get, times=1)
    lines, events = [], []
    mirror = mirror_of("s3://bkt/b", proxy.url, 30, lines, events)
    mirror.submit(5, [(f, "f.bin")])
    assert mirror.drain() == []
    assert seen == [200_000]
    assert events[-1]["event"] == "upload" and events[-1]["attempts"] == 2, events
    assert any("Mismatch" in l and "1000 bytes" in l for l in lines), lines
    assert client.head_object(Bucket="bkt", Key="b/f.bin")["ContentLength"] == 200_000


def test_the_server_stopped_mid_upload_and_restarted(env, tmp_path):
    """moto is stopped when the second part arrives and started again 5 s later: no object appears meanwhile (an
    unfinished multipart upload is not an object), the mirror retries with backoff and the upload completes."""
    moto, proxy = env
    big = random_file(tmp_path / "big.bin", 11 * MIB)
    during_outage = []
    proxy.add("PUT", r"partNumber=2", outage(moto, 5.0, lambda m: during_outage.append(
        m.client("x", "x").list_objects_v2(Bucket="bkt", Prefix="c/").get("KeyCount", 0))), times=1)
    lines, events = [], []
    mirror = mirror_of("s3://bkt/c", proxy.url, 60, lines, events, part_mib=5)
    t0 = time.monotonic()
    mirror.submit(20, [(big, "checkpoints/big.bin")])
    assert time.monotonic() - t0 < 0.5  # queued, not sent, by the training thread
    assert mirror.drain() == []
    assert during_outage == [0]
    assert events[-1]["event"] == "upload" and events[-1]["attempts"] >= 2 and events[-1]["upload_s"] >= 5, events
    assert any("retrying in the background" in l for l in lines), lines
    client = moto.client("x", "x")
    assert client.head_object(Bucket="bkt", Key="c/checkpoints/big.bin")["ContentLength"] == 11 * MIB


def test_http_500s_are_retried_within_the_budget_then_left_local(env, tmp_path):
    moto, proxy = env
    f = random_file(tmp_path / "f.bin", 50_000)
    proxy.add("PUT", r"^/bkt/d/transient", "500", times=3)  # botocore retries once itself, then ours
    proxy.add("PUT", r"^/bkt/d/always", "500")
    lines, events = [], []
    mirror = mirror_of("s3://bkt/d", proxy.url, 4, lines, events)
    t0 = time.monotonic()
    mirror.submit(1, [(f, "transient.bin")])
    mirror.submit(2, [(f, "always.bin")])
    assert time.monotonic() - t0 < 0.5  # queued: the training thread goes on
    while len(events) < 2 and time.monotonic() - t0 < 20:
        time.sleep(0.1)
    took = time.monotonic() - t0
    assert mirror.drain() == []
    ok, failed = events
    assert ok["event"] == "upload" and ok["step"] == 1 and ok["attempts"] == 2, events
    assert failed["event"] == "upload_failed" and failed["step"] == 2 and "InternalError" in failed["error"], events
    assert 4 <= failed["upload_s"] <= 9 and took < 14, (failed, took)  # the whole budget of 4 s, not more
    assert any("checkpoint step 2 was not copied" in l and "only local" in l for l in lines), lines


def test_wrong_credentials_a_missing_bucket_and_no_server_are_one_paragraph(env, monkeypatch):
    moto, proxy = env
    secret = os.environ["AWS_SECRET_ACCESS_KEY"]
    reader = moto.auth(actions=["s3:ListBucket", "s3:GetObject"], user="reader")
    moto.enforce(True)
    S3Uploader("s3://bkt/run", endpoint=moto.url).check("s3://bkt/run")  # the right keys pass
    cases = [({"AWS_ACCESS_KEY_ID": reader[0], "AWS_SECRET_ACCESS_KEY": reader[1]}, "s3://bkt/run", moto.url,
              "access to bucket 'bkt' at " + moto.url + " was denied (AccessDenied)"),
             ({"AWS_SECRET_ACCESS_KEY": "wrong-secret"}, "s3://bkt/run", moto.url,
              "refused the credentials (SignatureDoesNotMatch)"),
             ({"AWS_ACCESS_KEY_ID": "AKIANOSUCHKEY"}, "s3://bkt/run", moto.url,
              "refused the credentials (InvalidAccessKeyId)"),
             ({}, "s3://no-such-bucket/run", moto.url, "bucket 'no-such-bucket' does not exist"),
             ({}, "s3://bkt/run", f"http://127.0.0.1:{free_closed_port()}", "cannot be reached")]
    for overrides, url, endpoint, words in cases:
        with monkeypatch.context() as m:
            for k, v in overrides.items():
                m.setenv(k, v)
            with pytest.raises(UserError) as e:
                S3Uploader(url, endpoint=endpoint).check(url)
        text = str(e.value)
        assert words in text and "\n" not in text and "Nothing was trained" in text, text
        assert secret not in text and "wrong-secret" not in text


def free_closed_port():
    from object_store import free_port

    return free_port()  # nothing listens there once the probe socket is closed


def test_half_written_objects_are_never_taken_as_a_checkpoint(env, tmp_path):
    """The bucket holds complete checkpoints 10 and 20, then a step 30 whose tensor object is cut short (a copy
    that died) and a step 40 with tensors but no manifest (the upload stopped between the two): a fresh machine
    pulls 20, and says why 30 is unusable before downloading its tensors."""
    moto, proxy = env
    local = tmp_path / "run"
    directory = store.rank_dir(str(local), 0)
    arrays = {"w": np.arange(50_000, dtype=np.float32)}
    lines, events = [], []
    uploader = S3Uploader("s3://bkt/e", endpoint=proxy.url)
    mirror = mirror_of("s3://bkt/e", proxy.url, 30, lines, events)
    for step in (10, 20, 30, 40):
        store.save(directory, step, {"w": arrays["w"] + step}, {"consumed_samples": step}, "safetensors")
    for step in (10, 20):
        name = f"step_{step:08d}"
        mirror.submit(step, [(os.path.join(directory, n), f"checkpoints/rank_0/{n}")
                             for n in (name + ".safetensors", name + ".json", "latest")])
    assert mirror.drain() == [] and len(events) == 2
    client = moto.client("x", "x")
    t30 = open(os.path.join(directory, "step_00000030.safetensors"), "rb").read()
    client.put_object(Bucket="bkt", Key="e/checkpoints/rank_0/step_00000030.safetensors", Body=t30[:len(t30) // 2])
    client.upload_file(os.path.join(directory, "step_00000030.json"), "bkt", "e/checkpoints/rank_0/step_00000030.json")
    client.upload_file(os.path.join(directory, "step_00000040.safetensors"), "bkt",
                       "e/checkpoints/rank_0/step_00000040.safetensors")
    fresh = tmp_path / "fresh"
    proxy.clear()
    messages = []
    assert pull_newest("s3://bkt/e", uploader, str(fresh), 0, messages.append) == 20
    assert any("step 30 is unusable" in m and "half-written" in m for m in messages), messages
    assert not any(p.endswith("step_00000030.safetensors") for m, p in proxy.seen if m == "GET")
    step, manifest = store.newest_valid(store.rank_dir(str(fresh), 0))
    assert step == 20 and sorted(os.listdir(store.rank_dir(str(fresh), 0))) == ["step_00000020.json",
                                                                                "step_00000020.safetensors"]


def test_obs_sdk_round_trip_against_the_s3_server(env, tmp_path, monkeypatch):
    """esdk-obs-python speaks to moto's S3 server as long as moto does not check signatures (with checking on,
    moto answers the SDK's requests with HTTP 500: docs/checkpoints.md has the figures): multipart upload, the
    read-back verification and the pull of the newest checkpoint through the OBS SDK itself."""
    moto, proxy = env
    monkeypatch.setenv("OBS_ACCESS_KEY_ID", "obs-key")
    monkeypatch.setenv("OBS_SECRET_ACCESS_KEY", "obs-secret")
    from ms_llm.checkpoint.remote.obs import ObsUploader

    uploader = make_uploader("obs://bkt/obs-run", None, moto.url)
    assert isinstance(uploader, ObsUploader)
    uploader.check("obs://bkt/obs-run")
    directory = store.rank_dir(str(tmp_path / "run"), 0)
    store.save(directory, 10, {"w": np.arange(3 * MIB, dtype=np.float32)}, {"consumed_samples": 10}, "safetensors")
    names = ["step_00000010.safetensors", "step_00000010.json", "latest"]
    lines, events = [], []
    mirror = mirror_of("obs://bkt/obs-run", moto.url, 30, lines, events, part_mib=5)
    mirror.submit(10, [(os.path.join(directory, n), f"checkpoints/rank_0/{n}") for n in names])
    assert mirror.drain() == [] and events[-1]["event"] == "upload", (events, lines)
    head = moto.client("x", "x").head_object(Bucket="bkt", Key="obs-run/checkpoints/rank_0/step_00000010.safetensors")
    assert head["ETag"].endswith('-3"'), head  # 12 MiB in 5 MiB parts
    assert uploader.listdir("obs://bkt/obs-run") == ["checkpoints"]
    assert pull_newest("obs://bkt/obs-run", uploader, str(tmp_path / "fresh"), 0, lines.append) == 10
    with pytest.raises(UserError, match="bucket 'nope' does not exist"):
        uploader.check("obs://nope/run")


def test_keep_last_spares_checkpoints_still_waiting_for_their_upload(env, tmp_path):
    """keep_last 1 while the store answers 500: the three checkpoints stay on disk until each is uploaded; once
    the store recovers, all three reach the bucket and only the newest stays local."""
    from types import SimpleNamespace

    from ms_llm.checkpoint.saver import CheckpointSaver

    moto, proxy = env
    proxy.add("PUT", r"^/bkt/k/", "500")
    cfg = SimpleNamespace(remote_dir="s3://bkt/k", uploader=None, remote_endpoint=proxy.url, upload_budget_s=60,
                          keep_last=1, format="safetensors", async_save=False)
    lines = []
    saver = CheckpointSaver(str(tmp_path / "run"), 0, cfg, lines.append)
    for step in (1, 2, 3):
        saver.save(step, {"w": np.full(1000, step, dtype=np.float32)}, {"consumed_samples": step})
    assert store.list_checkpoints(saver.directory) == [3, 2, 1]  # none pruned: none is in the bucket yet
    proxy.clear()
    saver.upload()  # the end of training: waits for the queue
    keys = moto.client("x", "x").list_objects_v2(Bucket="bkt", Prefix="k/checkpoints/")["Contents"]
    assert {k["Key"].rsplit("/", 1)[1] for k in keys} >= {f"step_0000000{s}.safetensors" for s in (1, 2, 3)}
    assert store.list_checkpoints(saver.directory) == [3]


def test_training_with_a_missing_bucket_or_wrong_keys_stops_before_it_starts(env, dataset, tmp_path, monkeypatch,
                                                                            capsys):
    from conftest import tiny_train_args
    from ms_llm.cli import main

    moto, proxy = env
    moto.enforce(True)
    for url, overrides, words in [("s3://no-such-bucket/run", {}, "bucket 'no-such-bucket' does not exist"),
                                  ("s3://bkt/run", {"AWS_SECRET_ACCESS_KEY": "wrong-secret-123"},
                                   "refused the credentials (SignatureDoesNotMatch)")]:
        with monkeypatch.context() as m:
            for k, v in overrides.items():
                m.setenv(k, v)
            code = main([str(a) for a in tiny_train_args(dataset, tmp_path / "run", "--set",
                                                         f"checkpoint.remote_dir={url}", "--set",
                                                         f"checkpoint.remote_endpoint={moto.url}")])
        err = capsys.readouterr().err
        assert code == 2 and err.startswith("error: ") and err.count("\n") == 1 and words in err, err
        assert "wrong-secret-123" not in err and not (tmp_path / "run").exists()
