"""A config, a dataset manifest, a tokenizer, a chat template or a config.json larger than such a file can be is
refused with its size before a byte of it is read: parsing it would cost memory and time in proportion. The files
here are sparse (their size costs no disk), and a refusal that read them would take seconds, not milliseconds."""
import json
import os
import time

import pytest

from ms_llm.errors import UserError


def sparse(path, size, head=b"{"):
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
    return str(path)


def refused_quickly(fn, path, size):
    t = time.perf_counter()
    with pytest.raises(UserError) as e:
        fn()
    took = time.perf_counter() - t
    msg = str(e.value)
    assert path in msg and f"{size:,} bytes" in msg and "\n" not in msg, msg
    assert took < 0.5, f"{took:.2f} s: the file was read before its size was checked"
    return msg


def test_a_config_over_its_limit(tmp_path):
    from ms_llm.config import load_config
    from ms_llm.config.loader import MAX_CONFIG_BYTES

    size = MAX_CONFIG_BYTES + 1
    path = sparse(tmp_path / "config.yaml", size, b"model:\n")
    refused_quickly(lambda: load_config(path), path, size)


def test_a_dataset_manifest_over_its_limit(tmp_path):
    from ms_llm.data.manifest import MAX_MANIFEST_BYTES, load_manifest

    size = MAX_MANIFEST_BYTES + 1
    path = sparse(tmp_path / "manifest.json", size)
    refused_quickly(lambda: load_manifest(str(tmp_path)), path, size)


def test_a_tokenizer_json_and_a_sentencepiece_model_over_their_limit(tmp_path):
    from ms_llm.data.tokenizers import MAX_TOKENIZER_BYTES, build_tokenizer

    size = MAX_TOKENIZER_BYTES + 1
    path = sparse(tmp_path / "tokenizer.json", size)
    refused_quickly(lambda: build_tokenizer(path), path, size)
    pytest.importorskip("sentencepiece")
    model = sparse(tmp_path / "tokenizer.model", size, b"\x0a")
    refused_quickly(lambda: build_tokenizer(model), model, size)


def test_a_chat_template_and_a_tokenizer_config_over_their_limit(tmp_path):
    from ms_llm.data.templates import MAX_TEMPLATE_BYTES, MAX_TOKENIZER_CONFIG_BYTES, find_template

    template = sparse(tmp_path / "chat_template.jinja", MAX_TEMPLATE_BYTES + 1, b"{{ x }}")
    refused_quickly(lambda: find_template(None, template), template, MAX_TEMPLATE_BYTES + 1)
    folder = tmp_path / "tok"
    folder.mkdir()
    config = sparse(folder / "tokenizer_config.json", MAX_TOKENIZER_CONFIG_BYTES + 1)
    refused_quickly(lambda: find_template(str(folder / "tokenizer.json")), config, MAX_TOKENIZER_CONFIG_BYTES + 1)


def test_a_hugging_face_config_json_over_its_limit(tmp_path):
    from ms_llm.interop.huggingface import MAX_HF_CONFIG_BYTES, read_hf_config

    path = sparse(tmp_path / "config.json", MAX_HF_CONFIG_BYTES + 1)
    refused_quickly(lambda: read_hf_config(str(tmp_path)), path, MAX_HF_CONFIG_BYTES + 1)


def test_files_just_under_the_limits_are_still_read(tmp_path):
    """The limits refuse only what no such file is: the quickstart's manifest, padded with whitespace to just
    under the limit, still loads."""
    from ms_llm.data.manifest import MAX_MANIFEST_BYTES, read_manifest
    from conftest import QUICKSTART_DATA

    with open(os.path.join(QUICKSTART_DATA, "manifest.json"), "rb") as f:
        text = f.read()
    (tmp_path / "manifest.json").write_bytes(text + b" " * (MAX_MANIFEST_BYTES - len(text)))
    assert read_manifest(str(tmp_path))["vocab_size"] == json.loads(text)["vocab_size"]
