import fcntl
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAKESPEARE = os.path.join(ROOT, "data", "tinyshakespeare.txt")
QUICKSTART_DATA = os.path.join(ROOT, "data", "shakespeare_char")
os.environ.setdefault("GLOG_v", "3")
# A test outside the `slow` tier that takes longer than this fails, so that the fast tier stays fast. A loaded
# machine can raise it (MS_LLM_FAST_TEST_LIMIT_S=10); CI keeps the default.
FAST_TEST_LIMIT_S = float(os.environ.get("MS_LLM_FAST_TEST_LIMIT_S", "3"))


def pytest_configure(config):
    """Under pytest-xdist (not in the dev extra: on 2 cores the diagnosis tests' clean runs see the other
    worker's load as saw-toothed throughput) the workers share this checkout and the user's cache: give each
    worker its own compile cache, so two workers never fill one entry at the same time, and tokenize the
    quickstart's dataset once, under a lock, before any test's training run would do it (two first runs at once
    would both find no dataset and the second would refuse the first's)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        base = os.environ.get("MS_LLM_CACHE", os.path.expanduser("~/.cache/ms_llm"))
        os.environ["MS_LLM_CACHE"] = os.path.join(base, f"pytest-{worker}")
    from ms_llm.data.manifest import has_manifest

    with open(os.path.join(ROOT, "data", ".tests.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not has_manifest(QUICKSTART_DATA):
            from ms_llm.data.preprocess import preprocess

            preprocess(SHAKESPEARE, QUICKSTART_DATA, 64, "char", 0.1, log=lambda *_: None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """The fast tier's guard: a test not marked slow whose setup or body takes more than FAST_TEST_LIMIT_S fails,
    naming the time, so that it is made faster or marked slow."""
    outcome = yield
    report = outcome.get_result()
    if report.when in ("setup", "call") and report.passed and item.get_closest_marker("slow") is None \
            and call.duration > FAST_TEST_LIMIT_S:
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid}: its {report.when} took {call.duration:.1f} s, over the fast tier's "
                           f"{FAST_TEST_LIMIT_S:g} s: make it faster, or mark it @pytest.mark.slow if it starts a "
                           f"process or trains")


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


@pytest.fixture
def cache(tmp_path):
    """Environment for an empty compile cache that shares the fused-kernel build of the session's cache (so
    g++ does not rebuild it)."""
    root = tmp_path / "cache"
    root.mkdir()
    kernels = os.path.join(os.environ.get("MS_LLM_CACHE", os.path.expanduser("~/.cache/ms_llm")), "kernels")
    if os.path.isdir(kernels):
        os.symlink(kernels, root / "kernels")
    return {"MS_LLM_CACHE": str(root)}


def ms_llm(*args, cwd=None, timeout=600, env=None):
    """Run the installed CLI the way a user does; returns the CompletedProcess."""
    full_env = dict(os.environ, GLOG_v="3", **(env or {}))
    return subprocess.run([sys.executable, "-m", "ms_llm.cli", *args], cwd=cwd or ROOT, capture_output=True,
                          text=True, timeout=timeout, env=full_env)


def tiny_train_args(dataset, run_dir, *extra):
    """A tiny GPT on the small dataset: compiles in seconds, trains in a few more."""
    return ["train", "--config", os.path.join(ROOT, "configs", "shakespeare_char.yaml"), "--run-dir", str(run_dir),
            "--set", f"data.dataset_dir={dataset}", "--set", "data.source=null",
            "--set", "model.num_layers=2", "--set", "model.hidden_size=32", "--set", "model.num_heads=2",
            "--set", "model.seq_length=32", "--set", "train.global_batch_size=8", "--set", "train.micro_batch_size=8",
            "--set", "train.max_steps=30", "--set", "train.warmup_steps=5", "--set", "train.log_interval=10",
            "--set", "train.eval_interval=20", "--set", "train.eval_steps=4", "--set", "checkpoint.save_interval=0",
            *extra]
