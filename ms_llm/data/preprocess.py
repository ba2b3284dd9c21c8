"""Text / JSONL → tokens → documents joined by an end-of-document token → packed samples of
`seq_length + 1` int32 tokens → MindRecord (train and val) + `manifest.json`.

Sample i holds tokens [i*T, i*T + T + 1): consecutive samples overlap by one token so that every token
of the split is a prediction target exactly once. The validation split is the last `val_fraction` of the
token stream (as nanoGPT does), so train and val never share text.
"""
import datetime
import json
import os
import shutil
import tempfile

import numpy as np

from ms_llm.data.manifest import MANIFEST, SCHEMA_VERSION, SPLIT_FILES
from ms_llm.data.tokenizers import build_tokenizer
from ms_llm.errors import UserError
from ms_llm.fileio import sha256_file

WRITE_CHUNK = 8192  # samples per write_raw_data call
SMALL = 1 << 30


def read_documents(path, text_field="text"):
    """A list of document strings: a JSONL file gives one per line, any other file is one document."""
    if not os.path.isfile(path):
        raise UserError(f"data source '{path}' does not exist. Set data.source (or --input) to a text or JSONL file.")
    try:
        with open(path, encoding="utf-8") as f:
            content = f.read()
    except UnicodeDecodeError as e:
        raise UserError(f"data source '{path}' is not UTF-8 text (byte {e.start}). Convert it to UTF-8 first.") from None
    except OSError as e:
        raise UserError(f"data source '{path}' cannot be read ({e.strerror}). Check its permissions.") from None
    if not path.endswith((".jsonl", ".json")):
        return [content] if content.strip() else []
    docs = []
    for n, line in enumerate(content.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"data source '{path}' line {n} is not valid JSON ({e.msg}). Each line of a JSONL file "
                            f"must be one object such as {{\"{text_field}\": \"...\"}}.") from None
        if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
            raise UserError(f"data source '{path}' line {n} has no string field '{text_field}'. Set data.text_field "
                            f"(or --text-field) to the key that holds the text.")
        if record[text_field]:
            docs.append(record[text_field])
    return docs


def pack(tokens, seq_length):
    """Samples of seq_length+1 tokens with stride seq_length (the last partial one is dropped)."""
    n = (len(tokens) - 1) // seq_length
    if n <= 0:
        return np.zeros((0, seq_length + 1), np.int32)
    windows = np.lib.stride_tricks.sliding_window_view(tokens[: n * seq_length + 1], seq_length + 1)
    return np.ascontiguousarray(windows[::seq_length], dtype=np.int32)


def write_mindrecord(path, samples):
    from mindspore.mindrecord import FileWriter

    writer = FileWriter(path, shard_num=1, overwrite=True)
    if samples.nbytes < SMALL:  # the 32 MiB page + 16 MiB header defaults pad a small split to 50 MB on disk
        writer.set_page_size(1 << 20)
        writer.set_header_size(1 << 20)
    writer.add_schema({"input_ids": {"type": "int32", "shape": [samples.shape[1]]}}, "packed_tokens")
    for start in range(0, len(samples), WRITE_CHUNK):
        writer.write_raw_data([{"input_ids": row} for row in samples[start:start + WRITE_CHUNK]])
    writer.commit()


def preprocess(source, output_dir, seq_length, tokenizer="char", val_fraction=0.1, text_field="text",
               overwrite=False, log=print):
    """Build the dataset in a temporary folder next to `output_dir`, then move it into place.

    An existing dataset is only replaced when `overwrite` is set, and only after the new one is complete.
    Returns the manifest dict.
    """
    if os.path.exists(os.path.join(output_dir, MANIFEST)) and not overwrite:
        raise UserError(f"'{output_dir}' already holds a dataset (manifest.json). Choose another output folder, "
                        f"or pass --overwrite to replace it.")
    docs = read_documents(source, text_field)
    if not docs:
        raise UserError(f"data source '{source}' holds no text (empty file or no non-empty '{text_field}' fields). "
                        f"Point data.source at a corpus with content.")
    tok = build_tokenizer(tokenizer, docs)
    parts = []
    for d in docs:
        parts.append(tok.encode(d))
        parts.append(np.array([tok.eod_id], np.int32))
    tokens = np.concatenate(parts)
    n_val = int(round(len(tokens) * val_fraction))
    splits = {"train": tokens[: len(tokens) - n_val], "val": tokens[len(tokens) - n_val:]}
    samples = {name: pack(toks, seq_length) for name, toks in splits.items()}
    for name, s in samples.items():
        if len(s) == 0:
            raise UserError(f"data source '{source}' is too short: its {name} split has {len(splits[name])} tokens, "
                            f"fewer than one sample of seq_length + 1 = {seq_length + 1}. Use a longer corpus, a "
                            f"smaller model.seq_length, or a different data.val_fraction.")
    parent = os.path.dirname(os.path.abspath(output_dir)) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".preprocess-", dir=parent)
    os.chmod(tmp, 0o755)
    try:
        for name, s in samples.items():
            write_mindrecord(os.path.join(tmp, SPLIT_FILES[name]), s)
        manifest = {
            "schema_version": SCHEMA_VERSION,
            "seq_length": seq_length,
            "sample_length": seq_length + 1,
            "tokenizer": tok.spec(),
            "vocab_size": tok.vocab_size,
            "eod_id": tok.eod_id,
            "max_token_id": int(tokens.max()),
            "splits": {name: {"file": SPLIT_FILES[name], "samples": int(len(s)), "tokens": int(len(splits[name]))}
                       for name, s in samples.items()},
            "source": {"path": os.path.abspath(source), "sha256": sha256_file(source),
                       "bytes": os.path.getsize(source), "documents": len(docs)},
            "val_fraction": val_fraction,
            "created": datetime.datetime.now().isoformat(timespec="seconds"),
        }
        with open(os.path.join(tmp, MANIFEST), "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=1)
        if os.path.exists(output_dir):
            old = output_dir.rstrip("/") + ".old"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(output_dir, old)
            os.replace(tmp, output_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, output_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"preprocessed '{source}': {len(docs)} document(s), {len(tokens):,} tokens, vocab {tok.vocab_size} "
        f"({tok.kind}) → {manifest['splits']['train']['samples']:,} train / {manifest['splits']['val']['samples']:,} "
        f"val samples of {seq_length + 1} tokens in '{output_dir}'")
    return manifest
