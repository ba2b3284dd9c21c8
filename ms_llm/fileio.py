"""Small file helpers shared by the data, checkpoint and run-directory code."""
import hashlib
import json
import os


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def atomic_write_bytes(path, data):
    """Write to a temporary name, fsync, rename: readers see the old file or the new one, never a part."""
    tmp = os.path.join(os.path.dirname(path), f".tmp-{os.path.basename(path)}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_versioned_json(path, fmt):
    """The JSON object at `path` when its "format" is `fmt`; None when it is missing, unreadable or another format
    (a sweep's or a ladder's own record: anything else in the folder is not theirs)."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("format") == fmt else None
