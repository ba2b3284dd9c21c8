import json
import os

import numpy as np
import pytest

from ms_llm.data.loader import TrainBatches, eval_batches
from ms_llm.data.manifest import load_manifest
from ms_llm.data.preprocess import pack, preprocess
from ms_llm.data.tokenizers import from_spec
from ms_llm.errors import UserError


def test_pack_overlaps_by_one_token():
    tokens = np.arange(10, dtype=np.int32)
    s = pack(tokens, 3)
    assert s.tolist() == [[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9]]
    assert pack(np.arange(3, dtype=np.int32), 3).shape == (0, 4)


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
    # read every train sample back in order
    it = TrainBatches(dataset, m, "train", 1, shuffle=False)
    got = np.concatenate([next(it).asnumpy() for _ in range(len(expected))])
    assert np.array_equal(got, expected)
    assert tok.decode(got[0]) == text[:33]
    import hashlib
    assert m["source"]["sha256"] == hashlib.sha256(open(corpus, "rb").read()).hexdigest()


def test_rank_slices_are_disjoint_and_form_the_same_global_batch(dataset):
    m = load_manifest(dataset)
    single = TrainBatches(dataset, m, "train", 8, dp=1, rank=0, seed=7)
    ranks = [TrainBatches(dataset, m, "train", 4, dp=2, rank=r, seed=7) for r in range(2)]
    n = m["splits"]["train"]["samples"]
    steps = n // 8 + 5  # run past an epoch boundary
    for _ in range(steps):
        g = next(single).asnumpy()
        a, b = next(ranks[0]).asnumpy(), next(ranks[1]).asnumpy()
        rows = lambda x: sorted(map(tuple, x))
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


def test_eval_batches_are_fixed_and_capped(dataset):
    m = load_manifest(dataset)
    val = eval_batches(dataset, m, 4, 10_000)
    assert len(val) == m["splits"]["val"]["samples"] // 4
    again = eval_batches(dataset, m, 4, 3)
    assert all(np.array_equal(a.asnumpy(), b.asnumpy()) for a, b in zip(val, again))


def test_preprocess_bad_inputs(tmp_path, dataset):
    empty = tmp_path / "empty.txt"
    empty.write_text("   \n")
    with pytest.raises(UserError, match="holds no text"):
        preprocess(str(empty), str(tmp_path / "o1"), 32, log=lambda *_: None)
    short = tmp_path / "short.txt"
    short.write_text("to be or not to be")
    with pytest.raises(UserError, match="fewer than one sample of seq_length \\+ 1 = 33"):
        preprocess(str(short), str(tmp_path / "o2"), 32, log=lambda *_: None)
    with pytest.raises(UserError, match="does not exist"):
        preprocess(str(tmp_path / "nope.txt"), str(tmp_path / "o3"), 32, log=lambda *_: None)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"txt": "no"}\n')
    with pytest.raises(UserError, match="line 2 has no string field 'text'"):
        preprocess(str(bad), str(tmp_path / "o4"), 4, log=lambda *_: None)
    # an existing dataset is never replaced without --overwrite, and stays readable
    before = open(os.path.join(dataset, "manifest.json")).read()
    with pytest.raises(UserError, match="already holds a dataset"):
        preprocess(str(short), dataset, 4, log=lambda *_: None)
    assert open(os.path.join(dataset, "manifest.json")).read() == before
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


def test_jsonl_documents_are_joined_with_eod(tmp_path):
    src = tmp_path / "docs.jsonl"
    src.write_text("\n".join(json.dumps({"body": d}) for d in ["abcabc", "cab", "bca"] * 5))
    m = preprocess(str(src), str(tmp_path / "ds"), 4, "byte", 0.2, text_field="body", log=lambda *_: None)
    assert m["source"]["documents"] == 15 and m["eod_id"] == 256
    it = TrainBatches(str(tmp_path / "ds"), load_manifest(str(tmp_path / "ds")), "train", 1, shuffle=False)
    first = next(it).asnumpy()[0].tolist()
    assert first[:5] == [97, 98, 99, 97, 98]
    assert next(it).asnumpy()[0].tolist()[2] == 256  # 'abcabc' then end-of-document


def test_manifest_problems_are_explained(tmp_path, dataset):
    with pytest.raises(UserError, match="manifest.json missing"):
        load_manifest(str(tmp_path))
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(UserError, match="cannot be read as JSON"):
        load_manifest(str(tmp_path))
