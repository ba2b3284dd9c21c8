"""Checkpoints that never lose work: exact resume, crash safety, preemption, remote copies, bad input."""
import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import ROOT, ms_llm, tiny_train_args
from ms_llm.checkpoint import store

# accumulation 2: resume must restore what the accumulating graph and the updating graph share
RUN = ["--set", "train.max_steps=60", "--set", "checkpoint.save_interval=10", "--set", "train.eval_interval=20",
       "--set", "train.micro_batch_size=4", "--set", "train.log_interval=1"]


def losses(run_dir):
    recs = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    return [(r["step"], r["loss"]) for r in recs if "loss" in r], [(r["step"], r["val_loss"]) for r in recs
                                                                    if "val_loss" in r]


def digest(stdout):
    return re.search(r"parameter digest \(rank 0\): (\w+)", stdout).group(1)


def final_tensors(run_dir):
    directory = store.rank_dir(str(run_dir), 0)
    step, manifest = store.newest_valid(directory)
    return step, store.read_tensors(store.checkpoint_path(directory, manifest))


def ok(proc):
    assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr[-3000:]
    return proc


def refused(proc, *words):
    assert proc.returncode == 2, proc.stdout[-1500:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    for w in words:
        assert w in proc.stderr, proc.stderr
    return proc


@pytest.fixture(scope="module")
def uninterrupted(dataset, tmp_path_factory):
    run = tmp_path_factory.mktemp("ref") / "run"
    proc = ok(ms_llm(*tiny_train_args(dataset, run, *RUN)))
    return run, digest(proc.stdout)


def test_stop_and_resume_is_bit_identical(dataset, uninterrupted, tmp_path):
    ref, ref_digest = uninterrupted
    run = tmp_path / "run"
    first = ok(ms_llm(*tiny_train_args(dataset, run, *RUN, "--set", "train.stop_at_step=30")))
    assert "stopped at step 30" in first.stdout and "accumulation 2" in first.stdout
    resumed = ok(ms_llm(*tiny_train_args(dataset, run, *RUN), "--resume"))
    assert "resuming at step 30" in resumed.stdout
    assert losses(run) == losses(ref)  # the loss of every step and every val loss, bit for bit
    assert digest(resumed.stdout) == ref_digest
    (s1, a), (s2, b) = final_tensors(ref), final_tensors(run)
    assert s1 == s2 == 60 and a.keys() == b.keys()
    assert all(np.array_equal(a[k], b[k]) for k in a)  # weights, moments, loss scale, counters


def test_safetensors_format_and_async_save_resume_identically(dataset, uninterrupted, tmp_path):
    ref, ref_digest = uninterrupted
    run = tmp_path / "run"
    extra = ["--set", "checkpoint.format=safetensors", "--set", "checkpoint.async_save=true",
             "--set", "checkpoint.keep_last=3"]
    ok(ms_llm(*tiny_train_args(dataset, run, *RUN, *extra, "--set", "train.stop_at_step=30")))
    assert (run / "checkpoints" / "rank_0" / "step_00000030.safetensors").is_file()
    resumed = ok(ms_llm(*tiny_train_args(dataset, run, *RUN, *extra), "--resume"))
    assert digest(resumed.stdout) == ref_digest and losses(run) == losses(ref)
    assert len(store.list_checkpoints(store.rank_dir(str(run), 0))) == 3  # keep_last pruned the rest


def test_truncated_newest_checkpoint_falls_back_with_one_line_warning(dataset, uninterrupted, tmp_path):
    ref, ref_digest = uninterrupted
    run = tmp_path / "run"
    ok(ms_llm(*tiny_train_args(dataset, run, *RUN, "--set", "train.stop_at_step=30")))
    newest = run / "checkpoints" / "rank_0" / "step_00000030.ckpt"
    newest.write_bytes(newest.read_bytes()[:1000])
    resumed = ok(ms_llm(*tiny_train_args(dataset, run, *RUN), "--resume"))
    warnings = [l for l in (resumed.stdout + resumed.stderr).splitlines() if "unusable" in l]
    assert len(warnings) == 1 and "step 30" in warnings[0] and "truncated" in warnings[0]
    assert "resuming at step 20" in resumed.stdout
    assert digest(resumed.stdout) == ref_digest


def train_in_background(args, env=None):
    full_env = dict(os.environ, GLOG_v="3", **(env or {}))
    return subprocess.Popen([sys.executable, "-m", "ms_llm.cli", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=full_env)


def wait_for_step(run, step, proc, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError("training ended early: " + proc.stderr.read()[-2000:])
        try:
            if any(json.loads(l).get("step", 0) >= step for l in open(run / "metrics.jsonl")):
                return
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        time.sleep(0.05)
    raise AssertionError(f"no step {step} within {timeout}s")


def test_kill_9_then_auto_resume_ends_like_an_uninterrupted_run(dataset, tmp_path):
    long = ["--set", "train.max_steps=400", "--set", "checkpoint.save_interval=10", "--set", "train.log_interval=10",
            "--set", "train.eval_interval=0", "--set", "checkpoint.auto_resume=true", "--set", "train.micro_batch_size=4"]
    ref = tmp_path / "ref"
    ok(ms_llm(*tiny_train_args(dataset, ref, *long)))
    run = tmp_path / "run"
    proc = train_in_background(tiny_train_args(dataset, run, *long))
    wait_for_step(run, 30, proc)
    time.sleep(random.uniform(0.0, 0.4))  # a random moment: mid-step, mid-save, mid-log
    proc.kill()
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    again = ok(ms_llm(*tiny_train_args(dataset, run, *long)))  # same command: auto_resume picks it up
    assert "resuming at step" in again.stdout
    assert losses(run)[0][-1] == losses(ref)[0][-1]
    assert losses(run)[1] == losses(ref)[1]  # the final validation loss too


def test_sigterm_saves_and_exits_zero_quickly(dataset, tmp_path):
    run = tmp_path / "run"
    proc = train_in_background(tiny_train_args(dataset, run, "--set", "train.max_steps=100000",
                                               "--set", "train.log_interval=5"))
    wait_for_step(run, 5, proc)
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err[-2000:]
    assert time.time() - t0 < 30
    assert "received SIGTERM" in out + err
    events = [json.loads(l) for l in open(run / "metrics.jsonl") if "event" in l]
    assert events and events[-1]["event"] == "preempted"
    step, manifest = store.newest_valid(store.rank_dir(str(run), 0))
    assert step == events[-1]["step"] and manifest["consumed_samples"] == step * 8


def test_second_signal_aborts_without_damaging_saved_checkpoints(dataset, tmp_path):
    """The second SIGTERM, sent once the first one is acknowledged (while the step finishes, the checkpoint is
    written or the process winds down), aborts with 128 + SIGTERM; every checkpoint on disk is complete or never
    claimed. (SIGTERM: MindSpore's runtime turns a SIGINT into a SIGTERM, so both arrive as SIGTERM.)"""
    run = tmp_path / "run"
    proc = train_in_background(tiny_train_args(dataset, run, "--set", "train.max_steps=100000",
                                               "--set", "checkpoint.save_interval=5", "--set", "train.log_interval=5"))
    wait_for_step(run, 10, proc)
    proc.send_signal(signal.SIGTERM)
    deadline = time.time() + 60  # two signals sent at once can be delivered as one: wait for the first's receipt
    while "received SIGTERM" not in (run / "logs" / "train.log").read_text() and time.time() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM
    directory = store.rank_dir(str(run), 0)
    steps = store.list_checkpoints(directory)
    assert steps and store.newest_valid(directory)[0] is not None  # steps 5 and 10 were saved before the signals
    for step in steps:
        manifest, why = store.verify(directory, step)
        assert manifest is not None or why.startswith("no manifest"), why  # complete, or never claimed complete


def test_the_first_signal_asks_for_a_stop_and_the_second_exits_at_once(monkeypatch):
    from ms_llm.train.preemption import Preemption

    exits, lines = [], []
    monkeypatch.setattr("os._exit", exits.append)
    with Preemption(lines.append) as p:
        assert not p.requested
        p._handle(signal.SIGTERM, None)
        assert p.requested and p.signum == signal.SIGTERM and exits == [] and "received SIGTERM" in lines[0]
        p._handle(signal.SIGINT, None)
        assert exits == [128 + signal.SIGINT]


def test_remote_copy_and_pull_into_an_empty_run_dir(dataset, uninterrupted, tmp_path):
    ref, ref_digest = uninterrupted
    remote = tmp_path / "bucket"
    args = [*RUN, "--set", f"checkpoint.remote_dir={remote}", "--set", "checkpoint.auto_resume=true"]
    ok(ms_llm(*tiny_train_args(dataset, tmp_path / "node1", *args, "--set", "train.stop_at_step=30")))
    assert (remote / "checkpoints" / "rank_0" / "step_00000030.ckpt").is_file()
    assert (remote / "metrics.jsonl").is_file() and (remote / "checkpoints" / "rank_0" / "latest").is_file()
    # the job restarts on another machine: empty local run dir, same remote
    again = ok(ms_llm(*tiny_train_args(dataset, tmp_path / "node2", *args)))
    assert "pulled checkpoint step 30" in again.stdout and digest(again.stdout) == ref_digest
    assert (remote / "checkpoints" / "rank_0" / "step_00000060.ckpt").is_file()


def test_bad_checkpoint_inputs_exit_2_and_delete_nothing(dataset, uninterrupted, tmp_path):
    ref, _ = uninterrupted
    before = sorted(os.listdir(ref / "checkpoints" / "rank_0"))
    refused(ms_llm(*tiny_train_args(dataset, ref, *RUN, "--set", "model.hidden_size=64"), "--resume"),
            "different model", "model.hidden_size: checkpoint 32, now 64")
    refused(ms_llm(*tiny_train_args(dataset, tmp_path / "nothing", *RUN), "--resume"), "nothing to resume")
    refused(ms_llm(*tiny_train_args(dataset, tmp_path / "x", *RUN), "--weights-only"), "only applies with --resume")
    refused(ms_llm(*tiny_train_args(dataset, tmp_path / "y", *RUN, "--set", "checkpoint.remote_dir=obs://bucket/run")),
            "moxing")
    refused(ms_llm(*tiny_train_args(dataset, tmp_path / "z", *RUN, "--set", "checkpoint.load_weights=/no/such.ckpt")),
            "does not exist")
    assert sorted(os.listdir(ref / "checkpoints" / "rank_0")) == before
    for d in ("nothing", "x", "y", "z"):
        assert not (tmp_path / d).exists()


def test_weights_only_resume_of_a_checkpoint_without_optimizer_state(dataset, tmp_path):
    run = tmp_path / "run"
    ok(ms_llm(*tiny_train_args(dataset, run, *RUN, "--set", "train.stop_at_step=20")))
    directory = store.rank_dir(str(run), 0)
    _, arrays = final_tensors(run)
    weights = {k: v for k, v in arrays.items() if not k.startswith(("adam_", "loss_scale", "good_steps",
                                                                     "global_step", "rng_state"))}
    with open(os.path.join(directory, "step_00000020.json")) as f:
        meta = json.load(f)
    store.save(directory, 20, weights, {k: meta[k] for k in ("consumed_samples", "epoch", "config", "host")})
    refused(ms_llm(*tiny_train_args(dataset, run, *RUN), "--resume"), "no optimizer", "--weights-only")
    resumed = ok(ms_llm(*tiny_train_args(dataset, run, *RUN), "--resume", "--weights-only"))
    assert "optimizer state, loss scale and step counters start fresh" in resumed.stdout


def test_modelarts_data_url_and_train_url(dataset, tmp_path):
    """train.py as ModelArts starts it: dataset copied in, results copied out, restart continues."""
    obs = tmp_path / "obs"
    env = {"MS_LLM_MODELARTS_CACHE": str(tmp_path / "cache")}
    import shutil
    shutil.copytree(dataset, obs / "dataset")
    args = tiny_train_args(dataset, "unused", *RUN)[1:]
    i = args.index(f"data.dataset_dir={dataset}")
    del args[i - 1:i + 1]  # the dataset comes from --data_url instead
    i = args.index("--run-dir")
    del args[i:i + 2]  # and the run directory is ModelArts' local cache
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), f"--data_url={obs / 'dataset'}",
           f"--train_url={obs / 'output'}", *args, "--set", "train.stop_at_step=30"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, GLOG_v="3", **env))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "cache" / "data" / "manifest.json").is_file()
    assert (obs / "output" / "checkpoints" / "rank_0" / "step_00000030.ckpt").is_file()
    shutil.rmtree(tmp_path / "cache")  # the restarted job lands on a fresh machine
    proc = subprocess.run(cmd[:-2], cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, GLOG_v="3", **env))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "pulled checkpoint step 30" in proc.stdout and "resuming at step 30" in proc.stdout
    assert (obs / "output" / "checkpoints" / "rank_0" / "step_00000060.ckpt").is_file()


def test_remote_urls_are_printed_without_credentials():
    from ms_llm.checkpoint.remote import redact

    assert redact("obs://AKID123:SECRET@bucket/run?Signature=abc&Expires=1") == "obs://***@bucket/run?***"
    assert redact("s3://bucket/run") == "s3://bucket/run"


def test_anomaly_guard_rolls_back_after_repeated_non_finite_steps(dataset, tmp_path, monkeypatch):
    """Three consecutive non-finite steps (simulated) → weights of the last checkpoint, learning rate halved."""
    import mindspore as ms
    from ms_llm.config import load_config
    from ms_llm.train import session as session_module
    from ms_llm.train.trainer import run

    real = session_module.Session.train_step

    def flaky(self, batches=None):
        out = real(self, batches)
        done = int(self.step_fn.state.global_step.asnumpy())
        return out._replace(code=ms.Tensor(1, ms.int32)) if 22 <= done <= 24 else out

    monkeypatch.setattr(session_module.Session, "train_step", flaky)
    args = tiny_train_args(dataset, "unused", *RUN, "--set", "train.anomaly.max_nonfinite=3",
                           "--set", "train.anomaly.lr_factor=0.5", "--set", "context.compile_cache=false")
    cfg = load_config(os.path.join(ROOT, "configs", "shakespeare_char.yaml"),
                      [args[i + 1] for i, a in enumerate(args) if a == "--set"])
    from ms_llm.run_hooks import hooks_for

    run(cfg, run_dir=str(tmp_path / "run"), echo=lambda *a: None, hooks=hooks_for(cfg))
    recs = [json.loads(l) for l in open(tmp_path / "run" / "metrics.jsonl")]
    rollback = [r for r in recs if r.get("event") == "rollback"]
    assert len(rollback) == 1 and rollback[0]["step"] == 24 and rollback[0]["to_step"] == 20
    assert rollback[0]["lr_scale"] == 0.5
    from ms_llm.train.lr_schedule import lr_at
    at_30 = next(r for r in recs if r.get("step") == 30 and "lr" in r)
    assert at_30["lr"] == pytest.approx(0.5 * lr_at(29, cfg.train))


def test_a_run_whose_every_update_overflows_stops_with_a_checkpoint_instead_of_reporting_done(dataset, tmp_path):
    """float16 with a huge init overflows at every loss scale: the scale reaches its floor of 1, the next
    overflow stops the run (exit 3) with a checkpoint and the command that finds the culprit."""
    run = tmp_path / "run"
    proc = ms_llm(*tiny_train_args(dataset, run, "--set", "precision.compute_dtype=float16",
                                   "--set", "model.init_std=50", "--set", "train.max_steps=200"))
    assert proc.returncode == 3, proc.stdout[-1500:] + proc.stderr[-1500:]
    assert "Traceback" not in proc.stderr and "done:" not in proc.stdout
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "every update since step 1 was skipped" in err[0], proc.stderr
    assert "floor of 1" in err[0] and f"ms-llm debug nan --run-dir {run} --step 24" in err[0]
    assert "step_00000024.ckpt" in err[0] and (run / "checkpoints" / "rank_0" / "step_00000024.ckpt").is_file()
    events = [json.loads(l) for l in open(run / "metrics.jsonl") if '"event"' in l]
    assert events[-1]["event"] == "halted" and events[-1]["since_step"] == 1


def test_skipped_steps_stop_rules():
    from types import SimpleNamespace

    from ms_llm.train.skipped_steps import LIMIT, SkippedSteps

    static = SkippedSteps(SimpleNamespace(loss_scale="static", init_scale=1024.0))
    assert all(static.update(n, 1, 1024.0) is None for n in range(1, LIMIT))
    assert static.update(LIMIT, 1, 1024.0).startswith(f"{LIMIT} consecutive updates were skipped")
    static.update(LIMIT + 1, 0, 1024.0)  # one applied update resets the count
    assert static.count == 0 and static.update(LIMIT + 2, 2, 1024.0) is None

    dynamic = SkippedSteps(SimpleNamespace(loss_scale="dynamic", init_scale=4.0))
    # overflows at 4, 2 and 1 (the scale returned is the one the next step uses): the overflow at 1 stops it
    assert dynamic.update(1, 1, 2.0) is None and dynamic.update(2, 1, 1.0) is None
    assert "floor of 1 and step 3 still overflowed" in dynamic.update(3, 1, 1.0)


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_a_full_disk_during_a_checkpoint_write_ends_in_one_paragraph_and_keeps_earlier_checkpoints(
        dataset, tmp_path, monkeypatch, async_save):
    import errno

    from ms_llm.config import load_config
    from ms_llm.errors import UserError
    from ms_llm.train.trainer import run

    real = store.write_tensors

    def full_disk(path, arrays, fmt):
        if "step_00000020" in path:  # the second save: half a file, then the disk is full
            with open(path, "wb") as f:
                f.write(b"\0" * 1000)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, arrays, fmt)

    monkeypatch.setattr(store, "write_tensors", full_disk)
    args = tiny_train_args(dataset, "unused", *RUN, "--set", f"checkpoint.async_save={str(async_save).lower()}")
    cfg = load_config(os.path.join(ROOT, "configs", "shakespeare_char.yaml"),
                      [args[i + 1] for i, a in enumerate(args) if a == "--set"])
    out = tmp_path / "run"
    with pytest.raises(UserError) as e:
        run(cfg, run_dir=str(out), echo=lambda *a: None)
    msg = str(e.value)
    directory = out / "checkpoints" / "rank_0"
    assert f"checkpoint step 20 could not be written to {directory}: the disk is full" in msg
    assert re.search(r"it needs about [\d.]+ MiB and [\d,.]+ MiB are free", msg) and "--resume" in msg
    assert sorted(os.listdir(directory)) == ["latest", "step_00000010.ckpt", "step_00000010.json"]  # no partial file
    assert store.newest_valid(str(directory))[0] == 10
    steps = [json.loads(l)["step"] for l in open(out / "metrics.jsonl") if '"loss"' in l]
    assert max(steps) <= 21  # with async_save the failure stops training at the next step
    assert "could not be written" in (out / "logs" / "rank_0.log").read_text()  # what ended the run stays in logs/


def test_a_run_dir_under_a_regular_file_is_refused_in_one_paragraph(dataset, tmp_path):
    blocker = tmp_path / "notes.txt"
    blocker.write_text("a file where a folder was expected")
    refused(ms_llm(*tiny_train_args(dataset, blocker / "run")), f"lies under '{blocker}', which is a file")
    assert blocker.read_text() == "a file where a folder was expected"
