import hashlib
import os

import numpy as np
import pytest

from ms_llm.data.adopt import adopt
from ms_llm.data.loader import TrainBatches, eval_batches
from ms_llm.data.manifest import load_manifest
from ms_llm.data.tokenizers import build_tokenizer
from ms_llm.errors import UserError

from conftest import SHAKESPEARE, ms_llm


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    """`ms-llm tokenizer train` on the bundled sample, as a user without a published tokenizer would."""
    out = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    r = ms_llm("tokenizer", "train", "--input", SHAKESPEARE, "--vocab-size", "600", "--output", str(out))
    assert r.returncode == 0, r.stderr
    assert "wrote" in r.stdout and "<|endoftext|> = 0" in r.stdout
    return str(out)


@pytest.mark.slow
def test_tokenizer_train_writes_a_byte_level_bpe_that_round_trips(bpe, tmp_path):
    tok = build_tokenizer(bpe)
    assert tok.vocab_size == 600 and tok.eod_id == 0 and tok.tok.decoder is not None
    for text in ("ROMEO:\nBut soft, what light", "naïve ☃ — never seen bytes\t\n"):
        assert tok.decode(tok.encode(text)) == text  # byte-level: no unknown token, exact round trip
    assert len(tok.encode("the king and the queen")) < len("the king and the queen") / 2  # it learned merges
    r = ms_llm("tokenizer", "train", "--input", SHAKESPEARE, "--vocab-size", "600", "--output", bpe)
    assert r.returncode == 2 and "already exists" in r.stderr


def write_mindformers_like(directory, rows, width, vocab, shards=2, seed=0):
    """What MindFormers' preprocessing writes: input_ids of seq_length+1 (variable-length schema), another
    column beside it, a shard set name.mindrecord0..N."""
    from mindspore.mindrecord import FileWriter

    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    data = rng.integers(0, vocab, (rows, width)).astype(np.int32)
    w = FileWriter(os.path.join(directory, "wiki.mindrecord"), shard_num=shards, overwrite=True)
    w.add_schema({"input_ids": {"type": "int32", "shape": [-1]}, "attention_mask": {"type": "int32", "shape": [-1]}},
                 "mindformers")
    w.write_raw_data([{"input_ids": r, "attention_mask": np.ones(width, np.int32)} for r in data])
    w.commit()
    return data


def checksums(directory):
    return {n: hashlib.sha256(open(os.path.join(directory, n), "rb").read()).hexdigest()
            for n in sorted(os.listdir(directory)) if n != "manifest.json"}


@pytest.mark.slow
def test_adopt_existing_mindrecords_reads_them_in_order(bpe, tmp_path):
    d = str(tmp_path / "mf")
    data = write_mindformers_like(d, 600, 33, 600)
    before = checksums(d)
    m = adopt(d, bpe, 32, val_fraction=0.1, log=lambda *_: None)
    assert checksums(d) == before  # the data files are never modified
    assert m["splits"]["train"]["samples"] == 540 and m["splits"]["val"]["samples"] == 60
    assert m["max_token_id"] == int(data[:, 1:].max()) and m["tokenizer"]["kind"] == "hf"
    assert 0 < m["stats"]["all"]["unigram_entropy_nats"] <= np.log(600)
    m = load_manifest(d)  # checksums recorded by the scan, verified like any dataset
    # the shard set reads back in order; validation is the tail of the last file
    it = TrainBatches(d, m, "train", 20, shuffle=False)
    assert np.array_equal(np.concatenate([next(it).asnumpy() for _ in range(27)]), data[:540])
    val = eval_batches(d, m, 20, 100)
    assert np.array_equal(np.concatenate([v.asnumpy() for v in val]), data[540:])
    # training on an adopted dataset (20 steps, through `ms-llm train`) is
    # tests/test_interop.py::test_converted_config_trains_20_steps_on_an_adopted_mindformers_mindrecord


@pytest.mark.slow
def test_adopt_refuses_what_would_not_train(bpe, tmp_path):
    d = str(tmp_path / "mf")
    write_mindformers_like(d, 50, 33, 600)
    with pytest.raises(UserError, match=r"row 1 has 33 tokens, but --seq-length 64 needs 65"):
        adopt(d, bpe, 64, log=lambda *_: None)
    with pytest.raises(UserError, match=r"holds token id \d+, outside the tokenizer's vocabulary \[0, 257\)"):
        adopt(d, "byte", 32, log=lambda *_: None)
    with pytest.raises(UserError, match="holds no MindRecord files"):
        adopt(str(tmp_path), bpe, 32, log=lambda *_: None)
    assert not os.path.exists(os.path.join(d, "manifest.json"))
    adopt(d, bpe, 32, log=lambda *_: None)
    with pytest.raises(UserError, match="already has a manifest.json"):
        adopt(d, bpe, 32, log=lambda *_: None)
