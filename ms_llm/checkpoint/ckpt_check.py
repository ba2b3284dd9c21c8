"""A MindSpore .ckpt checked against itself before MindSpore parses it.

MindSpore's reader trusts each tensor's dims: a tensor whose dims say fewer elements than its bytes hold is copied
past the end of its buffer (the heap is corrupted and the process aborts later, "free(): invalid next size"), one
whose dims say more reads garbage. So the file's protobuf is walked here first, without reading any tensor's bytes:

    Checkpoint { repeated Value value = 1 }
    Value { string tag = 1; TensorProto tensor = 2; MapTensorProto maptensor = 3 }
    TensorProto { repeated int64 dims = 1; string tensor_type = 2; bytes tensor_content = 3 }

Every length must lie inside its parent, and each tensor's bytes (a large tensor is written as several values of
one tag, concatenated on reading) must be its dims' product x its dtype's size. A file saved with crc_check ends in
b"crc_num" and 10 bytes, which are not protobuf.
"""
import os

ITEMSIZE = {"Int8": 1, "UInt8": 1, "Int16": 2, "UInt16": 2, "Int32": 4, "UInt32": 4, "Int64": 8, "UInt64": 8,
            "Float16": 2, "BFloat16": 2, "Float32": 4, "Float64": 8, "Bool": 1}
CRC_TAIL = len(b"crc_num") + 10


class Damaged(Exception):
    """What is wrong with the file, in words."""


def _varint(f, end):
    shift, value = 0, 0
    while True:
        if f.tell() >= end:
            raise Damaged(f"a number runs past byte {end:,}")
        b = f.read(1)[0]
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value
        shift += 7
        if shift > 63:
            raise Damaged(f"a number at byte {f.tell():,} is longer than 10 bytes")


def _fields(f, end):
    """(field number, wire type, value or (start, length)) of the message in [f.tell(), end), skipping nothing."""
    while f.tell() < end:
        key = _varint(f, end)
        number, wire = key >> 3, key & 7
        if wire == 0:
            yield number, wire, _varint(f, end)
        elif wire == 2:
            length = _varint(f, end)
            start = f.tell()
            if start + length > end:
                raise Damaged(f"field {number} at byte {start:,} says {length:,} bytes, its message ends at byte "
                              f"{end:,}")
            yield number, wire, (start, length)
            f.seek(start + length)
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            if f.tell() + width > end:
                raise Damaged(f"field {number} runs past byte {end:,}")
            f.seek(f.tell() + width)
            yield number, wire, None
        else:
            raise Damaged(f"byte {f.tell():,} holds wire type {wire}, which no checkpoint field has")


def _tensor(f, start, length):
    """(dims, tensor_type, bytes of content) of a TensorProto."""
    dims, kind, content = [], None, 0
    f.seek(start)
    for number, wire, value in list(_fields(f, start + length)):
        if number == 1 and wire == 0:
            dims.append(value)
        elif number == 1 and wire == 2:  # packed dims
            f.seek(value[0])
            while f.tell() < value[0] + value[1]:
                dims.append(_varint(f, value[0] + value[1]))
        elif number == 2 and wire == 2:
            f.seek(value[0])
            kind = f.read(value[1]).decode("utf-8", errors="replace")
        elif number == 3 and wire == 2:
            content = value[1]
    return dims, kind, content


def _value(f, start, length):
    """(tag, dims, tensor_type, bytes of content) of a Value, or None for one without a tensor (a map tensor)."""
    tag, tensor, map_tensor = None, None, False
    f.seek(start)
    for number, wire, value in list(_fields(f, start + length)):
        if number == 1 and wire == 2:
            f.seek(value[0])
            tag = f.read(value[1]).decode("utf-8", errors="replace")
        elif number == 2 and wire == 2:
            tensor = value
        elif number == 3 and wire == 2:
            map_tensor = True
    if tensor is None and not map_tensor:
        raise Damaged(f"the value at byte {start:,} ({tag!r}) holds no tensor")
    return None if tensor is None else (tag,) + _tensor(f, *tensor)


def _size_problem(tag, dims, kind, got):
    if kind not in ITEMSIZE:
        return None  # a string or a packed type: MindSpore's own reader sizes it
    need = ITEMSIZE[kind]
    for d in dims if dims != [0] else []:  # [0] is how MindSpore writes a scalar's dims
        need *= d
    if need != got:
        return f"tensor '{tag}' is {kind} {dims} = {need:,} bytes, but the file holds {got:,} bytes of it"
    return None


def check(path):
    """None when the file parses and every tensor's dims agree with its bytes; else what is wrong (a phrase)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        end = size
        if size >= CRC_TAIL:
            f.seek(size - CRC_TAIL)
            if f.read(7) == b"crc_num":
                end = size - CRC_TAIL
        f.seek(0)
        try:
            values = [v for n, w, v in _fields(f, end) if n == 1 and w == 2]
            if not values:
                return "it holds no tensors"
            run = None  # (tag, dims, tensor_type, bytes so far) of consecutive values of one tag
            for start, length in values:
                entry = _value(f, start, length)
                if run is not None and (entry is None or entry[0] != run[0]):
                    problem = _size_problem(*run)
                    if problem:
                        return problem
                    run = None
                if entry is not None:
                    run = entry if run is None else (run[0], entry[1], entry[2], run[3] + entry[3])
            return _size_problem(*run) if run is not None else None
        except Damaged as e:
            return str(e)
        except IndexError:  # read(1) past the end
            return "it ends in the middle of a field"
