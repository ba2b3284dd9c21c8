"""A small safetensors reader/writer on numpy, with bfloat16.

The `safetensors` package's numpy API refuses bfloat16 (numpy has no such dtype), and Hugging Face
Llama checkpoints are bfloat16. The format is simple: an 8-byte little-endian header length, a JSON
header {name: {dtype, shape, data_offsets}}, then the raw bytes. bfloat16 tensors are read as float32
(exact: bf16 is the top half of an f32) and written back bit-identically from float32 values that came
from bfloat16.
"""
import json
import os
import struct

import numpy as np

from ms_llm.fileio import json_kind

DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
          "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
NAMES = {np.dtype(v): k for k, v in DTYPES.items()}


ITEMSIZE = {**{k: np.dtype(v).itemsize for k, v in DTYPES.items()}, "BF16": 2}
FIX = "The file is truncated or corrupt; re-download it (or write it again)."


def _refuse(path, what):
    from ms_llm.errors import UserError

    raise UserError(f"'{path}' is not a readable safetensors file: {what}. {FIX}")


def _whole_number(v):
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def read_header(path):
    """(header dict, byte where the data starts), checked against the file before any tensor is read: every
    entry's dtype is known, its shape x itemsize is its data_offsets span, the spans lie inside the data and
    do not overlap. A lie in the header is one paragraph naming the file and the tensor, never a huge allocation."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            if size < 8:
                _refuse(path, f"it is {size} bytes long, shorter than the 8-byte header length that starts the format")
            (n,) = struct.unpack("<Q", f.read(8))
            if n > size - 8:
                _refuse(path, f"the header says its JSON header is {n:,} bytes, the file holds {size - 8:,} bytes "
                              f"after the length field")
            raw = f.read(n)
    except OSError as e:
        from ms_llm.errors import UserError

        raise UserError(f"'{path}' cannot be read ({e.strerror or e}). Check the path and its permissions.") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        _refuse(path, f"its {n:,}-byte JSON header does not parse ({type(e).__name__}: {str(e)[:120]})")
    if not isinstance(header, dict):
        _refuse(path, f"its JSON header is a JSON {json_kind(header)}, not an object of tensor names")
    data_len = size - 8 - n
    meta = header.get("__metadata__")
    if meta is not None and not isinstance(meta, dict):
        _refuse(path, f"its \"__metadata__\" is a JSON {json_kind(meta)}, not an object of strings")
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(info, dict):
            _refuse(path, f"tensor '{name}' is described by a JSON {json_kind(info)}, not an object with dtype, "
                          f"shape and data_offsets")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if not isinstance(dtype, str) or dtype not in ITEMSIZE:
            _refuse(path, f"tensor '{name}' has dtype {str(dtype)[:40]!r}; the dtypes read are "
                          f"{', '.join(sorted(ITEMSIZE))}")
        if (not isinstance(shape, list) or len(shape) > 32
                or not all(_whole_number(d) and d < 2 ** 62 for d in shape)):
            _refuse(path, f"tensor '{name}' has shape {str(shape)[:80]}, not a list of at most 32 non-negative "
                          f"whole numbers")
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(_whole_number(o) for o in offsets)
                or offsets[0] > offsets[1]):
            _refuse(path, f"tensor '{name}' has data_offsets {str(offsets)[:80]}, not [begin, end] with "
                          f"0 <= begin <= end")
        need = ITEMSIZE[dtype]
        for d in shape:
            need *= d
        a, b = offsets
        if need != b - a:
            _refuse(path, f"the header says tensor '{name}' is {dtype} {shape} = {need:,} bytes, but its data_offsets "
                          f"[{a}, {b}] span {b - a:,} bytes (the file holds {data_len:,} bytes of tensor data)")
        if b > data_len:
            _refuse(path, f"the header says tensor '{name}' ends at byte {b:,} of the tensor data, the file holds "
                          f"{data_len:,} bytes of tensor data")
        spans.append((a, b, name))
    spans.sort()
    for (a0, b0, first), (a1, b1, second) in zip(spans, spans[1:]):
        if a1 < b0:
            _refuse(path, f"tensors '{first}' (bytes {a0:,}-{b0:,}) and '{second}' (bytes {a1:,}-{b1:,}) overlap "
                          f"in the tensor data")
    return header, 8 + n


def load(path):
    """({name: numpy array}, {name: original dtype string}, metadata); bfloat16 comes back as float32.
    The header is checked first (read_header), so each tensor read is one the file holds."""
    header, start = read_header(path)
    meta = header.pop("__metadata__", None) or {}
    arrays, dtypes = {}, {}
    with open(path, "rb") as f:
        for name, info in header.items():
            a, b = info["data_offsets"]
            f.seek(start + a)
            raw = f.read(b - a)
            shape = tuple(info["shape"])
            if info["dtype"] == "BF16":
                bits = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
                arr = bits.view(np.float32).reshape(shape)
            else:
                arr = np.frombuffer(raw, dtype=DTYPES[info["dtype"]]).reshape(shape).copy()
            arrays[name], dtypes[name] = arr, info["dtype"]
    return arrays, dtypes, meta


def save(path, arrays, dtypes=None, metadata=None):
    """Write {name: array}; `dtypes` {name: "BF16"/"F16"/...} converts on the way out (BF16 by truncation,
    exact for values that were bfloat16)."""
    dtypes = dtypes or {}
    header, chunks, offset = {}, [], 0
    for name in sorted(arrays):
        arr = np.asarray(arrays[name])
        kind = dtypes.get(name) or NAMES[arr.dtype]
        if kind == "BF16":
            data = (np.ascontiguousarray(arr, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
        else:
            data = np.ascontiguousarray(arr, dtype=DTYPES[kind]).tobytes()
        header[name] = {"dtype": kind, "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the format aligns the data start to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for c in chunks:
            f.write(c)
