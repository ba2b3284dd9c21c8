import numpy as np
import pytest

from ms_llm.data.tokenizers import ByteTokenizer, CharTokenizer, build_tokenizer, from_spec
from ms_llm.errors import UserError


def test_char_round_trip_and_spec():
    text = "ROMEO:\nBut soft, what light?"
    tok = CharTokenizer.train([text])
    ids = tok.encode(text)
    assert ids.dtype == np.int32 and tok.decode(ids) == text
    assert tok.vocab_size == len(set(text)) + 1 and tok.eod_id == len(set(text))
    again = from_spec(tok.spec())
    assert np.array_equal(again.encode(text), ids)
    with pytest.raises(UserError, match="not in this char tokenizer"):
        tok.encode("Z")


def test_byte_round_trip_unicode():
    tok = ByteTokenizer()
    text = "naïve — ☃"
    ids = tok.encode(text)
    assert ids.max() < 256 and tok.decode(ids) == text and tok.vocab_size == 257


def test_unknown_tokenizer_name():
    with pytest.raises(UserError, match="'wordpiece' is not a tokenizer"):
        build_tokenizer("wordpiece")


def test_hf_tokenizer_json_round_trip(tmp_path):
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    t = Tokenizer(models.BPE(unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.ByteLevel()
    t.train_from_iterator(["to be or not to be"] * 10, trainers.BpeTrainer(special_tokens=["<unk>", "<|endoftext|>"]))
    path = tmp_path / "tokenizer.json"
    t.save(str(path))
    tok = build_tokenizer(str(path))
    assert tok.eod_id == t.token_to_id("<|endoftext|>")
    ids = tok.encode("to be")
    assert from_spec(tok.spec()).decode(ids).strip() == "to be"
