"""The splits measured against each other (ms_llm.data.overlap): the share of validation shingles found in
training (near-copies), streamed in fixed memory, and the divergence of the splits' token distributions; written
into the manifest by preprocessing and shown (measured when missing) by `ms-llm data info`."""
import json
import os

import numpy as np
import pytest

from conftest import SHAKESPEARE
from ms_llm.cli import main
from ms_llm.data import overlap
from ms_llm.data.overlap import SplitOverlap, divergence, shingle_hashes
from ms_llm.data.preprocess import preprocess

QUIET = {"log": lambda *_: None}


def direct_hashes(tokens, k):
    """The polynomial hash written out window by window (the reference for the doubling construction)."""
    out = []
    with np.errstate(over="ignore"):
        for i in range(len(tokens) - k + 1):
            x = np.uint64(0)
            for t in tokens[i:i + k]:
                x = x * overlap._BASE + np.uint64(int(t) + 1)
            x ^= x >> np.uint64(30)
            x *= np.uint64(0xBF58476D1CE4E5B9)
            x ^= x >> np.uint64(27)
            x *= np.uint64(0x94D049BB133111EB)
            x ^= x >> np.uint64(31)
            out.append(x)
    return np.array(out, np.uint64)


def shakespeare_ids(n):
    text = open(SHAKESPEARE, encoding="utf-8").read()[:n]
    table = {c: i for i, c in enumerate(sorted(set(text)))}
    return np.array([table[c] for c in text], np.int64)


@pytest.mark.parametrize("k", [1, 3, 8, 13, 32])
def test_shingle_hashes_are_the_polynomial_hash_of_each_window(k):
    t = np.random.default_rng(k).integers(0, 60, 120)
    assert np.array_equal(shingle_hashes(t, k), direct_hashes(t, k))


def exact_share(train, val, k):
    seen = {tuple(train[i:i + k]) for i in range(len(train) - k + 1)}
    return np.mean([tuple(val[i:i + k]) in seen for i in range(len(val) - k + 1)])


def test_a_near_copy_is_found_and_memory_stays_bounded_however_long_the_stream():
    ids = shakespeare_ids(56_000)
    train, clean = ids[:50_000], ids[50_000:]
    near = ids[20_000:30_000].copy()
    near[::100] = 7  # the same passage with a change every 100 characters: 68% of its 32-grams survive
    val = np.concatenate([clean, near])
    want = exact_share(train, val, 32)
    small = SplitOverlap(32, capacity=2048)  # far fewer than the 50k training shingles: the limit must drop
    for lo in range(0, len(train), 7000):  # fed in pieces: shingles that span two pieces still count
        small.add("train", train[lo:lo + 7000])
    small.add("val", val)
    share, sampled = small.share()
    assert len(small.kept["train"]) <= 2048 and len(small.kept["val"]) <= 2048
    assert small.limit["train"] < overlap._FULL and sampled > 300
    assert abs(share - want) < 0.06, (share, want)
    assert 0.4 < want < 0.5
    whole = SplitOverlap(32)
    whole.add("train", train)
    whole.add("val", val)
    assert whole.share()[0] == pytest.approx(want, abs=1e-12)  # no sampling below the capacity: exact
    assert whole.positions["train"] == len(train) - 31


class CopyingSketch(SplitOverlap):
    """The sketch as it was before its rewrite (pending pieces in a list; compaction by concatenation and np.unique, each
    step a copy): the reference the in-place one must equal, hash for hash."""

    def __init__(self, k, capacity=overlap.CAPACITY):
        super().__init__(k, capacity)
        self.kept_ = {"train": np.zeros(0, np.uint64), "val": np.zeros(0, np.uint64)}
        self.pending = {"train": [], "val": []}

    @property
    def kept(self):
        return self.kept_

    def add(self, split, tokens):
        tokens = np.asarray(tokens, np.int64)
        for lo in range(0, len(tokens), overlap.SLICE):
            part = np.concatenate([self.tail[split], tokens[lo:lo + overlap.SLICE]])
            self.tail[split] = part[len(part) - self.k + 1:] if len(part) >= self.k else part
            h = shingle_hashes(part, self.k)
            self.positions[split] += len(h)
            h = h[h < self.limit[split]]
            if len(h):
                self.pending[split].append(h)
                self.npending[split] += len(h)
                if self.npending[split] >= self.capacity:
                    self.compact(split)

    def compact(self, split):
        a = np.concatenate([self.kept_[split]] + self.pending[split])
        a = np.unique(a) if split == "train" else np.sort(a)
        self.pending[split], self.npending[split] = [], 0
        while len(a) > self.capacity:
            cut = a[len(a) // 2]
            a = a[a < cut]
            self.limit[split] = cut
        self.kept_[split] = a

    def share(self):
        for split in ("train", "val"):
            self.compact(split)
        limit = min(self.limit["train"], self.limit["val"])
        train = self.kept_["train"][self.kept_["train"] < limit]
        val = self.kept_["val"][self.kept_["val"] < limit]
        if not len(val) or not len(train):
            return None, len(val)
        pos = np.minimum(np.searchsorted(train, val), len(train) - 1)
        return float(np.mean(train[pos] == val)), int(len(val))


def test_the_in_place_sketch_keeps_exactly_what_the_copying_one_kept(monkeypatch):
    """Same limits, same kept hashes after every add, same entry: with repeats within and across the splits (train
    keeps distinct hashes, validation one per position), adds longer than a slice, and many compactions."""
    monkeypatch.setattr(overlap, "SLICE", 3000)
    rng = np.random.default_rng(5)
    text = rng.integers(0, 40, 20_000)  # documents cut from one text: the splits share shingles, and repeat them
    new, ref = SplitOverlap(4, capacity=700), CopyingSketch(4, capacity=700)
    compactions = 0
    for i in range(300):
        split = "val" if i % 4 == 0 else "train"
        start, n = int(rng.integers(0, len(text) - 8000)), int(rng.integers(1, 8000))
        piece = text[start:start + n] if i % 7 else rng.integers(0, 40, n)
        before = dict(ref.limit)
        new.add(split, piece)
        ref.add(split, piece)
        compactions += before != ref.limit
        assert new.limit == ref.limit and new.positions == ref.positions and new.npending == ref.npending
        for s in ("train", "val"):
            assert np.array_equal(new.kept[s], ref.kept_[s]), (i, s)
    assert compactions > 10 and max(ref.limit.values()) < overlap._FULL
    assert len(np.unique(ref.kept_["val"])) < len(ref.kept_["val"])  # validation kept repeats: the multiset case
    assert new.result() == ref.result()


@pytest.mark.parametrize("block", [1, 2, 3, 64, overlap.DEDUP_BLOCK])
def test_in_place_deduplication_equals_np_unique(block):
    rng = np.random.default_rng(block)
    for n, high in ((0, 5), (1, 5), (50, 4), (1000, 30), (1000, 2 ** 62), (5000, 700)):
        a = np.sort(rng.integers(0, high, n).astype(np.uint64))
        want = np.unique(a)
        count = overlap.dedup_sorted(a, block)
        assert count == len(want) and np.array_equal(a[:count], want), (n, high)


def test_compaction_works_in_place_in_one_block_of_memory():
    """The sketch's buffer is allocated once, and compacting it (sort, deduplicate, halve) allocates a few blocks of
    DEDUP_BLOCK hashes, less than one copy of what it holds: the copying sketch allocated three times what it held
    (its peak rose with the corpus until both splits had been compacted a few times)."""
    import tracemalloc

    capacity = 1 << 19
    sketch = SplitOverlap(8, capacity=capacity)
    compact, extra, held = sketch.compact, [], []

    def measured(split):
        held.append(8 * (sketch.nkept[split] + sketch.npending[split]))
        tracemalloc.reset_peak()
        at = tracemalloc.get_traced_memory()[0]
        compact(split)
        extra.append(tracemalloc.get_traced_memory()[1] - at)

    sketch.compact = measured
    rng = np.random.default_rng(0)
    tracemalloc.start()
    try:
        sketch.add("train", rng.integers(0, 50_000, 100))
        store = sketch.store["train"]
        for _ in range(10):
            sketch.add("train", rng.integers(0, 50_000, 600_000))
    finally:
        tracemalloc.stop()
    assert len(extra) >= 3 and sketch.store["train"] is store and sketch.nkept["train"] <= capacity
    assert all(e < min(h, 5 * 8 * overlap.DEDUP_BLOCK) for e, h in zip(extra, held)), (extra, held)


def test_preprocessing_gives_the_same_dataset_with_either_sketch(tmp_path, monkeypatch):
    """The whole dataset (manifest with its overlap entry, shards and their checksums) is the same with the in-place
    sketch as with the copying one, on a corpus that makes a small sketch compact and sample many times."""
    import ms_llm.data.preprocess as P

    src = tmp_path / "docs.jsonl"
    src.write_text("\n".join(json.dumps({"text": d}) for d in documents(120, 3)))
    out = {}
    for name, cls in (("in_place", SplitOverlap), ("copying", CopyingSketch)):
        monkeypatch.setattr(P, "SplitOverlap", lambda k, cls=cls: cls(k, capacity=300))
        m = preprocess(str(src), str(tmp_path / name), 16, "byte", 0.2, shard_mb=1, **QUIET)
        out[name] = {k: v for k, v in m.items() if k not in ("seconds", "created")}
    assert out["in_place"] == out["copying"]
    o = out["copying"]["overlap"]
    assert 0 < o["sampled_val_shingles"] < o["val_shingles"] / 10 and o["val_shingles_in_train"] > 0


def test_unrelated_text_of_one_kind_shares_no_shingles_and_diverges_little():
    ids = shakespeare_ids(300_000)
    s = SplitOverlap(32)
    s.add("train", ids[:270_000])
    s.add("val", ids[270_000:])
    r = s.result(np.bincount(ids[:270_000], minlength=70), np.bincount(ids[270_000:], minlength=70))
    assert r["val_shingles_in_train"] < 0.005 and r["unigram_kl_val_train_nats"] < 0.05
    assert overlap.warnings(r) == []


def test_divergence_of_token_distributions():
    same = divergence([100, 200, 300], [10, 20, 30])
    assert same["unigram_kl_val_train_nats"] < 1e-3 and same["val_tokens_unseen_in_train"] == 0
    other = divergence([100, 200, 300, 0], [30, 0, 0, 30])
    assert other["unigram_kl_val_train_nats"] > 1.0 and other["val_tokens_unseen_in_train"] == 0.5
    assert 0 < other["unigram_js_nats"] <= np.log(2)


def documents(n, seed):
    text = open(SHAKESPEARE, encoding="utf-8").read()
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(text) - 400, n)
    return [text[s:s + 400] for s in starts]


def test_preprocessing_writes_the_overlap_and_warns_about_near_copies(tmp_path):
    docs = documents(150, 1)
    clean = tmp_path / "clean.jsonl"
    clean.write_text("\n".join(json.dumps({"text": f"Document {i}\n{d}"}) for i, d in enumerate(docs)))
    leaky = tmp_path / "leaky.jsonl"  # every document twice, under another header: the hash split parts them
    leaky.write_text("\n".join(json.dumps({"text": f"Document {i}, copy {c}, 2024-05-{3 + 14 * c:02d}\n{d}"})
                               for i, d in enumerate(docs) for c in (1, 2)))
    logs = []
    m_clean = preprocess(str(clean), str(tmp_path / "c"), 32, "byte", 0.2, log=logs.append)
    assert m_clean["overlap"]["shingle_tokens"] == 32 and m_clean["overlap"]["val_shingles"] > 1000
    assert m_clean["overlap"]["val_shingles_in_train"] < 0.1  # random passages of one play overlap a little
    assert not any("warning" in l for l in logs)
    m_leaky = preprocess(str(leaky), str(tmp_path / "l"), 32, "byte", 0.2, log=logs.append)
    assert m_leaky["overlap"]["val_shingles_in_train"] > 0.6
    assert any(l.startswith("warning: ") and "near-copies" in l for l in logs)
    assert json.load(open(tmp_path / "l" / "manifest.json"))["overlap"] == m_leaky["overlap"]


def test_a_tail_of_other_text_is_measured_as_shift(tmp_path):
    text = open(SHAKESPEARE, encoding="utf-8").read()[:27_000]
    other = "".join(f"| step {i} | loss {4.0 / (i + 1):.4f} | lr 1.0e-03 | 3,412 tok/s |\n" for i in range(60))
    src = tmp_path / "shift.txt"
    src.write_text(text + other[:3000])
    logs = []
    m = preprocess(str(src), str(tmp_path / "s"), 32, "char", 0.1, log=logs.append)
    assert m["split_method"] == "token tail of a single document"
    assert m["overlap"]["unigram_kl_val_train_nats"] > overlap.SHIFT_WARN
    assert any("token distribution differs" in l for l in logs)


def test_data_info_measures_a_dataset_preprocessed_before_the_measure(tmp_path, capsys):
    src = tmp_path / "d.jsonl"
    src.write_text("\n".join(json.dumps({"text": d}) for d in documents(80, 2) * 2))  # exact duplicates: one split
    preprocess(str(src), str(tmp_path / "ds"), 32, "byte", 0.2, **QUIET)
    path = tmp_path / "ds" / "manifest.json"
    m = json.load(open(path))
    measured_then = m.pop("overlap")
    path.write_text(json.dumps(m))  # as an older version wrote it
    assert not main(["data", "info", str(tmp_path / "ds")])
    out = capsys.readouterr().out
    assert "(measured now from the samples, saved into manifest.json)" in out
    assert "% of the validation split's 32-token shingles occur in the training split" in out
    again = json.load(open(path))["overlap"]
    # the samples drop the remainder of each split that fills no sample: nearly the same streams
    assert abs(again["val_shingles_in_train"] - measured_then["val_shingles_in_train"]) < 0.02
    assert abs(again["unigram_kl_val_train_nats"] - measured_then["unigram_kl_val_train_nats"]) < 0.02
    assert not main(["data", "info", str(tmp_path / "ds")])
    assert "measured now" not in capsys.readouterr().out
    assert os.path.isfile(path)
