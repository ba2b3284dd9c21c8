"""A safetensors header that lies (length, dtype, shape, offsets) is one paragraph naming the file and the tensor,
checked before any tensor is read: never a reshape traceback or an allocation the file's size does not justify."""
import json
import struct

import numpy as np
import pytest

from ms_llm.checkpoint import safetensors_io
from ms_llm.errors import UserError


def write_raw(path, header, data=b"", length=None):
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    path.write_bytes(struct.pack("<Q", len(head) if length is None else length) + head + data)
    return str(path)


def refusal(path):
    with pytest.raises(UserError) as e:
        safetensors_io.load(path)
    msg = str(e.value)
    assert path in msg and "\n" not in msg and "re-download" in msg
    return msg


def test_a_terabyte_shape_over_64_bytes_is_refused_with_both_sizes(tmp_path):
    path = write_raw(tmp_path / "m.safetensors",
                     {"wte.weight": {"dtype": "F32", "shape": [1000000, 262144], "data_offsets": [0, 64]}}, bytes(64))
    msg = refusal(path)
    assert "'wte.weight'" in msg and "1,048,576,000,000 bytes" in msg and "span 64 bytes" in msg


@pytest.mark.parametrize("entry, says", [
    ({"dtype": "F33", "shape": [2], "data_offsets": [0, 8]}, "dtype 'F33'"),
    ({"dtype": "F32", "shape": [2, -1], "data_offsets": [0, 8]}, "shape [2, -1]"),
    ({"dtype": "F32", "shape": "2", "data_offsets": [0, 8]}, "shape 2"),
    ({"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}, "data_offsets [8, 0]"),
    ({"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}, "ends at byte 16 of the tensor data, the file holds 8"),
    ("F32", "described by a JSON string"),
])
def test_each_lie_in_a_tensor_entry_names_the_tensor_and_the_lie(tmp_path, entry, says):
    msg = refusal(write_raw(tmp_path / "m.safetensors", {"w": entry}, bytes(8)))
    assert "'w'" in msg and says in msg


def test_a_header_length_past_the_end_and_a_short_file_and_overlaps(tmp_path):
    head = {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    assert "the file holds" in refusal(write_raw(tmp_path / "a.safetensors", head, bytes(8), length=10 ** 12))
    (tmp_path / "b.safetensors").write_bytes(b"\x01\x02")
    assert "2 bytes long" in refusal(str(tmp_path / "b.safetensors"))
    both = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}
    assert "overlap" in refusal(write_raw(tmp_path / "c.safetensors", both, bytes(12)))
    (tmp_path / "d.safetensors").write_bytes(struct.pack("<Q", 4) + b"[1,2")
    assert "does not parse" in refusal(str(tmp_path / "d.safetensors"))


def test_a_true_header_still_reads_every_dtype(tmp_path):
    arrays = {"f": np.arange(6, dtype=np.float32).reshape(2, 3), "i": np.arange(3, dtype=np.int64),
              "b": np.array([1.5, -2.0], np.float32), "e": np.zeros((0, 4), np.float16)}
    path = str(tmp_path / "ok.safetensors")
    safetensors_io.save(path, arrays, {"b": "BF16"})
    back, dtypes, _ = safetensors_io.load(path)
    assert dtypes == {"b": "BF16", "e": "F16", "f": "F32", "i": "I64"}
    for k, v in arrays.items():
        np.testing.assert_array_equal(back[k], v)


def test_the_convert_command_says_it_in_one_paragraph(tmp_path, capsys):
    from ms_llm.cli import main

    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 8,
                                                "vocab_size": 16, "n_positions": 16}))
    write_raw(hf / "model.safetensors",
              {"wte.weight": {"dtype": "F32", "shape": [1000000, 262144], "data_offsets": [0, 64]}}, bytes(64))
    assert main(["convert", "--from-hf", str(hf), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "model.safetensors" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()
