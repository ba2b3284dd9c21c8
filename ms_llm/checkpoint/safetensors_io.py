"""A small safetensors reader/writer on numpy, with bfloat16.

The `safetensors` package's numpy API refuses bfloat16 (numpy has no such dtype), and Hugging Face
Llama checkpoints are bfloat16. The format is simple: an 8-byte little-endian header length, a JSON
header {name: {dtype, shape, data_offsets}}, then the raw bytes. bfloat16 tensors are read as float32
(exact: bf16 is the top half of an f32) and written back bit-identically from float32 values that came
from bfloat16.
"""
import json
import struct

import numpy as np

DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
          "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
NAMES = {np.dtype(v): k for k, v in DTYPES.items()}


def read_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return header, 8 + n


def load(path):
    """({name: numpy array}, {name: original dtype string}, metadata); bfloat16 comes back as float32."""
    header, start = read_header(path)
    meta = header.pop("__metadata__", {}) or {}
    arrays, dtypes = {}, {}
    with open(path, "rb") as f:
        blob = f.read()
    for name, info in header.items():
        a, b = info["data_offsets"]
        raw = blob[start + a:start + b]
        shape = tuple(info["shape"])
        if info["dtype"] == "BF16":
            bits = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
            arr = bits.view(np.float32).reshape(shape)
        else:
            arr = np.frombuffer(raw, dtype=DTYPES[info["dtype"]]).reshape(shape)
        arrays[name], dtypes[name] = arr.copy(), info["dtype"]
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
