"""Experiment trackers that fail never stop or slow a run: the metrics writer with monitor.trackers [mlflow, swanlab]
and the real libraries, against an MLflow address where nothing listens, one that accepts and never answers, and a
SwanLab log folder that cannot be created. (The trackers against a real `mlflow server` and SwanLab's offline
files are in tests/test_remote_runs.py.)"""
import dataclasses
import socket
import threading
import time

import pytest

from object_store import free_port
from ms_llm.config import save_config
from ms_llm.config.schema import Config
from ms_llm.monitor.metrics import MetricsWriter
from ms_llm.monitor.trackers import base

pytestmark = pytest.mark.slow  # imports mlflow and swanlab (seconds)


def run_dir(tmp_path):
    path = tmp_path / "run"
    path.mkdir()
    save_config(Config(), str(path / "config.yaml"))
    return path


def writer_with_trackers(path, lines, names=("mlflow", "swanlab")):
    monitor = dataclasses.replace(Config().monitor, summary=False, trackers=list(names))
    return MetricsWriter(str(path), 0, 1000, monitor, echo=lines.append)


def record(step):
    return {"step": step, "loss": 4.0 - step * 1e-3, "lr": 1e-3, "grad_norm": 0.5, "loss_scale": 1.0, "skipped": 0,
            "tokens_per_s": 1000.0, "mfu": 0.01, "mem_gib": 0.5, "data_wait_frac": 0.0}


@pytest.fixture
def quick_mlflow(monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")


def test_unreachable_trackers_are_one_warning_each_and_cost_the_writer_nothing(tmp_path, monkeypatch, quick_mlflow):
    path = run_dir(tmp_path)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.setenv("SWANLAB_LOG_DIR", str(blocker / "swanlog"))  # cannot be created
    lines = []
    writer = writer_with_trackers(path, lines)
    t0 = time.perf_counter()
    for step in range(1, 301):
        writer.write(record(step), echo=False)
    took = time.perf_counter() - t0
    writer.close()
    assert took < 0.5, took
    warnings = [l for l in lines if l.startswith("warning:")]
    assert len(warnings) == 2, lines
    assert any("experiment tracker mlflow stopped" in w and "ConnectionError" in w for w in warnings), warnings
    assert any("experiment tracker swanlab stopped" in w for w in warnings), warnings
    assert all("training goes on" in w for w in warnings)
    assert len((path / "metrics.jsonl").read_text().splitlines()) == 300  # the run directory is the record


def test_a_tracker_that_never_answers_is_left_behind_at_the_end(tmp_path, monkeypatch, quick_mlflow):
    """A server that accepts connections and never answers: writes stay free, and closing the writer waits the
    trackers' close budget, not the server's silence."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held = []
    threading.Thread(target=lambda: held.extend(listener.accept() for _ in range(4)), daemon=True).start()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{listener.getsockname()[1]}")
    monkeypatch.setattr(base, "CLOSE_BUDGET_S", 2.0)
    path = run_dir(tmp_path)
    lines = []
    writer = writer_with_trackers(path, lines, names=("mlflow",))
    t0 = time.perf_counter()
    for step in range(1, 201):
        writer.write(record(step), echo=False)
    assert time.perf_counter() - t0 < 0.5
    t0 = time.perf_counter()
    writer.close()
    assert 1.5 < time.perf_counter() - t0 < 6
    assert [l for l in lines if l.startswith("warning:")] == [
        "warning: mlflow did not finish sending within 2 s; what it lacks is in metrics.jsonl"], lines
    listener.close()
