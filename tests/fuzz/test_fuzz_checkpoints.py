"""Checkpoint files a user hands in, damaged: a Hugging Face / ms_llm .safetensors (its header's lengths, dtypes,
shapes and offsets lying, its bytes cut or flipped) and a MindSpore .ckpt (cut or flipped). Each reads or is one
paragraph naming the file."""
import json
import os
import struct

import numpy as np
import pytest
from hypothesis import strategies as st

from fuzzing import Property, as_test, damaged, json_text, lied, reads_or_refuses, write
from ms_llm.checkpoint import safetensors_io, store

ARRAYS = {"wte.weight": np.arange(12, dtype=np.float32).reshape(3, 4), "ln.bias": np.ones(4, np.float32),
          "pos": np.arange(6, dtype=np.int64).reshape(2, 3)}


def safetensors_bytes(tmp="/tmp"):
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.safetensors")
        safetensors_io.save(path, ARRAYS, {"ln.bias": "BF16"}, {"format": "pt"})
        with open(path, "rb") as f:
            return f.read()


SEED = safetensors_bytes()
(N,) = struct.unpack("<Q", SEED[:8])
HEADER = json.loads(SEED[8:8 + N])
DATA = SEED[8 + N:]


def with_header(header, data=DATA, length=None):
    head = json.dumps(header, allow_nan=True).encode()
    return struct.pack("<Q", len(head) if length is None else length) + head + data


LYING_HEADERS = st.one_of(
    lied(HEADER).map(with_header),  # a dtype, shape or offset of the wrong type or value
    st.tuples(lied(HEADER), st.integers(0, len(DATA) + 64)).map(lambda h: with_header(h[0], DATA[:h[1]])),
    st.integers(0, 2 ** 64 - 1).map(lambda n: with_header(HEADER, length=n)),  # the header length lies
    damaged(SEED),
)


def read_safetensors(folder, data):
    path = write(folder, "model.safetensors", data)
    return reads_or_refuses(lambda: safetensors_io.load(path), path)


def read_safetensors_checkpoint(folder, data):
    """The path training and `ms-llm convert --to-hf` take (store.read_tensors)."""
    path = write(folder, "step_00000010.safetensors", data)
    return reads_or_refuses(lambda: store.read_tensors(path), path)


def ckpt_bytes():
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.ckpt")
        store.write_tensors(path, ARRAYS, "ckpt")
        with open(path, "rb") as f:
            return f.read()


CKPT = ckpt_bytes()


def read_ckpt(folder, data):
    path = write(folder, "model.ckpt", data)
    return reads_or_refuses(lambda: store.read_tensors(path), path)


INDEX = {"metadata": {"total_size": len(DATA)}, "weight_map": {name: "model.safetensors" for name in ARRAYS}}


def read_index(folder, data):
    """`convert --from-hf` on a folder whose model.safetensors.index.json is damaged."""
    from ms_llm.interop.huggingface import read_hf_tensors

    write(folder, "model.safetensors", SEED)
    write(folder, "model.safetensors.index.json", data)
    return reads_or_refuses(lambda: read_hf_tensors(folder), "model.safetensors.index.json")


PROPERTIES = {
    "safetensors (ms_llm reader)": Property(LYING_HEADERS, read_safetensors),
    "safetensors (checkpoint store)": Property(LYING_HEADERS, read_safetensors_checkpoint),
    "ckpt (MindSpore load_checkpoint)": Property(damaged(CKPT), read_ckpt),
    "safetensors index": Property(st.one_of(damaged(json_text(INDEX)), lied(INDEX).map(json_text)), read_index),
}

test_safetensors_reader = as_test(PROPERTIES["safetensors (ms_llm reader)"])
test_safetensors_checkpoint = as_test(PROPERTIES["safetensors (checkpoint store)"])
test_ckpt = as_test(PROPERTIES["ckpt (MindSpore load_checkpoint)"])
test_safetensors_index = as_test(PROPERTIES["safetensors index"])


def test_a_ckpt_whose_dims_lie_is_refused_before_mindspore_reads_it(tmp_path):
    """MindSpore copies a tensor's bytes into a buffer its dims size: dims of 2x2 over the 2x3 int64 'pos' overrun
    the buffer (a corrupted heap, the process aborting later). The check reads the dims first."""
    from ms_llm.errors import UserError

    lie = CKPT.replace(b"\x08\x02\x08\x03\x12\x05Int64", b"\x08\x02\x08\x02\x12\x05Int64")
    assert lie != CKPT
    path = write(str(tmp_path), "model.ckpt", lie)
    with pytest.raises(UserError, match=r"tensor 'pos' is Int64 \[2, 2\] = 32 bytes, but the file holds 48"):
        store.read_tensors(path)
    assert set(store.read_tensors(write(str(tmp_path), "good.ckpt", CKPT))) == set(ARRAYS)
