"""The dataset manifest: what a preprocessed folder holds and how it was made."""
import json
import os

from ms_llm.errors import UserError

MANIFEST = "manifest.json"
SCHEMA_VERSION = 1
SPLIT_FILES = {"train": "train.mindrecord", "val": "val.mindrecord"}
REQUIRED = ("schema_version", "seq_length", "tokenizer", "vocab_size", "splits")


def has_manifest(dataset_dir):
    return os.path.isfile(os.path.join(dataset_dir, MANIFEST))


def load_manifest(dataset_dir):
    path = os.path.join(dataset_dir, MANIFEST)
    if not os.path.isfile(path):
        raise UserError(f"no dataset in '{dataset_dir}' (manifest.json missing). Run `ms-llm preprocess --input "
                        f"<corpus> --output-dir {dataset_dir}`, or set data.source so training preprocesses it.")
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"'{path}' cannot be read as JSON ({e}). Re-run preprocessing into a new folder.") from None
    missing = [k for k in REQUIRED if k not in manifest]
    if missing:
        raise UserError(f"'{path}' lacks {', '.join(missing)}: it was not written by `ms-llm preprocess`. "
                        f"Re-run preprocessing.")
    if manifest["schema_version"] != SCHEMA_VERSION:
        raise UserError(f"'{path}' has schema_version {manifest['schema_version']}, this ms_llm reads "
                        f"{SCHEMA_VERSION}. Re-run preprocessing with this version.")
    for name, split in manifest["splits"].items():
        f = os.path.join(dataset_dir, split["file"])
        if not os.path.isfile(f) or not os.path.isfile(f + ".db"):
            raise UserError(f"dataset '{dataset_dir}': the {name} split file '{split['file']}' (or its .db index) is "
                            f"missing. Re-run preprocessing.")
    return manifest
