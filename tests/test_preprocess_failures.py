"""A preprocessing run that fails ends the same way whatever the cause: one paragraph
on stderr, exit code 2, within seconds, and no partial dataset (no output folder, no temporary folder, no
manifest), no worker process and no thread left behind.

Each case used to end otherwise: a crash at exit after the paragraph (invalid UTF-8, a truncated
tokenizer.json), a hang with the workers as zombies (a full disk), a message that named neither the worker nor
its signal (a killed worker). The in-process cases go through `ms_llm.cli.main`, as `ms-llm` does; only the
crash at exit needs a process of its own."""
import contextlib
import errno
import json
import multiprocessing
import os
import signal
import threading
import time

import pytest

import ms_llm.data.preprocess as P
import ms_llm.data.sources as sources
from ms_llm.cli import main
from ms_llm.data.shards import ShardWriter

from conftest import SHAKESPEARE, ms_llm

DEADLINE_S = 20  # "within seconds", with room for a loaded machine; these failures used to hang for minutes


@pytest.fixture(autouse=True)
def _allocator_left_alone(monkeypatch):
    """`ms-llm preprocess` changes a process-wide allocator setting for good: not the test process's."""
    monkeypatch.setattr(P, "keep_large_arrays_off_the_heap", lambda *_: False)


def assert_one_paragraph(stderr, *phrases):
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert "Traceback" not in stderr and "Fatal Python error" not in stderr
    for phrase in phrases:
        assert phrase in lines[0], stderr


def assert_nothing_left(parent, out, threads_before=None):
    assert not os.path.exists(out)  # so no manifest either
    assert [n for n in os.listdir(parent) if ".preprocess-" in n] == []  # no temporary folder
    assert multiprocessing.active_children() == []  # every worker reaped
    if threads_before is not None:  # nothing of the run still runs (or waits) when the process exits
        assert set(threading.enumerate()) == threads_before


@contextlib.contextmanager
def deadline(seconds=DEADLINE_S):
    """Turn a hang into a failure (SIGALRM interrupts the main thread's waits)."""
    def expired(*_):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def text_files(folder, n, size):
    """n text files of `size` bytes cut from the bundled sample: documents of their own, tokenized in segments
    (whose results, 4 bytes per byte with the byte tokenizer, keep the workers busy sending)."""
    sample = open(SHAKESPEARE, "rb").read()
    folder.mkdir()
    for i in range(n):
        (folder / f"{i:02d}.txt").write_bytes((sample * (size // len(sample) + 1))[i:i + size])
    return str(folder)


def preprocess_cli(src, out, *extra):
    return main(["preprocess", "--input", src, "--output-dir", str(out), "--seq-length", "64", "--tokenizer", "byte",
                 "--workers", "2", *extra])


@pytest.mark.slow
@pytest.mark.parametrize("case", ["invalid_utf8", "truncated_tokenizer"])
def test_an_early_error_exits_2_with_nothing_after_its_paragraph(tmp_path, case):
    """A process of its own, for its exit: a daemon thread importing MindSpore (to warm up the MindRecord writer)
    was still running when the interpreter shut down, and MindSpore's import registered exit handlers then
    ('can't register atexit after shutdown', 'Fatal Python error: PyThreadState_Get', exit 134)."""
    corpus = tmp_path / "corpus.txt"
    sample = open(SHAKESPEARE, "rb").read()
    tokenizer = "byte"
    if case == "invalid_utf8":  # 1 MB in: the error comes while that import would still be running
        corpus.write_bytes(sample + b"\xff\xfe not UTF-8\n")
        phrases = (f"byte offset {len(sample):,} bytes b'\\xff\\xfe n' are not UTF-8", "Convert the file to UTF-8")
    else:
        pytest.importorskip("tokenizers")
        corpus.write_bytes(sample)
        tokenizer = str(tmp_path / "tokenizer.json")
        with open(tokenizer, "w") as f:
            f.write('{"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0')  # cut off mid-way
        phrases = ("tokenizer.json' is not a Hugging Face tokenizer.json", "--tokenizer")
    out = tmp_path / "ds"
    start = time.perf_counter()
    r = ms_llm("preprocess", "--input", str(corpus), "--output-dir", str(out), "--seq-length", "64", "--tokenizer",
               tokenizer, timeout=120)
    assert r.returncode == 2, r.stderr
    assert_one_paragraph(r.stderr, *phrases)
    assert time.perf_counter() - start < 60
    assert_nothing_left(tmp_path, out)


def test_invalid_utf8_in_process_leaves_no_thread_running(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"plain text\n" * 2000 + b"caf\xe9\n")
    threads = set(threading.enumerate())
    assert preprocess_cli(str(corpus), tmp_path / "ds") == 2
    assert_one_paragraph(capsys.readouterr().err, "byte offset 22,003 bytes b'\\xe9\\n' are not UTF-8")
    assert_nothing_left(tmp_path, tmp_path / "ds", threads)


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, "No space left on device"),
                                   RuntimeError("Exception thrown from dataset pipeline. [ERROR] No free disk to be "
                                                "used while writing mindrecord files, available free disk size: 0")],
                         ids=["ENOSPC", "mindrecord"])
def test_a_full_disk_ends_within_seconds_with_the_disk_full_paragraph(tmp_path, monkeypatch, capsys, error):
    """The workers were terminated while sending results, and ProcessPoolExecutor's shutdown then waited forever
    for the rest of a message (what an 8 MB tmpfs showed: nothing printed, workers zombies, minutes)."""
    monkeypatch.setattr(P, "SMALL_INPUT", 0)
    monkeypatch.setattr(P, "import_mindrecord", lambda: None)  # no shard gets written: spare the seconds it takes
    monkeypatch.setattr(sources, "SEGMENT", 1 << 20)  # results of 4 MB, several in flight

    def full_disk(self, samples):
        raise error

    monkeypatch.setattr(ShardWriter, "write", full_disk)
    out, corpus = tmp_path / "ds", text_files(tmp_path / "corpus", 2, 2_100_000)
    threads = set(threading.enumerate())
    with deadline():
        assert preprocess_cli(corpus, out) == 2
    err = capsys.readouterr().err
    assert_one_paragraph(err, f"the dataset for '{out}' could not be written to '{tmp_path}': the disk is full; it "
                              f"needs about", "MiB are free", "the partial dataset was removed")
    assert_nothing_left(tmp_path, out, threads)


def test_a_full_disk_when_writing_the_manifest(tmp_path, monkeypatch, capsys):
    class NoShards:  # not what this test is about (and MindRecord's import alone would take seconds)
        def __init__(self, *_):
            self.samples = 0

        def write(self, samples):
            self.samples += len(samples)

        def close(self):
            return [{"file": "train.mindrecord", "samples": self.samples}]

    def full_disk(*_, **__):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(P, "ShardWriter", NoShards)
    monkeypatch.setattr(P.json, "dump", full_disk)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(open(SHAKESPEARE, encoding="utf-8").read()[:50000])
    assert preprocess_cli(str(corpus), tmp_path / "ds") == 2
    assert_one_paragraph(capsys.readouterr().err, "the disk is full; it needs about")
    assert_nothing_left(tmp_path, tmp_path / "ds")


def test_a_killed_worker_ends_the_run_within_seconds_naming_it_and_its_signal(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(P, "SMALL_INPUT", 0)
    monkeypatch.setattr(P, "import_mindrecord", lambda: None)  # no shard gets written: spare the seconds it takes
    monkeypatch.setattr(sources, "BLOCK", 4096)  # many chunks: the victim still has work when it is killed
    src = tmp_path / "c.jsonl"
    text = open(SHAKESPEARE, encoding="utf-8").read()
    src.write_text("".join(json.dumps({"text": text[i:i + 300]}) + "\n" for i in range(0, 900_000, 300)))
    killed, real_write = [], ShardWriter.write

    def kill_a_worker_first(self, samples):  # what the out-of-memory killer does, mid-run
        if not killed:
            victim = multiprocessing.active_children()[0]
            os.kill(victim.pid, signal.SIGKILL)
            killed.append(victim.pid)
        return real_write(self, samples)

    monkeypatch.setattr(ShardWriter, "write", kill_a_worker_first)
    out = tmp_path / "ds"
    threads = set(threading.enumerate())
    with deadline():
        assert preprocess_cli(str(src), out) == 2
    assert_one_paragraph(capsys.readouterr().err, f"of 2 (pid {killed[0]}) was killed by SIGKILL",
                         "out-of-memory killer", "--workers", "the partial dataset was removed")
    assert_nothing_left(tmp_path, out, threads)
