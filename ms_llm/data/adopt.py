"""`ms-llm data adopt DIR --tokenizer T --seq-length S`: a manifest for MindRecord files made elsewhere
(MindFormers' preprocessing, for one), so they train without being converted.

The files must hold an `input_ids` column of S+1 int32 tokens per row (other columns, such as
attention_mask, are ignored). Every row is scanned once: sample counts, the largest id (checked against the
tokenizer's vocabulary), token statistics, and the SHA-256 of every file, so the usual first-use checks
apply afterwards. The data files are never modified: only `manifest.json` is written next to them.
"""
import datetime
import json
import os
import re

import numpy as np

from ms_llm.data.manifest import MANIFEST, SCHEMA_VERSION
from ms_llm.data.progress import Progress
from ms_llm.data.stats import SplitStats
from ms_llm.data.tokenizers import build_tokenizer
from ms_llm.errors import UserError
from ms_llm.fileio import atomic_write_bytes, sha256_file

SCAN_BATCH = 4096


def find_mindrecords(directory):
    """MindRecord data files in `directory`: name.mindrecord, name.mindrecord0..N (MindFormers' shards), each
    with its .db index; in natural order (mindrecord2 before mindrecord10)."""
    if not os.path.isdir(directory):
        raise UserError(f"'{directory}' is not a folder. Give the folder that holds the .mindrecord files.")
    names = [n for n in os.listdir(directory) if re.search(r"\.mindrecord\d*$", n)
             and os.path.isfile(os.path.join(directory, n + ".db"))]
    if not names:
        raise UserError(f"'{directory}' holds no MindRecord files (*.mindrecord or *.mindrecord<N>, each with its .db "
                        f"index). Point `ms-llm data adopt` at the folder MindFormers' preprocessing wrote.")
    key = lambda n: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", n)]  # noqa: E731
    return sorted(names, key=key)


def file_rows(path):
    """Rows of this one file (FileReader.len() counts every file of a MindFormers shard set)."""
    import mindspore.dataset as ds

    return ds.MindDataset([path], columns_list=["input_ids"]).get_dataset_size()


def scan_file(path, width, vocab_size, stats, progress):
    """Rows of `path` (checking the input_ids column), with token statistics added to `stats`."""
    import mindspore.dataset as ds
    from mindspore.mindrecord import FileReader

    reader = FileReader(path)
    schema = reader.schema()
    reader.close()
    rows = file_rows(path)
    col = schema.get("input_ids")
    name = os.path.basename(path)
    if col is None:
        raise UserError(f"'{name}' has no input_ids column (its columns: {', '.join(schema)}). `data adopt` reads "
                        f"token ids from a column named input_ids.")
    if col.get("type") not in ("int32", "int64"):
        raise UserError(f"'{name}': input_ids is {col.get('type')}, not int32/int64 token ids.")
    shape = col.get("shape") or [-1]
    if shape not in ([-1], [width]):
        raise UserError(f"'{name}': input_ids rows hold {shape[0]} tokens, but --seq-length {width - 1} needs "
                        f"{width} (seq_length + 1). Pass --seq-length {shape[0] - 1}.")
    data = ds.MindDataset([path], columns_list=["input_ids"], shuffle=False)
    count = 0
    for (batch,) in data.batch(SCAN_BATCH).create_tuple_iterator(num_epochs=1, output_numpy=True):
        if batch.ndim != 2 or batch.shape[1] != width:
            raise UserError(f"'{name}': row {count + 1} has {batch.shape[-1]} tokens, but --seq-length {width - 1} "
                            f"needs {width} (seq_length + 1) in every row.")
        lo, hi = int(batch.min()), int(batch.max())
        if lo < 0 or hi >= vocab_size:
            bad = hi if hi >= vocab_size else lo
            raise UserError(f"'{name}' holds token id {bad}, outside the tokenizer's vocabulary [0, {vocab_size}): the "
                            f"files were made with another tokenizer. Pass the tokenizer they were made with.")
        stats.add_tokens(batch[:, 1:].reshape(-1).astype(np.int64))  # every token once: rows overlap by one
        count += len(batch)
        progress.update(len(batch))
    if count != rows:
        raise UserError(f"'{name}': its header lists {rows} rows but {count} could be read. The file is damaged.")
    return count


def adopt(directory, tokenizer, seq_length, val_fraction=0.0, overwrite=False, log=print):
    if os.path.exists(os.path.join(directory, MANIFEST)) and not overwrite:
        raise UserError(f"'{directory}' already has a manifest.json. Pass --overwrite to replace it (the data files "
                        f"are never touched).")
    if tokenizer == "char":
        raise UserError("--tokenizer char builds its vocabulary from a text corpus, which adopted files do not have. "
                        "Pass the tokenizer.json / tokenizer.model the files were made with (or byte).")
    if not 0 <= val_fraction < 1:
        raise UserError(f"--val-fraction = {val_fraction} must be in [0, 1).")
    names = find_mindrecords(directory)
    tok = build_tokenizer(tokenizer)
    width = seq_length + 1
    total = sum(file_rows(os.path.join(directory, n)) for n in names)
    stats = SplitStats(tok.vocab_size)
    progress = Progress(total, f"scanning '{directory}'", log)
    files = []
    try:
        for n in names:
            path = os.path.join(directory, n)
            rows = scan_file(path, width, tok.vocab_size, stats, progress)
            files.append({"file": n, "samples": rows, "bytes": os.path.getsize(path), "sha256": sha256_file(path),
                          "db_bytes": os.path.getsize(path + ".db"), "db_sha256": sha256_file(path + ".db")})
    finally:
        progress.close()
    n_total = sum(f["samples"] for f in files)
    n_val = int(round(n_total * val_fraction))
    train, val = split_tail(files, n_total - n_val)
    st = stats.to_dict()
    manifest = {
        "schema_version": SCHEMA_VERSION, "seq_length": seq_length, "sample_length": width,
        "tokenizer": tok.spec(), "vocab_size": tok.vocab_size, "eod_id": tok.eod_id, "max_token_id": stats.max_id,
        "splits": {"train": {"samples": n_total - n_val, "tokens": (n_total - n_val) * seq_length, "documents": None,
                             "shards": train},
                   "val": {"samples": n_val, "tokens": n_val * seq_length, "documents": None, "shards": val}},
        "split_method": f"adopted: the last {val_fraction} of the samples" if n_val else "adopted: no validation",
        "stats": {"all": {"unigram_entropy_nats": st["unigram_entropy_nats"]}},
        "source": {"adopted": os.path.abspath(directory), "files": len(files), "documents": None},
        "val_fraction": val_fraction,
        "created": datetime.datetime.now().isoformat(timespec="seconds"),
    }
    atomic_write_bytes(os.path.join(directory, MANIFEST), json.dumps(manifest, indent=1).encode())
    log(f"adopted '{directory}': {len(files)} file(s), {n_total:,} samples of {width} tokens (largest id "
        f"{stats.max_id}, vocab {tok.vocab_size}) → {n_total - n_val:,} train / {n_val:,} val; wrote manifest.json")
    return manifest


def split_tail(files, n_train):
    """Shard entries of the first n_train samples (train) and the rest (val), cutting a file where needed."""
    train, val, seen = [], [], 0
    for f in files:
        n = f["samples"]
        cut = min(max(n_train - seen, 0), n)
        if cut:
            train.append(dict(f, samples=cut, start=0, file_samples=n))
        if n - cut:
            val.append(dict(f, samples=n - cut, start=cut, file_samples=n))
        seen += n
    return train, val
