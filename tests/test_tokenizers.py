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


def bpe_tokenizer(path, decoder=True, texts=("to be or not to be",) * 10):
    """A small byte-level BPE tokenizer.json, with the ByteLevel decoder that byte-level BPE needs (or without,
    to see what a tokenizer.json lacking one gets)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    t = Tokenizer(models.BPE(unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # as GPT-2's tokenizer.json has it
    if decoder:
        t.decoder = decoders.ByteLevel()
    t.train_from_iterator(list(texts), trainers.BpeTrainer(special_tokens=["<unk>", "<|endoftext|>"], show_progress=False,
                                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    t.save(str(path))
    return t


def test_hf_tokenizer_json_round_trip(tmp_path):
    t = bpe_tokenizer(tmp_path / "tokenizer.json")
    tok = build_tokenizer(str(tmp_path / "tokenizer.json"))
    assert tok.eod_id == t.token_to_id("<|endoftext|>") and tok.vocab_size == t.get_vocab_size()
    for text in ("to be", "to be or not to be", " naïve — ☃\n"):
        ids = tok.encode(text)
        assert from_spec(tok.spec()).decode(ids) == text
    assert [x.tolist() for x in tok.encode_batch(["to be", "or not"])] == [tok.encode("to be").tolist(),
                                                                          tok.encode("or not").tolist()]
    assert tok.round_trip_problem("to be or not to be") is None


def test_tokenizer_json_without_decoder_is_a_warning_at_preprocessing(tmp_path):
    """Decision: a warning, not a refusal. The ids (all that training reads) are right; only text decoded from
    them (generated samples) reads wrong, and a tokenizer.json whose pre-tokenizer round-trips without a decoder
    gets no warning at all."""
    from ms_llm.data.preprocess import preprocess

    bpe_tokenizer(tmp_path / "nodec.json", decoder=False)
    tok = build_tokenizer(str(tmp_path / "nodec.json"))
    assert tok.decode(tok.encode("to be")) == "to Ġbe"  # the old fixture tripped over this ("Ġto Ġbe" with a prefix space)
    corpus = tmp_path / "c.txt"
    corpus.write_text("to be or not to be, that is the question " * 40)
    logs = []
    m = preprocess(str(corpus), str(tmp_path / "ds"), 8, str(tmp_path / "nodec.json"), 0.1, log=logs.append)
    # (the repeated sentence also gets the splits' overlap warnings: only the decoder's is this test's)
    (warning,) = [line for line in logs if line.startswith("warning:") and "decod" in line]
    assert "has no decoder" in warning and "'to be or not" in warning and "ByteLevel" in warning
    assert m["splits"]["train"]["samples"] > 0  # the dataset is still built
    logs.clear()
    bpe_tokenizer(tmp_path / "dec.json")
    preprocess(str(corpus), str(tmp_path / "ds2"), 8, str(tmp_path / "dec.json"), 0.1, log=logs.append)
    assert not [line for line in logs if line.startswith("warning:") and "decod" in line]


def test_hf_end_of_document_comes_from_the_tokenizers_own_special_tokens(tmp_path):
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel()
    t.train_from_iterator(["hello world"] * 5, trainers.BpeTrainer(special_tokens=["<s>", "</s>", "<|im_end|>"],
                                                                        show_progress=False))
    t.save(str(tmp_path / "tokenizer.json"))
    assert build_tokenizer(str(tmp_path / "tokenizer.json")).eod_id == t.token_to_id("</s>")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<|im_end|>"}}))
    tok = build_tokenizer(str(tmp_path / "tokenizer.json"))
    assert tok.eod_id == t.token_to_id("<|im_end|>") and from_spec(tok.spec()).eod_id == tok.eod_id
    plain = Tokenizer(models.BPE())
    plain.train_from_iterator(["abc"], trainers.BpeTrainer(show_progress=False))
    plain.save(str(tmp_path / "none.json"))
    tok = build_tokenizer(str(tmp_path / "none.json"))  # no end token at all: one is appended
    assert tok.eod_id == plain.get_vocab_size() and tok.vocab_size == plain.get_vocab_size() + 1


def test_sentencepiece_model_round_trip(tmp_path):
    """A SentencePiece model trained here (the format Llama-2 and MindFormers ship), through preprocessing."""
    import io

    import sentencepiece as spm

    from ms_llm.data.manifest import load_manifest
    from ms_llm.data.preprocess import preprocess
    from ms_llm.data.tokenizers import SentencePieceTokenizer

    from conftest import SHAKESPEARE

    text = open(SHAKESPEARE, encoding="utf-8").read()[:100_000]
    model = io.BytesIO()
    # trained as Llama's was: BPE, byte fallback, no normalisation (so newlines survive)
    spm.SentencePieceTrainer.train(sentence_iterator=iter(text.split("\n")), model_writer=model, vocab_size=400,
                                   model_type="bpe", byte_fallback=True, normalization_rule_name="identity",
                                   remove_extra_whitespaces=False, minloglevel=2)
    path = tmp_path / "tokenizer.model"
    path.write_bytes(model.getvalue())
    tok = build_tokenizer(str(path))
    assert isinstance(tok, SentencePieceTokenizer) and tok.vocab_size == 400
    assert tok.eod_id == tok.sp.eos_id() == 2  # its own </s>
    for line in ("ROMEO: But soft, what light", "First Citizen:\nBefore we proceed any further, hear me speak.",
                 "naïve — ☃"):  # characters it never saw: byte fallback
        ids = tok.encode(line)
        assert ids.dtype == np.int32 and from_spec(tok.spec()).decode(ids) == line
    src = tmp_path / "c.txt"
    src.write_text(text, encoding="utf-8")
    m = preprocess(str(src), str(tmp_path / "ds"), 32, str(path), 0.1, log=lambda *_: None)
    assert m["tokenizer"]["kind"] == "sentencepiece" and m["vocab_size"] == 400
    again = from_spec(load_manifest(str(tmp_path / "ds"))["tokenizer"])
    assert again.decode(again.encode("to be or not")) == "to be or not"


def test_char_tokenizer_vectorised_encode_matches_a_lookup():
    text = "ROMEO:\nBut soft, what light through yonder window breaks? ☃"
    tok = CharTokenizer.train([text])
    assert tok.encode(text).tolist() == [tok.chars.index(c) for c in text]
    unsorted = CharTokenizer(list("zyx"))
    assert unsorted.encode("xyz").tolist() == [2, 1, 0]
    with pytest.raises(UserError, match="'Q' is not in this char tokenizer"):
        tok.encode("RQ")
