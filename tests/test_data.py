import hashlib
import json
import os

import numpy as np
import pytest

import ms_llm.data.preprocess as P
from ms_llm.data.encode import Encoder
from ms_llm.data.loader import RankStream, TrainBatches, eval_batches
from ms_llm.data.manifest import load_manifest
from ms_llm.data.permutation import EXACT_MAX, Permutation
from ms_llm.data.preprocess import pack, preprocess
from ms_llm.data.split_index import SplitIndex, split_shards
from ms_llm.data.tokenizers import ByteTokenizer, from_spec
from ms_llm.errors import UserError

from conftest import SHAKESPEARE

QUIET = dict(log=lambda *_: None)


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def write_jsonl(path, n_docs, seed=0, field="text"):
    """Documents of varied length cut from the bundled sample (what the benchmark builds, smaller)."""
    text = open(SHAKESPEARE, encoding="utf-8").read()
    rng = np.random.default_rng(seed)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n_docs):
            start, length = int(rng.integers(0, len(text) - 3000)), int(rng.integers(20, 3000))
            f.write(json.dumps({field: text[start:start + length]}) + "\n")
    return str(path)


def read_all(dataset_dir, split):
    """Every sample of a split in order, read straight from its shard files."""
    import mindspore.dataset as ds

    m = load_manifest(dataset_dir)
    files = [os.path.join(dataset_dir, s["file"]) for s in split_shards(m, split)]
    data = ds.MindDataset(files, columns_list=["input_ids"], shuffle=False).batch(4096)
    return np.concatenate([b for (b,) in data.create_tuple_iterator(num_epochs=1, output_numpy=True)])


def reference_in_memory(source, out_dir, seq_length, val_fraction=0.1):
    """The in-memory preprocessing this project had before streaming (read whole, one array, one file per split),
    kept here as the reference the streamed output must equal bit for bit."""
    from mindspore.mindrecord import FileWriter

    content = open(source, encoding="utf-8").read()
    chars = sorted(set(content))
    index = {c: i for i, c in enumerate(chars)}
    tokens = np.concatenate([np.fromiter((index[c] for c in content), np.int32, len(content)),
                             np.array([len(chars)], np.int32)])
    n_val = int(round(len(tokens) * val_fraction))
    os.makedirs(out_dir)
    for name, toks in (("train", tokens[: len(tokens) - n_val]), ("val", tokens[len(tokens) - n_val:])):
        samples = pack(toks, seq_length)
        writer = FileWriter(os.path.join(out_dir, f"{name}.mindrecord"), shard_num=1, overwrite=True)
        writer.set_page_size(1 << 20)
        writer.set_header_size(1 << 20)
        writer.add_schema({"input_ids": {"type": "int32", "shape": [samples.shape[1]]}}, "packed_tokens")
        for start in range(0, len(samples), 8192):
            writer.write_raw_data([{"input_ids": row} for row in samples[start:start + 8192]])
        writer.commit()
    return tokens


def test_pack_overlaps_by_one_token():
    tokens = np.arange(10, dtype=np.int32)
    s = pack(tokens, 3)
    assert s.tolist() == [[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9]]
    assert pack(np.arange(3, dtype=np.int32), 3).shape == (0, 4)


def test_packer_on_a_stream_equals_pack_of_the_whole():
    from ms_llm.data.shards import Packer

    tokens = np.arange(1000, dtype=np.int32)
    p = Packer(7)
    pieces = [p.add(tokens[a:b]) for a, b in zip([0, 3, 4, 200, 513], [3, 4, 200, 513, 1000])]
    assert np.array_equal(np.concatenate(pieces), pack(tokens, 7))


@pytest.mark.slow  # preprocesses the 1 MB quickstart twice
def test_streamed_quickstart_is_bit_identical_to_the_in_memory_reference(tmp_path):
    """The quickstart's sample (one document): same token-tail split, same samples, same file bytes."""
    ref = str(tmp_path / "ref")
    tokens = reference_in_memory(SHAKESPEARE, ref, 64)
    m = preprocess(SHAKESPEARE, str(tmp_path / "new"), 64, "char", 0.1, **QUIET)
    assert m["split_method"] == "token tail of a single document"
    for name in ("train", "val"):
        (shard,) = m["splits"][name]["shards"]
        assert shard["file"] == f"{name}.mindrecord"
        for suffix in ("", ".db"):
            assert sha(os.path.join(ref, shard["file"] + suffix)) == sha(str(tmp_path / "new" / shard["file"]) + suffix)
    assert m["splits"]["train"]["tokens"] + m["splits"]["val"]["tokens"] == len(tokens)
    assert m["source"]["sha256"] == sha(SHAKESPEARE) and m["source"]["documents"] == 1


def test_preprocess_round_trip_through_mindrecord(dataset, corpus):
    m = load_manifest(dataset)
    assert m["seq_length"] == 32 and m["sample_length"] == 33
    assert m["tokenizer"]["kind"] == "char" and m["vocab_size"] == m["eod_id"] + 1
    text = open(corpus, encoding="utf-8").read()
    tok = from_spec(m["tokenizer"])
    stream = np.concatenate([tok.encode(text), [tok.eod_id]])
    n_val = int(round(len(stream) * 0.1))
    expected = pack(stream[: len(stream) - n_val], 32)
    assert m["splits"]["train"]["samples"] == len(expected)
    it = TrainBatches(dataset, m, "train", 1, shuffle=False)  # what training reads, in order
    got = np.concatenate([next(it).asnumpy() for _ in range(len(expected))])
    assert np.array_equal(got, expected)
    assert tok.decode(got[0]) == text[:33]
    assert m["source"]["sha256"] == sha(corpus)


@pytest.mark.slow  # starts worker processes
def test_workers_and_shard_boundaries_do_not_change_the_output(tmp_path, monkeypatch):
    """Many documents through 1 and 4 worker processes: identical shards (listed with checksums)."""
    monkeypatch.setattr(P, "SMALL_INPUT", 0)  # use worker processes even for this small corpus
    src = write_jsonl(tmp_path / "docs.jsonl", 200)
    out = {}
    for w in (1, 4):
        m = preprocess(src, str(tmp_path / f"w{w}"), 16, "byte", 0.1, workers=w, shard_mb=1, **QUIET)
        out[w] = {k: m[k] for k in ("splits", "stats", "max_token_id", "sources")}
    assert out[1] == out[4]
    shards = out[1]["splits"]["train"]["shards"]
    assert len(shards) > 1 and shards[1]["file"] == "train.00001.mindrecord"  # 1 MB shards: several
    for s in shards:
        assert sha(str(tmp_path / "w4" / s["file"])) == s["sha256"]
    # the shards read back as one split, in order: the same samples as packing the split's token stream
    m = load_manifest(str(tmp_path / "w1"))
    got = read_all(str(tmp_path / "w1"), "train")
    assert len(got) == m["splits"]["train"]["samples"] == sum(s["samples"] for s in shards)
    assert np.array_equal(got[1:, 0], got[:-1, -1])  # consecutive samples overlap by one token across shards


def test_memory_held_while_preprocessing_does_not_grow_with_the_input(tmp_path):
    """The two things whose size could follow the corpus (the peak RSS itself is measured by
    benchmarks/preprocess_throughput.py): the worker pool reads at most `window` chunks ahead of what it has
    handed back, and a shard's in-memory MindRecord index (~1.4 KB a row) is built when its split is closed,
    after the workers have stopped, not when the shard fills while they still run."""
    import mindspore.dataset as ds

    from ms_llm.data.shards import ShardWriter
    from ms_llm.data.workers import ordered_map

    pulled = [0]

    def chunks(n):
        for i in range(n):
            pulled[0] += 1
            yield b"x" * i

    ahead = []
    for k, (item, n) in enumerate(ordered_map(len, chunks(200), 2, os.getpid, (), window=6)):
        assert n == len(item) == k  # in input order
        ahead.append(pulled[0] - k)
    assert max(ahead) <= 6 + 1

    writer = ShardWriter(str(tmp_path), "train", 17, shard_bytes=17 * 4 * 100)  # 100 samples a shard
    writer.write(np.arange(250 * 17, dtype=np.int32).reshape(250, 17))
    full = ["train.mindrecord", "train.00001.mindrecord"]
    assert all((tmp_path / f).exists() and not (tmp_path / f"{f}.db").exists() for f in full)
    shards = writer.close()
    assert [(s["file"], s["samples"]) for s in shards] == list(zip(full + ["train.00002.mindrecord"], [100, 100, 50]))
    for s in shards:  # each index built and readable, as commit() would have made it
        assert oct(os.stat(tmp_path / f"{s['file']}.db").st_mode & 0o777) == "0o600"
        assert ds.MindDataset([str(tmp_path / s["file"])]).get_dataset_size() == s["samples"]


@pytest.mark.parametrize("kind", ["hashed", "tail"])
def test_the_overlap_sketch_is_let_go_before_the_indexes_are_built(tmp_path, monkeypatch, kind):
    """Closing a split builds its shards' MindRecord indexes in memory (~1.4 KB a row, 90 MB for a full shard); the
    overlap entry is measured first and the sketch freed, so its buffers do not lie under that peak."""
    import gc
    import weakref

    import ms_llm.data.shards as S
    from ms_llm.data.overlap import SplitOverlap

    sketches, alive = [], []

    def recorded(k):
        sketch = SplitOverlap(k)
        sketches.append(weakref.ref(sketch))
        return sketch

    def watched(path, build_index=S.build_index):
        gc.collect()
        alive.append([r() is not None for r in sketches])
        build_index(path)

    monkeypatch.setattr(P, "SplitOverlap", recorded)
    monkeypatch.setattr(S, "build_index", watched)
    if kind == "hashed":
        src = write_jsonl(tmp_path / "docs.jsonl", 60)
    else:
        src = str(tmp_path / "one.txt")
        with open(src, "w", encoding="utf-8") as f:
            f.write(open(SHAKESPEARE, encoding="utf-8").read()[:50_000])
    m = preprocess(src, str(tmp_path / "ds"), 16, "byte", 0.1, **QUIET)
    assert m["overlap"]["val_shingles"] > 0 and m["split_method"].startswith("token tail" if kind == "tail" else "doc")
    assert alive == [[False], [False]]  # one shard per split, no sketch alive at either


def test_documents_are_split_by_hash_and_adding_files_keeps_the_split(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", 300, seed=1)
    b = write_jsonl(tmp_path / "b.jsonl", 100, seed=2)
    m1 = preprocess(a, str(tmp_path / "one"), 64, "byte", 0.2, **QUIET)
    docs = [json.loads(line)["text"] for line in open(a, encoding="utf-8")]
    enc = Encoder(ByteTokenizer(), val_fraction=0.2)
    val_docs = [d for d in docs if enc.is_val(d)]
    assert m1["split_method"] == "documents by hash"
    assert m1["splits"]["val"]["documents"] == len(val_docs) and 30 < len(val_docs) < 90
    expected = np.concatenate([np.append(ByteTokenizer().encode(d), 256) for d in val_docs])
    val = read_all(str(tmp_path / "one"), "val")
    stream = np.concatenate([val[0], val[1:, 1:].reshape(-1)])  # undo the one-token overlap
    assert np.array_equal(stream, expected[: len(stream)])
    # a second file: a's documents stay where they were (its validation documents come first, unchanged)
    preprocess([a, b], str(tmp_path / "two"), 64, "byte", 0.2, **QUIET)
    val2 = read_all(str(tmp_path / "two"), "val")
    assert np.array_equal(val2[: len(val) - 1], val[:-1])


@pytest.mark.slow  # two preprocessing runs with their worker processes
def test_inputs_folders_globs_and_gzip(tmp_path):
    import gzip

    d = tmp_path / "corpus"
    (d / "sub").mkdir(parents=True)
    write_jsonl(d / "a.jsonl", 50, seed=3)
    plain = open(write_jsonl(tmp_path / "b.jsonl", 50, seed=4), "rb").read()
    with gzip.open(d / "sub" / "b.jsonl.gz", "wb") as f:
        f.write(plain)
    (d / "notes.csv").write_text("ignored: not a corpus suffix")
    m = preprocess(str(d), str(tmp_path / "ds"), 8, "byte", 0.1, **QUIET)
    assert [os.path.basename(s["path"]) for s in m["sources"]] == ["a.jsonl", "b.jsonl.gz"]
    assert m["source"]["documents"] == 100
    assert m["sources"][1]["sha256"] == sha(str(d / "sub" / "b.jsonl.gz"))  # checksum of the file as stored
    m2 = preprocess([str(d / "*.jsonl"), str(d / "sub" / "*.gz")], str(tmp_path / "ds2"), 8, "byte", 0.1, **QUIET)
    assert m2["splits"] == m["splits"]
    with pytest.raises(UserError, match="matches no files"):
        preprocess(str(tmp_path / "*.parquet"), str(tmp_path / "ds3"), 8, "byte", **QUIET)


def test_long_text_file_is_tokenized_in_segments_like_a_whole(tmp_path, monkeypatch):
    import ms_llm.data.sources as S

    text = open(SHAKESPEARE, encoding="utf-8").read()[:200_000]
    src = tmp_path / "long.txt"
    src.write_text(text, encoding="utf-8")
    whole = preprocess(str(src), str(tmp_path / "whole"), 32, "char", 0.1, **QUIET)
    monkeypatch.setattr(S, "SEGMENT", 10_000)
    cut = preprocess(str(src), str(tmp_path / "cut"), 32, "char", 0.1, **QUIET)
    assert [s["sha256"] for s in cut["splits"]["train"]["shards"]] == \
           [s["sha256"] for s in whole["splits"]["train"]["shards"]]


def test_stats_histogram_and_entropy(tmp_path):
    src = tmp_path / "d.jsonl"
    docs = [t for i in range(30) for t in ["ab" * (32 + i), "a" * (5 + i % 3), "b" * (300 + i), "abab" + "a" * (i % 3)]]
    src.write_text("\n".join(json.dumps({"text": t}) for t in docs))
    m = preprocess(str(src), str(tmp_path / "ds"), 4, "byte", 0.3, **QUIET)
    tr = m["stats"]["train"]
    assert sum(tr["doc_length_histogram"].values()) == m["splits"]["train"]["documents"]
    assert set(tr["doc_length_histogram"]) <= {"4-7", "64-127", "256-511"}
    assert 0 < tr["unigram_entropy_nats"] < np.log(3)  # 'a', 'b' and the end-of-document token


def test_rank_slices_are_disjoint_and_form_the_same_global_batch(dataset):
    m = load_manifest(dataset)
    single = TrainBatches(dataset, m, "train", 8, dp=1, rank=0, seed=7)
    ranks = [TrainBatches(dataset, m, "train", 4, dp=2, rank=r, seed=7) for r in range(2)]
    n = m["splits"]["train"]["samples"]
    steps = n // 8 + 5  # run past an epoch boundary
    for _ in range(steps):
        g = next(single).asnumpy()
        a, b = next(ranks[0]).asnumpy(), next(ranks[1]).asnumpy()
        rows = lambda x: sorted(map(tuple, x))  # noqa: E731
        assert not set(rows(a)) & set(rows(b))  # disjoint
        assert rows(np.concatenate([a, b])) == rows(g)  # same global batch whatever the rank count
    assert single.consumed == steps * 8 == ranks[0].consumed and single.epoch == 1


def test_epochs_reshuffle_and_resume_is_exact(dataset):
    m = load_manifest(dataset)
    n = m["splits"]["train"]["samples"]
    it = TrainBatches(dataset, m, "train", 4, seed=3)
    first = [next(it).asnumpy() for _ in range(2 * n // 4)]
    epoch0 = np.concatenate(first[: n // 4])
    assert len({tuple(r) for r in epoch0}) == len(epoch0)  # no sample twice within an epoch
    assert not np.array_equal(first[0], first[n // 4])  # epoch 1 is a new order
    resumed = TrainBatches(dataset, m, "train", 4, seed=3, consumed=4 * 7)
    assert all(np.array_equal(next(resumed).asnumpy(), first[7 + i]) for i in range(20))


def test_small_splits_keep_numpys_permutation_large_ones_use_a_bijection(monkeypatch):
    import ms_llm.data.permutation as perm

    # the quickstart's data order (and every existing run's) is numpy's permutation, unchanged
    assert np.array_equal(RankStream(5000, 1, 0, 1337).indices(0, 5000), np.random.default_rng([1337, 0]).permutation(5000))
    assert EXACT_MAX == 1 << 20
    monkeypatch.setattr(perm, "EXACT_MAX", 1000)  # the on-demand permutation, on a size a test can check whole
    n = 200_000 + 12_345
    p = Permutation(n, (3,))
    a = p(0, np.arange(n))
    assert a.min() == 0 and a.max() == n - 1 and len(np.unique(a)) == n  # a permutation of [0, n)
    assert not np.array_equal(a, p(1, np.arange(n)))  # a new one each epoch
    assert np.array_equal(a[77_000:77_100], p(0, np.arange(77_000, 77_100)))  # random access, no state
    assert abs(np.corrcoef(np.arange(n), a)[0, 1]) < 0.01  # well mixed


def test_split_index_maps_parts_of_files():
    shards = [{"file": "a", "samples": 10, "start": 0, "file_samples": 10},
              {"file": "b", "samples": 4, "start": 0, "file_samples": 6}]
    idx = SplitIndex("/d", shards)
    assert idx.num_samples == 14 and idx.files == ["/d/a", "/d/b"]
    assert idx(np.array([0, 9, 10, 13])).tolist() == [0, 9, 10, 13]
    val = SplitIndex("/d", [{"file": "b", "samples": 2, "start": 4, "file_samples": 6}])
    assert val(np.array([0, 1])).tolist() == [4, 5] and val.end == 6


def test_eval_batches_are_fixed_and_capped(dataset):
    m = load_manifest(dataset)
    val = eval_batches(dataset, m, 4, 10_000)
    assert len(val) == m["splits"]["val"]["samples"] // 4
    again = eval_batches(dataset, m, 4, 3)
    assert all(np.array_equal(a.asnumpy(), b.asnumpy()) for a, b in zip(val, again))


def test_jsonl_documents_are_joined_with_eod(tmp_path):
    src = tmp_path / "docs.jsonl"
    docs = [f"doc{i} " + "xyz" * (i % 7) for i in range(60)]
    src.write_text("\n".join(json.dumps({"body": d}) for d in docs))
    m = preprocess(str(src), str(tmp_path / "ds"), 4, "byte", 0.2, text_field="body", **QUIET)
    assert m["source"]["documents"] == 60 and m["eod_id"] == 256
    enc = Encoder(ByteTokenizer(), val_fraction=0.2)
    train_docs = [d for d in docs if not enc.is_val(d)]
    got = read_all(str(tmp_path / "ds"), "train")
    stream = np.concatenate([got[0], got[1:, 1:].reshape(-1)])
    first = list(train_docs[0].encode()) + [256]
    assert stream[: len(first)].tolist() == first  # the first document, then end-of-document


def test_manifest_problems_are_explained(tmp_path, dataset):
    with pytest.raises(UserError, match="manifest.json missing"):
        load_manifest(str(tmp_path))
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(UserError, match="cannot be read as JSON"):
        load_manifest(str(tmp_path))


def test_schema_1_manifests_still_load(tmp_path, dataset):
    """Datasets made before sharding (one `file` per split, no checksums) keep training."""
    import shutil

    old = tmp_path / "old"
    shutil.copytree(dataset, old)
    m = json.load(open(old / "manifest.json"))
    m["schema_version"] = 1
    for s in m["splits"].values():
        s["file"] = s.pop("shards")[0]["file"]
    (old / "manifest.json").write_text(json.dumps(m))
    m1 = load_manifest(str(old))
    assert split_shards(m1, "train")[0]["file"] == "train.mindrecord"
    assert np.array_equal(read_all(str(old), "train"), read_all(dataset, "train"))
