import contextlib
import fcntl
import json
import os
import pathlib
import resource
import shutil
import socket
import subprocess
import sys

import mindspore  # noqa: F401 (imported once at start-up: the first test to need it would pay its seconds)
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAKESPEARE = os.path.join(ROOT, "data", "tinyshakespeare.txt")
QUICKSTART_DATA = os.path.join(ROOT, "data", "shakespeare_char")
os.environ.setdefault("GLOG_v", "3")
# A test outside the `slow` tier that takes longer than this fails, so that the fast tier stays fast. A loaded
# machine can raise it (MS_LLM_FAST_TEST_LIMIT_S=10); CI keeps the default.
FAST_TEST_LIMIT_S = float(os.environ.get("MS_LLM_FAST_TEST_LIMIT_S", "3"))


def pytest_configure(config):
    """Under pytest-xdist (`-n 2`, what CI runs) the workers share this checkout and one compile cache (keyed on the
    built step, and locked per entry while it fills, so a graph one worker compiled is loaded by the other), and
    MindSpore and torch get one thread per worker, so that two workers on two cores do not contend (a training run's
    throughput, which diagnose reads, stays even);
    tests marked `serial` (msrun's two ranks) run alone (`pytest_runtest_protocol`). The quickstart's dataset is
    tokenized once, under a lock, before any test's training run would do it (two first runs at once would both
    find no dataset and the second would refuse the first's)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        base = os.environ.get("MS_LLM_CACHE", os.path.expanduser("~/.cache/ms_llm"))
        os.environ["MS_LLM_CACHE"] = os.path.join(base, "pytest-xdist")
        from ms_llm.train.setup.context import limit_cpu_threads

        limit_cpu_threads(1)
        try:  # torch too (the reference models, lm-eval, TRL): its second thread spin-waits on the other worker's core
            import torch

            torch.set_num_threads(1)
        except ImportError:
            pass
    from ms_llm.data.manifest import has_manifest
    from ms_llm.nn.cpu_kernels import library

    with open(os.path.join(ROOT, "data", ".tests.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not has_manifest(QUICKSTART_DATA):
            from ms_llm.data.preprocess import preprocess

            preprocess(SHAKESPEARE, QUICKSTART_DATA, 64, "char", 0.1, log=lambda *_: None)
        # The fused CPU kernels, built (g++, ~2.5 CPU s) into the session's cache before any test runs: every cache a
        # test makes (empty_cache) links to this build, where one made before the first training run built its own.
        if worker or not getattr(config.option, "numprocesses", None):  # (xdist's controller runs no test)
            library()  # a failed build leaves the plain MindSpore path, as in a run; test_cpu_kernels reports it


def session_dir(config):
    """Under xdist, a folder all workers of this test session share (for locks and shared runs): the parent of the
    workers' own temporary folders, which pytest removes with its old sessions. None without xdist."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    return config._tmp_path_factory.getbasetemp().parent  # pytest's own recipe for xdist (getbasetemp().parent)


@contextlib.contextmanager
def flock(path, mode):
    with open(path, "a") as f:
        fcntl.flock(f, mode)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Under xdist, a `serial` test (setup and shared fixtures included) runs while no other test runs: the other
    worker's tests hold the run lock shared, a serial one holds it exclusively. A waiting serial test holds the
    turnstile, so that new tests queue behind it instead of starving it."""
    shared = session_dir(item.config)
    if shared is None:
        yield
        return
    turnstile, run_lock = shared / "turnstile.lock", shared / "run.lock"
    if item.get_closest_marker("serial") is not None:
        with flock(turnstile, fcntl.LOCK_EX), flock(run_lock, fcntl.LOCK_EX):
            yield
        return
    with flock(turnstile, fcntl.LOCK_EX):
        pass
    with flock(run_lock, fcntl.LOCK_SH):
        yield


def build_once(tmp_path_factory, name, build):
    """The JSON result of `build(folder)` for a session-wide run: built by the first worker that needs it (under a
    lock; the others wait and reuse it), so xdist does not train a shared run once per worker."""
    root = tmp_path_factory.getbasetemp() / "shared"
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = tmp_path_factory.getbasetemp().parent / "shared"
    root.mkdir(exist_ok=True)
    with flock(root / f"{name}.lock", fcntl.LOCK_EX):
        done = root / f"{name}.json"
        if not done.exists():
            folder = root / name
            folder.mkdir()
            done.write_text(json.dumps(build(folder)))
        return json.loads(done.read_text())


def cpu_seconds():
    """CPU seconds of this process and the children it waited for."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def _timed_phase(item, when):
    start = cpu_seconds()
    yield
    item.stash.setdefault(PHASE_CPU, {})[when] = cpu_seconds() - start


PHASE_CPU = pytest.StashKey()
pytest_runtest_setup = pytest.hookimpl(hookwrapper=True)(lambda item: (yield from _timed_phase(item, "setup")))
pytest_runtest_call = pytest.hookimpl(hookwrapper=True)(lambda item: (yield from _timed_phase(item, "call")))
pytest_runtest_teardown = pytest.hookimpl(hookwrapper=True)(lambda item: (yield from _timed_phase(item, "teardown")))
CPU_LOG = os.environ.get("MS_LLM_TEST_CPU_LOG")
# CI (.ci/run) sets it: there a skip for a package that could not be imported fails the test
MISSING_PACKAGE_FAILS = os.environ.get("MS_LLM_TEST_MISSING_PACKAGE_FAILS") == "1"  # a JSONL file: each test phase's wall and CPU seconds


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """The fast tier's guard: a test not marked slow whose setup or body takes more than FAST_TEST_LIMIT_S fails,
    naming the time, so that it is made faster or marked slow. Its time is the lesser of wall and CPU seconds: the
    wall time grows when other tests share the cores (CI's two xdist workers, a loaded machine), the CPU time when
    MindSpore runs an operator on two threads; a test over the limit by both is slow on any machine."""
    outcome = yield
    report = outcome.get_result()
    if CPU_LOG and report.when in ("setup", "call", "teardown"):  # where CI's time goes, load or not (CPU seconds)
        with open(CPU_LOG, "a", encoding="utf-8") as f:
            f.write(json.dumps({"test": item.nodeid, "phase": report.when, "wall_s": round(call.duration, 2),
                                "cpu_s": round(item.stash.get(PHASE_CPU, {}).get(report.when, 0.0), 2)}) + "\n")
    if report.skipped and MISSING_PACKAGE_FAILS and "could not import" in str(report.longrepr):
        report.outcome = "failed"  # CI installs the dev extra: a package a test needs and cannot import is a defect
        report.longrepr = (f"{item.nodeid}: skipped for a missing package ({report.longrepr[2]}); every package a "
                           f"test imports belongs in setup.py's dev extra")
        return
    if report.when not in ("setup", "call") or not report.passed or item.get_closest_marker("slow") is not None:
        return
    cpu = item.stash.get(PHASE_CPU, {}).get(report.when, call.duration)
    took = min(call.duration, cpu)
    if took > FAST_TEST_LIMIT_S:
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid}: its {report.when} took {call.duration:.1f} s ({cpu:.1f} CPU seconds), over "
                           f"the fast tier's {FAST_TEST_LIMIT_S:g} s: make it faster, or mark it @pytest.mark.slow if "
                           f"it starts a process or trains")


def op_by_op():
    """PyNative inside the block (ms_llm.debug.probe.pynative): a forward in graph mode first compiles the model
    (seconds), and a test that only reads logits does not need the graph (every training test runs it)."""
    from ms_llm.debug.probe import pynative as mode_pynative

    return mode_pynative()


@pytest.fixture
def pynative():
    with op_by_op():
        yield


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """The first 60k characters of the bundled sample: big enough for a few epochs of tiny batches."""
    path = tmp_path_factory.mktemp("corpus") / "small.txt"
    with open(SHAKESPEARE, encoding="utf-8") as f:
        path.write_text(f.read()[:60000], encoding="utf-8")
    return str(path)


@pytest.fixture(scope="session")
def dataset(corpus, tmp_path_factory):
    """A char-level dataset with seq_length 32."""
    from ms_llm.data.preprocess import preprocess

    out = str(tmp_path_factory.mktemp("ds") / "small_char")
    preprocess(corpus, out, 32, "char", 0.1, log=lambda *_: None)
    return out


def empty_cache(folder):
    """Environment for an empty compile cache in `folder` (created here) that shares the fused-kernel build of the
    session's cache (so g++ does not rebuild it)."""
    folder.mkdir()
    kernels = os.path.join(os.environ.get("MS_LLM_CACHE", os.path.expanduser("~/.cache/ms_llm")), "kernels")
    if os.path.isdir(kernels):
        os.symlink(kernels, folder / "kernels")
    return {"MS_LLM_CACHE": str(folder)}


@pytest.fixture
def cache(tmp_path):
    """An empty compile cache of this test's own (`empty_cache`)."""
    return empty_cache(tmp_path / "cache")


def ms_llm(*args, cwd=None, timeout=600, env=None):
    """Run the installed CLI the way a user does; returns the CompletedProcess."""
    full_env = dict(os.environ, GLOG_v="3", **(env or {}))
    return subprocess.run([sys.executable, "-m", "ms_llm.cli", *args], cwd=cwd or ROOT, capture_output=True,
                          text=True, timeout=timeout, env=full_env)


# under xdist, each worker's training runs use one CPU thread (see pytest_configure)
THREADS = ["--set", "context.num_threads=1"] if os.environ.get("PYTEST_XDIST_WORKER") else []


def tiny_train_args(dataset, run_dir, *extra):
    """A tiny GPT on the small dataset: compiles in seconds, trains in a few more. The report and Insight summaries
    are off (they cost time and most tests do not read them); a test that reads them turns them on. Telemetry stays
    on: diagnose reads it to tell host contention from the run's own stalls."""
    return ["train", "--config", os.path.join(ROOT, "configs", "shakespeare_char.yaml"), "--run-dir", str(run_dir),
            "--set", f"data.dataset_dir={dataset}", "--set", "data.source=null",
            "--set", "model.num_layers=2", "--set", "model.hidden_size=32", "--set", "model.num_heads=2",
            "--set", "model.seq_length=32", "--set", "train.global_batch_size=8", "--set", "train.micro_batch_size=8",
            "--set", "train.max_steps=30", "--set", "train.warmup_steps=5", "--set", "train.log_interval=10",
            "--set", "train.eval_interval=20", "--set", "train.eval_steps=4", "--set", "checkpoint.save_interval=0",
            "--set", "monitor.report=false", "--set", "monitor.summary=false", *THREADS, *extra]


# Accumulation 2 (micro batch 4 of 8), dropout 0.1, 60 steps, every step logged, a checkpoint every 10: the
# uninterrupted run that resume, kill -9, remote pulls and the 2-rank launch are held to, step for step (dropout's
# masks are keyed on seed, step and sample, so they too must come back exactly).
ACCUM2 = ["--set", "train.max_steps=60", "--set", "checkpoint.save_interval=10", "--set", "train.eval_interval=20",
          "--set", "train.micro_batch_size=4", "--set", "train.log_interval=1", "--set", "model.dropout=0.1"]


def train_ok(*args, env=None):
    proc = ms_llm(*args, env=env)
    assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="session")
def accum2_run(dataset, tmp_path_factory):
    """(run dir, its console output) of the ACCUM2 run, trained once per session. Tests read it; one that changes
    a run directory copies it first (`copy_run`)."""
    def build(folder):
        proc = train_ok(*tiny_train_args(dataset, folder / "run", *ACCUM2))
        return {"run": str(folder / "run"), "stdout": proc.stdout}

    out = build_once(tmp_path_factory, "accum2", build)
    return pathlib.Path(out["run"]), out["stdout"]


@pytest.fixture(scope="session")
def accum2_stopped_at_30(dataset, tmp_path_factory):
    """The ACCUM2 run stopped at step 30 (train.stop_at_step) with its checkpoints at 10, 20 and 30, trained once;
    tests resume, truncate or strip copies of it."""
    def build(folder):
        proc = train_ok(*tiny_train_args(dataset, folder / "run", *ACCUM2, "--set", "train.stop_at_step=30"))
        assert "stopped at step 30" in proc.stdout and "accumulation 2" in proc.stdout
        return str(folder / "run")

    return pathlib.Path(build_once(tmp_path_factory, "accum2_stopped_at_30", build))


def copy_run(run, to):
    """A copy of a shared run directory to change."""
    import shutil

    shutil.copytree(run, to)
    return to


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def msrun_train(dataset, run_dir, logs, *extra, env=None):
    """Train the tiny config on 2 ranks under msrun; returns {rank: worker log text}."""
    args = tiny_train_args(dataset, run_dir, *extra)[1:]
    cmd = ["msrun", "--worker_num=2", "--local_worker_num=2", f"--master_port={free_port()}", "--join=True",
           "--cluster_time_out=120", f"--log_dir={logs}", os.path.join(ROOT, "train.py"), *args]
    env = dict(os.environ, GLOG_v="3", PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
               **(env or {}))
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    worker_logs = {r: (logs / f"worker_{r}.log").read_text() for r in range(2)}
    assert proc.returncode == 0, proc.stdout[-2000:] + worker_logs[0][-2000:] + worker_logs[1][-2000:]
    return worker_logs


@pytest.fixture(scope="session")
def msrun_accum2(dataset, tmp_path_factory):
    """ACCUM2's training on 2 ranks under msrun (micro batch 2 per rank, accumulation 2: the same global batch of
    8), trained once per session with a compile cache of its own: (run dir, {rank: worker log}, cache env). Tests
    that use it are marked `serial`."""
    if shutil.which("msrun") is None:
        pytest.skip("msrun not installed")

    def build(folder):
        env = empty_cache(folder / "cache")
        logs = msrun_train(dataset, folder / "run", folder / "logs", *ACCUM2, "--set", "train.micro_batch_size=2",
                           env=env)
        return {"run": str(folder / "run"), "logs": logs, "env": env}

    out = build_once(tmp_path_factory, "msrun_accum2", build)
    return pathlib.Path(out["run"]), {int(r): text for r, text in out["logs"].items()}, out["env"]


CLEAN_KINDS = ["gpt2_monitors", "llama", "fp16", "msrun_2ranks", "resumed", "profiled"]


@pytest.fixture(scope="session")
def clean_runs(dataset, tmp_path_factory):
    """The healthy runs diagnose must stay quiet on, trained once per session (in-process, as tests/faults train):
    220 steps with every monitor on (past diagnose's 200-step gate), Llama, float16, stopped at 100 and resumed,
    and profiled over steps 20-30 (whose logs and run_info the profiler tests read too). The 2-rank kind is the
    session's msrun_accum2 run. {kind: run dir}."""
    def build(root):
        sys.path.insert(0, os.path.join(ROOT, "tests", "faults"))  # a test outside tests/faults may ask first
        from faultkit import sets, tiny_cfg, train
        from ms_llm.train.trainer import run as run_training

        runs = {name: root / name for name in CLEAN_KINDS if name != "msrun_2ranks"}
        base = sets("train.max_steps=200", "train.eval_interval=50")
        train(tiny_cfg(dataset, *sets("train.max_steps=220", "train.eval_interval=100", "monitor.nan_check=true",
                                      "monitor.tensor_stats.every=100", "train.anomaly=true")), runs["gpt2_monitors"])
        train(tiny_cfg(dataset, *base, *sets("model.arch=llama")), runs["llama"])
        train(tiny_cfg(dataset, *sets("train.max_steps=100", "train.eval_interval=50",
                                      "precision.compute_dtype=float16")), runs["fp16"])
        train(tiny_cfg(dataset, *base, *sets("train.stop_at_step=100")), runs["resumed"])
        run_training(tiny_cfg(dataset, *base), run_dir=str(runs["resumed"]), resume=True, echo=lambda *a: None)
        train(tiny_cfg(dataset, *base, *sets("monitor.profile.start_step=20", "monitor.profile.stop_step=30")),
              runs["profiled"])
        return {name: str(path) for name, path in runs.items()}

    return {name: pathlib.Path(path) for name, path in build_once(tmp_path_factory, "clean_runs", build).items()}
