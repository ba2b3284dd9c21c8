"""Checkpoints that never lose work: exact resume, crash safety, preemption, remote copies, bad input.

The reference for "exact" is one uninterrupted run at accumulation 2 (conftest.accum2_run), and the runs stopped at
step 30 are one shared run too (conftest.accum2_stopped_at_30): each test resumes, truncates or strips a copy."""
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import ACCUM2, ROOT, copy_run, ms_llm, tiny_train_args
from ms_llm.checkpoint import store
from ms_llm.cli import main

RUN = ACCUM2  # accumulation 2: resume must restore what the accumulating graph and the updating graph share


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


def refused(code, capsys, *words):
    """An in-process refusal through the CLI's main: exit 2 and one paragraph naming `words`."""
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, err


def cli(*args):
    return main([str(a) for a in args])


@pytest.fixture(scope="module")
def uninterrupted(accum2_run):
    run, stdout = accum2_run
    return run, digest(stdout)


@pytest.mark.slow
def test_truncated_newest_checkpoint_falls_back_with_one_line_warning(dataset, uninterrupted, accum2_stopped_at_30,
                                                                      tmp_path):
    ref, ref_digest = uninterrupted
    run = copy_run(accum2_stopped_at_30, tmp_path / "run")
    newest = run / "checkpoints" / "rank_0" / "step_00000030.ckpt"
    newest.write_bytes(newest.read_bytes()[:1000])
    resumed = ok(ms_llm(*tiny_train_args(dataset, run, *RUN), "--resume"))
    warnings = [l for l in (resumed.stdout + resumed.stderr).splitlines() if "unusable" in l]
    assert len(warnings) == 1 and "step 30" in warnings[0] and "truncated" in warnings[0]
    assert "resuming at step 20" in resumed.stdout
    assert digest(resumed.stdout) == ref_digest and losses(run) == losses(ref)


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
        time.sleep(0.02)
    raise AssertionError(f"no step {step} within {timeout}s")


@pytest.mark.slow
def test_stop_then_resume_and_kill_9_then_auto_resume_end_bit_identical(dataset, uninterrupted, accum2_stopped_at_30,
                                                                        tmp_path):
    """The run stopped at step 30 (train.stop_at_step) resumes there; killed at a random moment after step 32
    (mid-step, mid-save or mid-log), the same command (checkpoint.auto_resume) resumes from the newest intact
    checkpoint; the run then logs what the uninterrupted run logged, step for step, and its last checkpoint holds the
    same tensors. (One test: a resumed process that is then killed serves both, with one process fewer.)"""
    ref, ref_digest = uninterrupted
    args = [*RUN, "--set", "checkpoint.auto_resume=true"]
    run = copy_run(accum2_stopped_at_30, tmp_path / "run")
    proc = train_in_background(tiny_train_args(dataset, run, *args))
    wait_for_step(run, 32, proc)  # the checkpoint of step 30 is the stopped run's
    time.sleep(random.uniform(0.0, 0.1))
    proc.kill()
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL  # killed before the end: over 20 steps were still to come
    assert "(resuming at step 30)" in (run / "logs" / "train.log").read_text()  # the stop's checkpoint, picked up
    again = ok(ms_llm(*tiny_train_args(dataset, run, *args)))  # same command: auto_resume picks it up again
    assert re.search(r"resuming at step (30|40|50)\b", again.stdout), again.stdout[-1500:]
    assert losses(run) == losses(ref)  # the loss of every step and every val loss, bit for bit
    assert digest(again.stdout) == ref_digest
    (s1, a), (s2, b) = final_tensors(ref), final_tensors(run)
    assert s1 == s2 == 60 and a.keys() == b.keys()
    assert all(np.array_equal(a[k], b[k]) for k in a)  # weights, moments, loss scale, counters


@pytest.mark.slow
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
    events = [e for e in events if e["event"] != "diagnose"]  # the live diagnosis's timing, written at its end
    assert events and events[-1]["event"] == "preempted"
    step, manifest = store.newest_valid(store.rank_dir(str(run), 0))
    assert step == events[-1]["step"] and manifest["consumed_samples"] == step * 8


@pytest.mark.slow
def test_a_closed_terminal_saves_and_exits_zero(dataset, tmp_path):
    """SIGHUP (the terminal of the run closed: a dropped ssh session) stops the run like SIGTERM, with a checkpoint,
    although the terminal it printed to is gone; its log keeps the lines."""
    import pty

    run = tmp_path / "run"
    master, terminal = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "ms_llm.cli",
                             *tiny_train_args(dataset, run, "--set", "train.max_steps=100000",
                                              "--set", "train.log_interval=5")],
                            cwd=ROOT, stdin=terminal, stdout=terminal, stderr=terminal, start_new_session=True,
                            env=dict(os.environ, GLOG_v="3"))
    os.close(terminal)
    os.set_blocking(master, False)
    deadline = time.time() + 120
    while time.time() < deadline and not (run / "metrics.jsonl").exists():
        try:
            os.read(master, 65536)  # a terminal that is read, as a user's is
        except OSError:
            pass
        assert proc.poll() is None, "training ended early"
        time.sleep(0.05)
    wait_for_step(run, 5, proc)
    os.close(master)  # the window closes: the kernel hangs up the terminal
    proc.send_signal(signal.SIGHUP)
    assert proc.wait(timeout=60) == 0
    events = [json.loads(l) for l in open(run / "metrics.jsonl") if '"preempted"' in l]
    assert events and events[-1]["signal"] == signal.SIGHUP
    step, manifest = store.newest_valid(store.rank_dir(str(run), 0))
    assert step == events[-1]["step"] and manifest["consumed_samples"] == step * 8
    assert "received SIGHUP" in (run / "logs" / "train.log").read_text()


@pytest.mark.slow
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
    from ms_llm.train.loop.preemption import Preemption

    exits, lines = [], []
    monkeypatch.setattr("os._exit", exits.append)
    with Preemption(lines.append) as p:
        assert not p.requested
        p._handle(signal.SIGTERM, None)
        assert p.requested and p.signum == signal.SIGTERM and exits == [] and "received SIGTERM" in lines[0]
        p._handle(signal.SIGINT, None)
        assert exits == [128 + signal.SIGINT]


@pytest.mark.slow
def test_bad_checkpoint_inputs_exit_2_and_delete_nothing(dataset, uninterrupted, tmp_path, capsys):
    ref = copy_run(uninterrupted[0], tmp_path / "ref")
    before = sorted(os.listdir(ref / "checkpoints" / "rank_0"))
    refused(cli(*tiny_train_args(dataset, ref, *RUN, "--set", "model.hidden_size=64"), "--resume"), capsys,
            "different model", "model.hidden_size: checkpoint 32, now 64")
    refused(cli(*tiny_train_args(dataset, tmp_path / "nothing", *RUN), "--resume"), capsys, "nothing to resume")
    refused(cli(*tiny_train_args(dataset, tmp_path / "x", *RUN), "--weights-only"), capsys,
            "only applies with --resume")
    refused(cli(*tiny_train_args(dataset, tmp_path / "y", *RUN, "--set", "checkpoint.remote_dir=obs://bucket/run")),
            capsys, "needs the OBS endpoint", "checkpoint.remote_endpoint")
    refused(cli(*tiny_train_args(dataset, tmp_path / "z", *RUN, "--set", "checkpoint.load_weights=/no/such.ckpt")),
            capsys, "does not exist")
    blocker = tmp_path / "notes.txt"
    blocker.write_text("a file where a folder was expected")
    refused(cli(*tiny_train_args(dataset, blocker / "run")), capsys, f"lies under '{blocker}', which is a file")
    assert blocker.read_text() == "a file where a folder was expected"
    assert sorted(os.listdir(ref / "checkpoints" / "rank_0")) == before
    for d in ("nothing", "x", "y", "z"):
        assert not (tmp_path / d).exists()


@pytest.mark.slow
def test_weights_only_resume_of_a_checkpoint_without_optimizer_state(dataset, accum2_stopped_at_30, tmp_path,
                                                                   capsys):
    run = copy_run(accum2_stopped_at_30, tmp_path / "run")
    directory = store.rank_dir(str(run), 0)
    for name in os.listdir(directory):  # the run as it was at step 20
        if name.startswith("step_00000030"):
            os.remove(os.path.join(directory, name))
    _, arrays = final_tensors(run)
    weights = {k: v for k, v in arrays.items() if not k.startswith(("adam_", "loss_scale", "good_steps",
                                                                     "global_step", "rng_state"))}
    with open(os.path.join(directory, "step_00000020.json")) as f:
        meta = json.load(f)
    store.save(directory, 20, weights, {k: meta[k] for k in ("consumed_samples", "epoch", "config", "host")})
    # the refusal, through the CLI's main in this process (a process of its own would only add its import)
    refused(cli(*tiny_train_args(dataset, run, *RUN), "--resume"), capsys, "no optimizer", "--weights-only")
    resumed = ok(ms_llm(*tiny_train_args(dataset, run, *RUN), "--resume", "--weights-only"))
    assert "optimizer state, loss scale and step counters start fresh" in resumed.stdout


@pytest.mark.slow
def test_modelarts_remote_copy_and_restart_on_a_fresh_machine(dataset, uninterrupted, tmp_path):
    """train.py as ModelArts starts it: the dataset copied in from --data_url, every checkpoint and the metrics
    copied out to --train_url (remote_dir), written as safetensors in a background thread with keep_last 3; the job
    restarted on a fresh machine (empty local cache) pulls the newest remote checkpoint and ends exactly like the
    uninterrupted run."""
    ref, ref_digest = uninterrupted
    obs = tmp_path / "obs"
    env = dict(os.environ, GLOG_v="3", MS_LLM_MODELARTS_CACHE=str(tmp_path / "cache"))
    shutil.copytree(dataset, obs / "dataset")
    args = tiny_train_args(dataset, "unused", *RUN, "--set", "checkpoint.format=safetensors",
                           "--set", "checkpoint.async_save=true", "--set", "checkpoint.keep_last=3")[1:]
    i = args.index(f"data.dataset_dir={dataset}")
    del args[i - 1:i + 1]  # the dataset comes from --data_url instead
    i = args.index("--run-dir")
    del args[i:i + 2]  # and the run directory is ModelArts' local cache
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), f"--data_url={obs / 'dataset'}",
           f"--train_url={obs / 'output'}", *args, "--set", "train.stop_at_step=30"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "cache" / "data" / "manifest.json").is_file()
    remote = obs / "output" / "checkpoints" / "rank_0"
    assert (remote / "step_00000030.safetensors").is_file() and (remote / "latest").is_file()
    assert (obs / "output" / "metrics.jsonl").is_file()
    shutil.rmtree(tmp_path / "cache")  # the restarted job lands on a fresh machine
    proc = subprocess.run(cmd[:-2], cwd=ROOT, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "pulled checkpoint step 30" in proc.stdout and "resuming at step 30" in proc.stdout
    assert digest(proc.stdout) == ref_digest and losses(tmp_path / "cache" / "run") == losses(ref)
    assert (remote / "step_00000060.safetensors").is_file()
    assert len(store.list_checkpoints(store.rank_dir(str(tmp_path / "cache" / "run"), 0))) == 3  # keep_last pruned


def test_remote_urls_are_printed_without_credentials():
    from ms_llm.checkpoint.remote import redact

    assert redact("obs://AKID123:SECRET@bucket/run?Signature=abc&Expires=1") == "obs://***@bucket/run?***"
    assert redact("s3://bucket/run") == "s3://bucket/run"


def test_credentials_in_the_url_and_a_missing_endpoint_are_refused(monkeypatch):
    monkeypatch.delenv("OBS_ENDPOINT", raising=False)
    from ms_llm.checkpoint.remote import make_uploader
    from ms_llm.errors import UserError

    with pytest.raises(UserError) as e:
        make_uploader("s3://AKIA123:wJalrXUtnFEMI@bkt/run")
    assert "wJalrXUtnFEMI" not in str(e.value) and "AKIA123" not in str(e.value) and "AWS_ACCESS_KEY_ID" in str(e.value)
    with pytest.raises(UserError, match="OBS endpoint"):
        make_uploader("obs://bkt/run", "obs")
    with pytest.raises(UserError, match="needs an obs:// or s3://"):
        make_uploader("/some/folder", "s3")


@pytest.mark.parametrize("keys", [[-1] + [0] * 623, [2 ** 63] + [0] * 623, [2 ** 32] + [0] * 623, ["x"] * 624],
                         ids=["negative", "huge", "one-past-32-bit", "text"])
def test_a_generator_state_outside_32_bits_is_one_paragraph_not_a_wrapped_restore(keys):
    """An edited manifest's numpy generator keys: NumPy 1 wraps -1 or 2**63 into uint32 with a warning (NumPy 2
    refuses); resume refuses both the same way, naming the manifest."""
    import random

    from ms_llm.errors import UserError
    from ms_llm.train.setup.resume import restore_host_rng

    before = np.random.get_state(), random.getstate()
    manifest = {"rng": {"numpy": ["MT19937", keys, 0, 0, 0.0]}}
    try:
        with pytest.raises(UserError, match="step_00000010.json' holds a random-number state that cannot be"):
            restore_host_rng(manifest, "/run/checkpoints/rank_0/step_00000010.ckpt")
    finally:
        np.random.set_state(before[0])
        random.setstate(before[1])


def test_the_run_seed_fixes_the_generator_state_that_checkpoints_keep():
    """MindSpore's default generator, whose state every checkpoint keeps (rng_state), follows train.seed. MindSpore
    2.7 seeds it at random on import (ms.seed() here), and set_seed leaves it alone: two runs of one config wrote
    different checkpoints there, and test_stop_then_resume_and_kill_9_then_auto_resume_end_bit_identical (then
    test_stop_and_resume_is_bit_identical) failed."""
    import mindspore as ms

    from ms_llm.train.session import ms_seed

    saved, np_saved, py_saved = ms.get_rng_state(), np.random.get_state(), random.getstate()
    try:
        ms_seed(1234)
        first = ms.get_rng_state().asnumpy()
        ms.seed()
        ms_seed(1234)
        assert np.array_equal(ms.get_rng_state().asnumpy(), first)
        ms_seed(4321)
        assert not np.array_equal(ms.get_rng_state().asnumpy(), first)
    finally:
        ms.set_rng_state(saved)
        np.random.set_state(np_saved)
        random.setstate(py_saved)


@pytest.mark.slow
def test_anomaly_guard_rolls_back_after_repeated_non_finite_steps(dataset, tmp_path, monkeypatch):
    """Three consecutive non-finite steps (simulated) → weights of the last checkpoint, learning rate halved."""
    import mindspore as ms
    from ms_llm.config import load_config
    from ms_llm.train.step_runner import StepRunner
    from ms_llm.train.trainer import run

    real = StepRunner.step

    def flaky(self, batches=None):
        out = real(self, batches)
        done = int(self.s.step_fn.state.global_step.asnumpy())
        return out._replace(code=ms.Tensor(1, ms.int32)) if 22 <= done <= 24 else out

    monkeypatch.setattr(StepRunner, "step", flaky)
    # the tiny config without RUN's accumulation and dropout: trained in this process, whose compile (no compile cache
    # in a pytest worker) is a third of RUN's, and nothing of a rollback depends on them
    args = tiny_train_args(dataset, "unused", "--set", "checkpoint.save_interval=10", "--set", "train.log_interval=1",
                           "--set", "train.anomaly.max_nonfinite=3",
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


@pytest.mark.slow
def test_a_run_whose_every_update_overflows_stops_with_a_checkpoint_instead_of_reporting_done(dataset, tmp_path,
                                                                                            capsys):
    """float16 with a huge init overflows at every loss scale: the scale reaches its floor of 1, the next
    overflow stops the run (exit 3) with a checkpoint and the command that finds the culprit. (Through the CLI's main
    in this process: a process of its own would add its import to the same cold compile.)"""
    run = tmp_path / "run"
    code = cli(*tiny_train_args(dataset, run, "--set", "precision.compute_dtype=float16",
                                "--set", "model.init_std=50", "--set", "train.max_steps=200"))
    out, stderr = capsys.readouterr()
    assert code == 3, out[-1500:] + stderr[-1500:]
    assert "Traceback" not in stderr and "done:" not in out
    err = stderr.strip().splitlines()
    assert len(err) == 1 and "every update since step 1 was skipped" in err[0], stderr
    assert "floor of 1" in err[0] and f"ms-llm debug nan --run-dir {run} --step 24" in err[0]
    assert "step_00000024.ckpt" in err[0] and (run / "checkpoints" / "rank_0" / "step_00000024.ckpt").is_file()
    events = [json.loads(l) for l in open(run / "metrics.jsonl") if '"event"' in l]
    assert events[-1]["event"] == "halted" and events[-1]["since_step"] == 1


def test_skipped_steps_stop_rules():
    from types import SimpleNamespace

    from ms_llm.train.loop.skipped_steps import LIMIT, SkippedSteps

    static = SkippedSteps(SimpleNamespace(loss_scale="static", init_scale=1024.0))
    assert all(static.update(n, 1, 1024.0) is None for n in range(1, LIMIT))
    assert static.update(LIMIT, 1, 1024.0).startswith(f"{LIMIT} consecutive updates were skipped")
    static.update(LIMIT + 1, 0, 1024.0)  # one applied update resets the count
    assert static.count == 0 and static.update(LIMIT + 2, 2, 1024.0) is None

    dynamic = SkippedSteps(SimpleNamespace(loss_scale="dynamic", init_scale=4.0))
    # overflows at 4, 2 and 1 (the scale returned is the one the next step uses): the overflow at 1 stops it
    assert dynamic.update(1, 1, 2.0) is None and dynamic.update(2, 1, 1.0) is None
    assert "floor of 1 and step 3 still overflowed" in dynamic.update(3, 1, 1.0)


@pytest.mark.slow
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
    # the tiny config without RUN's accumulation and dropout (this process compiles it, a third of RUN's compile;
    # a checkpoint write does not depend on them), a checkpoint every 10 steps, every step logged
    args = tiny_train_args(dataset, "unused", "--set", "checkpoint.save_interval=10", "--set", "train.log_interval=1",
                           "--set", f"checkpoint.async_save={str(async_save).lower()}")
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
