"""Data a user hands in, damaged: a JSONL corpus and a text corpus as preprocessing reads them (cut into chunks,
parsed and tokenized: a bad line is counted, never raised), and a preprocessed dataset's manifest.json and
MindRecord shards as training opens them (sizes and SHA-256 checked against the manifest, `ms-llm data info`).
Each reads or is one paragraph naming the file."""
import json
import os

from hypothesis import strategies as st

from fuzzing import ROOT, Property, as_test, damaged, json_text, lied, reads_or_refuses, write
from ms_llm.data.encode import Encoder
from ms_llm.data.sources import Source, expand_inputs
from ms_llm.data.tokenizers import ByteTokenizer, from_spec

DATASET = os.path.join(ROOT, "data", "shakespeare_char")  # tests/conftest.py makes it before any test runs
JSONL = b"".join(json.dumps(r).encode() + b"\n" for r in [
    {"text": "First Citizen: before we proceed"}, {"text": "any further, hear me speak.", "id": 2},
    {"text": "All: Speak, speak.\u00e9\u4e2d"}, {"text": ""}, {"text": "You are all resolved"}])
TEXT = open(os.path.join(ROOT, "data", "tinyshakespeare.txt"), "rb").read(2000)


def preprocess_reads(path):
    """What preprocessing does with an input file, short of writing shards: chunks, then each chunk's documents
    parsed and tokenized (the workers' part). Bad documents come back counted in `bad`."""
    encoder = Encoder(ByteTokenizer(), "text", 0.1)
    for source_index, source in enumerate(expand_inputs([path])):
        for chunk in Source(source).chunks(source_index):
            encoder(chunk)


def read_jsonl(folder, data):
    path = write(folder, "corpus.jsonl", data)
    return reads_or_refuses(lambda: preprocess_reads(path), "corpus.jsonl")


def read_text(folder, data):
    path = write(folder, "corpus.txt", data)
    return reads_or_refuses(lambda: preprocess_reads(path), "corpus.txt")


def dataset_copy(folder, manifest=None, damaged_file=None, data=None):
    """A dataset folder whose shards are links to the quickstart's, with its manifest (or `manifest` bytes) and
    one file replaced by `data`."""
    for name in os.listdir(DATASET):
        if name.endswith((".mindrecord", ".db")):
            os.symlink(os.path.join(DATASET, name), os.path.join(folder, name))
    with open(os.path.join(DATASET, "manifest.json"), "rb") as f:
        write(folder, "manifest.json", f.read() if manifest is None else manifest)
    if damaged_file:
        os.remove(os.path.join(folder, damaged_file))
        write(folder, damaged_file, data)
    return folder


def open_dataset(folder):
    from ms_llm.data.info import info
    from ms_llm.data.manifest import load_manifest
    from ms_llm.data.split_index import SplitIndex, split_shards

    manifest = load_manifest(folder)
    info(folder)
    from_spec(manifest["tokenizer"])
    for split in manifest["splits"]:
        SplitIndex(folder, split_shards(manifest, split))


def read_manifest(folder, data):
    dataset_copy(folder, manifest=data)
    return reads_or_refuses(lambda: open_dataset(folder), "manifest.json", folder)


def read_shard(folder, data):
    dataset_copy(folder, damaged_file="val.mindrecord.db", data=data)
    return reads_or_refuses(lambda: open_dataset(folder), "val.mindrecord.db")


with open(os.path.join(DATASET, "manifest.json"), "rb") if os.path.isdir(DATASET) else open(os.devnull, "rb") as _f:
    MANIFEST = json.loads(_f.read() or b"{}")
with open(os.path.join(DATASET, "val.mindrecord.db"), "rb") if os.path.isdir(DATASET) else open(os.devnull, "rb") as _f:
    SHARD_DB = _f.read(1 << 20)

PROPERTIES = {
    "JSONL corpus": Property(st.one_of(damaged(JSONL), lied([json.loads(x) for x in JSONL.splitlines()]).map(
        lambda docs: b"\n".join(json_text(d) for d in docs) if isinstance(docs, list) else json_text(docs))),
        read_jsonl),
    "text corpus": Property(damaged(TEXT), read_text),
    "dataset manifest.json": Property(st.one_of(damaged(json_text(MANIFEST)), lied(MANIFEST).map(json_text)),
                                      read_manifest),
    "MindRecord shard (.db index)": Property(damaged(SHARD_DB), read_shard),
}

test_jsonl_corpus = as_test(PROPERTIES["JSONL corpus"])
test_text_corpus = as_test(PROPERTIES["text corpus"])
test_dataset_manifest = as_test(PROPERTIES["dataset manifest.json"])
test_mindrecord_shard = as_test(PROPERTIES["MindRecord shard (.db index)"])
