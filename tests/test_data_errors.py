import errno
import json
import multiprocessing
import os
import shutil

import pytest

import ms_llm.data.manifest as manifest_mod
import ms_llm.data.preprocess as P
from ms_llm.data.manifest import load_manifest
from ms_llm.data.preprocess import preprocess
from ms_llm.data.shards import ShardWriter
from ms_llm.errors import UserError

from conftest import ROOT, ms_llm, tiny_train_args

QUIET = dict(log=lambda *_: None)


def jsonl(path, lines):
    path.write_bytes(b"\n".join(x if isinstance(x, bytes) else json.dumps(x).encode() for x in lines) + b"\n")
    return str(path)


def good_docs(n):
    return [{"text": f"document number {i} " + "lorem ipsum " * (i % 9 + 1)} for i in range(n)]


def test_preprocess_bad_inputs(tmp_path, dataset):
    empty = tmp_path / "empty.txt"
    empty.write_text("   \n")
    with pytest.raises(UserError, match="holds no text"):
        preprocess(str(empty), str(tmp_path / "o1"), 32, **QUIET)
    short = tmp_path / "short.txt"
    short.write_text("to be or not to be")
    with pytest.raises(UserError, match="fewer than one sample of seq_length \\+ 1 = 33"):
        preprocess(str(short), str(tmp_path / "o2"), 32, **QUIET)
    with pytest.raises(UserError, match="does not exist"):
        preprocess(str(tmp_path / "nope.txt"), str(tmp_path / "o3"), 32, **QUIET)
    # an existing dataset is never replaced without --overwrite, and stays readable
    before = open(os.path.join(dataset, "manifest.json")).read()
    with pytest.raises(UserError, match="already holds a dataset"):
        preprocess(str(short), dataset, 4, **QUIET)
    assert open(os.path.join(dataset, "manifest.json")).read() == before
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()
    assert not [n for n in os.listdir(tmp_path) if ".preprocess-" in n]  # no temporary folder left behind


def test_bad_json_line_names_file_and_line_or_is_skipped(tmp_path):
    docs = good_docs(80)
    src = jsonl(tmp_path / "bad.jsonl", docs[:40] + [b'{"text": "unterminated'] + docs[40:60] + [{"txt": "x"}]
                + docs[60:])
    with pytest.raises(UserError, match=r"bad.jsonl' line 41 is not valid JSON \(Unterminated string.*--skip-bad"):
        preprocess(src, str(tmp_path / "o"), 8, "byte", **QUIET)
    logs = []
    m = preprocess(src, str(tmp_path / "o"), 8, "byte", skip_bad=True, log=logs.append)
    assert m["bad_lines"] == 2 and m["source"]["documents"] == 80
    assert any("skipped 2 bad line(s)" in x and "bad.jsonl:62: has no string field 'text'" in x for x in logs)


def test_undecodable_bytes_are_reported_with_file_and_offset(tmp_path):
    txt = tmp_path / "latin1.txt"
    txt.write_bytes(b"plain ascii text\n" * 20 + "caf\xe9 au lait".encode("latin-1") + b"\n" + b"more text\n" * 20)
    with pytest.raises(UserError, match=r"latin1.txt' byte offset 343 bytes b'\\xe9 au' are not UTF-8.*Convert the file"):
        preprocess(str(txt), str(tmp_path / "o"), 8, "byte", **QUIET)
    src = jsonl(tmp_path / "bytes.jsonl", good_docs(30) + [b'{"text": "caf\xe9"}'] + good_docs(30))
    with pytest.raises(UserError, match=r"bytes.jsonl' line 31 \(byte offset [\d,]+\) bytes b'\\xe9\"}' are not UTF-8"):
        preprocess(src, str(tmp_path / "o"), 8, "byte", **QUIET)
    m = preprocess(src, str(tmp_path / "o"), 8, "byte", skip_bad=True, **QUIET)
    assert m["bad_lines"] == 1


@pytest.mark.slow
def test_truncated_or_altered_shards_are_caught_before_training(tmp_path, dataset, monkeypatch):
    ds = tmp_path / "ds"
    shutil.copytree(dataset, ds)
    m = load_manifest(str(ds))  # first use: checksums verified and cached
    calls = []
    real = manifest_mod._sha256
    monkeypatch.setattr(manifest_mod, "_sha256", lambda p, progress: calls.append(p) or real(p, progress))
    load_manifest(str(ds))
    assert calls == []  # cached: opening a verified dataset again reads no file
    train = ds / m["splits"]["train"]["shards"][0]["file"]
    data = bytearray(train.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in the middle, same size
    train.write_bytes(bytes(data))
    with pytest.raises(UserError, match=r"'train.mindrecord' does not match manifest.json \(SHA-256 .* altered or "
                                        r"corrupted"):
        load_manifest(str(ds))
    train.write_bytes(bytes(data[: len(data) // 2]))
    with pytest.raises(UserError, match=r"'train.mindrecord' is [\d,]+ bytes but manifest.json records [\d,]+: the "
                                        r"file is truncated"):
        load_manifest(str(ds))
    # what a user sees: one paragraph and exit code 2 before anything compiles, not MindSpore's traceback
    r = ms_llm(*tiny_train_args(str(ds), tmp_path / "run"))
    assert r.returncode == 2 and "truncated" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "run").exists()


def test_interrupt_or_full_disk_leaves_no_partial_dataset_and_the_old_one_intact(tmp_path, monkeypatch):
    import ms_llm.data.sources as sources

    monkeypatch.setattr(P, "SMALL_INPUT", 0)  # with worker processes, which must be stopped too
    monkeypatch.setattr(sources, "BLOCK", 2048)  # many chunks, so the failure comes mid-way
    src = jsonl(tmp_path / "c.jsonl", good_docs(400))
    out = tmp_path / "ds"
    preprocess(src, str(out), 8, "byte", workers=2, **QUIET)
    before = {n: os.path.getsize(out / n) for n in os.listdir(out)}
    real_write = ShardWriter.write
    for exc, expect in ((KeyboardInterrupt(), KeyboardInterrupt),
                        (OSError(errno.ENOSPC, "No space left on device"), UserError)):
        calls = []

        def failing(self, samples, exc=exc, calls=calls):
            calls.append(1)
            if len(calls) == 3:
                raise exc
            return real_write(self, samples)

        monkeypatch.setattr(ShardWriter, "write", failing)
        with pytest.raises(expect) as info:
            preprocess(src, str(out), 8, "byte", overwrite=True, workers=2, **QUIET)
        if expect is UserError:
            assert "disk is full" in str(info.value) and "is unchanged" in str(info.value)
        assert {n: os.path.getsize(out / n) for n in os.listdir(out)} == before
        assert not [n for n in os.listdir(tmp_path) if ".preprocess-" in n or n.endswith(".old")]
        assert multiprocessing.active_children() == []
    load_manifest(str(out))  # the previous dataset still opens and verifies


def test_a_killed_runs_temporary_folder_is_removed_by_the_next_run(tmp_path):
    src = jsonl(tmp_path / "c.jsonl", good_docs(100))
    stale = tmp_path / ".ds.preprocess-999999999-abcd"  # no such process
    stale.mkdir()
    (stale / "train.mindrecord").write_bytes(b"partial")
    live = tmp_path / f".ds.preprocess-{os.getpid()}-efgh"  # a run still going (this process): left alone
    live.mkdir()
    preprocess(src, str(tmp_path / "ds"), 8, "byte", **QUIET)
    assert not stale.exists() and live.exists()


def test_progress_lines_when_not_a_terminal(tmp_path, monkeypatch):
    import ms_llm.data.progress as progress

    monkeypatch.setattr(progress.Progress.__init__, "__defaults__", (print, None, 0.0))  # a line per update
    src = jsonl(tmp_path / "c.jsonl", good_docs(200))
    logs = []
    preprocess(src, str(tmp_path / "ds"), 8, "byte", log=logs.append)
    lines = [x for x in logs if x.startswith("preprocess:")]
    assert lines and all(k in lines[-1] for k in ("100%", "MB/s", "docs/s", "tok/s", "ETA"))
    assert logs[-1].startswith("preprocessed '") and "200 document(s)" in logs[-1]


@pytest.mark.slow
def test_cli_preprocess_many_inputs_and_data_info(tmp_path):
    a = jsonl(tmp_path / "a.jsonl", good_docs(150))
    (tmp_path / "b.txt").write_text(open(os.path.join(ROOT, "data", "tinyshakespeare.txt")).read()[:20000])
    r = ms_llm("preprocess", "--input", a, str(tmp_path / "b.txt"), "--output-dir", str(tmp_path / "ds"),
               "--seq-length", "32", "--tokenizer", "byte", "--workers", "2")
    assert r.returncode == 0, r.stderr
    assert "preprocessed 2 files" in r.stdout and "151 document(s)" in r.stdout
    r = ms_llm("data", "info", str(tmp_path / "ds"), "--config", os.path.join(ROOT, "configs", "shakespeare_char.yaml"),
               "--set", "train.max_steps=100000")
    assert r.returncode == 0, r.stderr
    assert "unigram entropy (train)" in r.stdout and "document lengths (train)" in r.stdout
    assert "warning: the run repeats the training data" in r.stdout
    r = ms_llm("preprocess", "--input", a, "--output-dir", str(tmp_path / "x"), "--seq-length", "8", "--workers", "0")
    assert r.returncode == 2 and "--workers = 0 must be at least 1" in r.stderr
