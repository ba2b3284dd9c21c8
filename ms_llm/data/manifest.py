"""The dataset manifest: what a preprocessed folder holds and how it was made.

Schema 2 lists every shard of a split with its sample count, size and SHA-256 (and those of its `.db`
index). Opening a dataset checks sizes every time (a truncated file is caught in milliseconds) and checksums
the first time a dataset is used, caching the result per file (size + modification time), so a damaged file
is refused before training with one paragraph instead of MindSpore's pipeline traceback. Schema 1 (one file
per split, no checksums) is still read.
"""
import hashlib
import json
import os

from ms_llm.data.blend import check_blend, combine
from ms_llm.data.split_index import split_shards
from ms_llm.errors import UserError
from ms_llm.fileio import atomic_write_bytes, json_kind, read_user_json

MANIFEST = "manifest.json"
SCHEMA_VERSION = 2
READABLE_SCHEMAS = (1, 2)
TOKENIZER_CARRIES = {"char": "vocab", "hf": "json", "sentencepiece": "model"}
REQUIRED = ("schema_version", "seq_length", "tokenizer", "vocab_size", "splits")
VERIFIED = ".verified.json"
HASH_BLOCK = 1 << 22
# A manifest is a few KiB (about 250 bytes a shard): a file over this is not a manifest, and is refused with its
# size before it is parsed.
MAX_MANIFEST_BYTES = 16 * 1024 * 1024


def has_manifest(dataset_dir):
    return os.path.isfile(os.path.join(dataset_dir, MANIFEST))


def load_manifest(dataset_dir, blend=None, verify=True, log=None):
    """The manifest of `dataset_dir` after checking its files; with `blend` (data.blend), the combined
    manifest of the blended datasets (`blend.combine` of each one's), whatever `dataset_dir` is: the one place
    that tells a blend from a single dataset (the loader streams what this returned)."""
    if blend:
        return combine([(weight, path, load_manifest(path, verify=verify, log=log))
                        for weight, path in check_blend(blend)])
    manifest = read_manifest(dataset_dir)
    check_files(dataset_dir, manifest)
    if verify:
        verify_checksums(dataset_dir, manifest, log)
    return manifest


def read_manifest(dataset_dir):
    path = os.path.join(dataset_dir, MANIFEST)
    if not os.path.isfile(path):
        raise UserError(f"no dataset in '{dataset_dir}' (manifest.json missing). Run `ms-llm preprocess --input "
                        f"<corpus> --output-dir {dataset_dir}`, or set data.source so training preprocesses it.")
    manifest = read_user_json(path, "dataset manifest", limit=MAX_MANIFEST_BYTES,
                              fix="Re-run preprocessing into a new folder.")
    missing = [k for k in REQUIRED if k not in manifest]
    if missing:
        raise UserError(f"'{path}' lacks {', '.join(missing)}: it was not written by `ms-llm preprocess`. "
                        f"Re-run preprocessing.")
    if manifest["schema_version"] not in READABLE_SCHEMAS:
        raise UserError(f"'{path}' has schema_version {str(manifest['schema_version'])[:40]}, this ms_llm reads "
                        f"{', '.join(map(str, READABLE_SCHEMAS))}. Re-run preprocessing with this version.")
    check_shape(path, manifest)
    return manifest


def _count(v, least=0):
    return isinstance(v, int) and not isinstance(v, bool) and v >= least


def check_shape(path, manifest):
    """The fields every reader of a dataset uses have the types preprocessing writes: a manifest edited by hand or
    damaged is one paragraph naming the field, not a TypeError in the loader."""
    def bad(field, value, want):
        raise UserError(f"'{path}': {field} is {json.dumps(value, default=str)[:60]} (a JSON {json_kind(value)}), not "
                        f"{want}. The manifest "
                        f"was edited or damaged: restore it, or re-run preprocessing.")

    for key in ("seq_length", "vocab_size"):
        if not _count(manifest[key], 1):
            bad(key, manifest[key], "a positive whole number")
    for key in ("eod_id", "max_token_id", "sample_length"):
        if key in manifest and manifest[key] is not None and not _count(manifest[key]):
            bad(key, manifest[key], "a non-negative whole number")
    tokenizer = manifest["tokenizer"]
    if not isinstance(tokenizer, dict) or not isinstance(tokenizer.get("kind"), str):
        bad("tokenizer", tokenizer, "an object with a \"kind\"")
    if tokenizer["kind"] not in ("byte", *TOKENIZER_CARRIES):
        bad("tokenizer.kind", tokenizer["kind"], f"one of byte, {', '.join(TOKENIZER_CARRIES)}")
    carried = TOKENIZER_CARRIES.get(tokenizer["kind"])  # what from_spec rebuilds the tokenizer from
    if carried and not isinstance(tokenizer.get(carried), str):
        bad(f"tokenizer.{carried}", tokenizer.get(carried), f"the {tokenizer['kind']} tokenizer's text")
    if not isinstance(manifest["splits"], dict) or not manifest["splits"]:
        bad("splits", manifest["splits"], "an object of splits (train, val)")
    for name, split in manifest["splits"].items():
        if not isinstance(split, dict) or not _count(split.get("samples")):
            bad(f"splits.{name}", split, "an object with a whole number of samples")
        shards = split.get("shards")
        if "shards" not in split:  # schema 1: one file per split
            if not isinstance(split.get("file"), str):
                bad(f"splits.{name}.file", split.get("file"), "a file name")
            continue
        if not isinstance(shards, list):
            bad(f"splits.{name}.shards", shards, "a list of shards")
        for i, shard in enumerate(shards):
            where = f"splits.{name}.shards[{i}]"
            if not isinstance(shard, dict) or not isinstance(shard.get("file"), str) or not shard["file"]:
                bad(where, shard, "an object with a file name")
            for key in ("samples", "bytes", "db_bytes", "start", "file_samples"):
                if (key == "samples" or shard.get(key) is not None) and not _count(shard.get(key)):
                    bad(f"{where}.{key}", shard.get(key), "a non-negative whole number")
            for key in ("sha256", "db_sha256"):
                if shard.get(key) is not None and not isinstance(shard[key], str):
                    bad(f"{where}.{key}", shard[key], "a hex digest")
    for key in ("columns",):
        if key in manifest and manifest[key] is not None and not isinstance(manifest[key], list):
            bad(key, manifest[key], "a list of column names")


def dataset_files(manifest):
    """Every data file of the dataset once, with its manifest entry (the splits may share a file)."""
    seen = {}
    for split in manifest["splits"]:
        for s in split_shards(manifest, split):
            seen.setdefault(s["file"], s)
    return seen


def check_files(dataset_dir, manifest):
    """Every file exists with the size the manifest recorded."""
    for name, s in dataset_files(manifest).items():
        f = os.path.join(dataset_dir, name)
        if not os.path.isfile(f) or not os.path.isfile(f + ".db"):
            raise UserError(f"dataset '{dataset_dir}': the file '{name}' (or its .db index) is missing. Re-run "
                            f"preprocessing, or restore the file.")
        for path, key in ((f, "bytes"), (f + ".db", "db_bytes")):
            want = s.get(key)
            if want is not None and os.path.getsize(path) != want:
                got = os.path.getsize(path)
                what = "truncated" if got < want else "longer than written"
                raise UserError(f"dataset '{dataset_dir}': '{os.path.basename(path)}' is {got:,} bytes but "
                                f"manifest.json records {want:,}: the file is {what} (an interrupted copy or a "
                                f"full disk?). Copy it again or re-run preprocessing; training would fail reading "
                                f"it.")


def verify_checksums(dataset_dir, manifest, log=None):
    """SHA-256 of every file against the manifest, once per file version (size + mtime), cached."""
    cache_path, cache = _load_cache(dataset_dir)
    todo = []
    for name, s in dataset_files(manifest).items():
        for fname, key in ((name, "sha256"), (name + ".db", "db_sha256")):
            want = s.get(key)
            if not want:
                continue
            path = os.path.join(dataset_dir, fname)
            st = os.stat(path)
            mark = [st.st_size, st.st_mtime_ns, want]
            if cache.get(fname) != mark:
                todo.append((fname, path, want, mark))
    if not todo:
        return
    total = sum(m[0] for _, _, _, m in todo)
    progress = None
    if total > (256 << 20):
        from ms_llm.data.progress import Progress

        progress = Progress(total, f"verifying '{dataset_dir}'", log or print)
    try:
        for fname, path, want, mark in todo:
            got = _sha256(path, progress)
            if got != want:
                raise UserError(f"dataset '{dataset_dir}': '{fname}' does not match manifest.json (SHA-256 {got[:16]}… "
                                f"instead of {want[:16]}…): it was altered or corrupted after it was written. Restore "
                                f"it from a good copy or re-run preprocessing; nothing was trained on it.")
            cache[fname] = mark
    finally:
        if progress is not None:
            progress.close()
        _save_cache(cache_path, cache)


def _sha256(path, progress):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(HASH_BLOCK), b""):
            h.update(block)
            if progress is not None:
                progress.update(len(block))
    return h.hexdigest()


def _load_cache(dataset_dir):
    """The verification cache lives in the dataset folder, or in ~/.cache/ms_llm when that is read-only."""
    path = os.path.join(dataset_dir, VERIFIED)
    if not os.access(dataset_dir, os.W_OK):
        key = hashlib.sha1(os.path.abspath(dataset_dir).encode()).hexdigest()[:16]
        path = os.path.join(os.path.expanduser("~"), ".cache", "ms_llm", "verified", f"{key}.json")
    try:
        with open(path, encoding="utf-8") as f:
            return path, json.load(f)
    except (OSError, ValueError):
        return path, {}


def _save_cache(path, cache):
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write_bytes(path, json.dumps(cache).encode())
    except OSError:
        pass  # a cache that cannot be written only means checking again next time


def has_loss_mask(manifest):
    """Whether a dataset holds fine-tuning data: a loss_mask column beside the ids (chat/instruction data)."""
    return "loss_mask" in (manifest.get("columns") or ())
