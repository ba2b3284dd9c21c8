"""What tests/fuzz and benchmarks/fuzz_readers.py share: strategies that damage a user's file the ways files get
damaged (cut at any byte, bytes flipped, inserted or dropped, a length, shape or offset field that lies, a JSON or
YAML value of the wrong type), and the one property every reader of a user's file holds: the read succeeds, or it
raises the project's UserError, one paragraph that names the file. Any other exception is a defect.

Each test module lists its properties in PROPERTIES ({name: Property}); the fast tier runs each with FAST_EXAMPLES
examples, the benchmark with thousands."""
import json
import os
import tempfile
from dataclasses import dataclass
from typing import Callable

from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from ms_llm.errors import UserError

FAST_EXAMPLES = 25
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# no shrinking: a damaged file is small already, and shrinking one that MindSpore reads costs minutes
NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate)


@dataclass
class Property:
    strategy: object  # a Hypothesis strategy of inputs
    body: Callable  # body(folder, value): writes the input into `folder` and reads it (through reads_or_refuses)


def reads_or_refuses(read, *names):
    """'read' or 'refused'; raises AssertionError for a refusal that does not name the file, and lets any other
    exception through (the test fails with its traceback: the defect)."""
    try:
        read()
    except UserError as e:
        msg = str(e)
        assert any(n in msg for n in names), f"the refusal names none of {names}: {msg}"
        assert "\n\n" not in msg.strip() and "Traceback" not in msg, f"not one paragraph: {msg}"
        return "refused"
    return "read"


def run_once(prop, value):
    with tempfile.TemporaryDirectory(prefix="fuzz-") as folder:
        return prop.body(folder, value)


def as_test(prop, examples=FAST_EXAMPLES):
    """A pytest test function running `prop` on `examples` inputs (no example database: each run is fresh and
    leaves nothing behind)."""
    @settings(max_examples=examples, deadline=None, database=None, phases=NO_SHRINK,
              suppress_health_check=list(HealthCheck))
    @given(value=prop.strategy)
    def test(value):
        run_once(prop, value)

    return test


# --- damaged bytes ----------------------------------------------------------------------------------------------

_OPS = st.one_of(
    st.tuples(st.just("cut"), st.floats(0, 1)),  # a truncated download or a crash mid-write
    st.tuples(st.just("flip"), st.floats(0, 1), st.integers(1, 255)),  # a bit-rotted byte
    st.tuples(st.just("insert"), st.floats(0, 1), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("drop"), st.floats(0, 1), st.integers(1, 64)),
)


def _apply(seed, ops):
    data = bytearray(seed)
    for op in ops:
        at = min(int(op[1] * len(data)), max(len(data) - 1, 0))
        if op[0] == "cut":
            del data[int(op[1] * len(data)):]
        elif op[0] == "flip" and data:
            data[at] ^= op[2]
        elif op[0] == "insert":
            data[at:at] = op[2]
        elif op[0] == "drop":
            del data[at:at + op[2]]
    return bytes(data)


def damaged(seed):
    """`seed` (bytes) with one to three of: cut at any byte, a byte flipped, a few bytes inserted or dropped."""
    return st.lists(_OPS, min_size=1, max_size=3).map(lambda ops: _apply(seed, ops))


# --- values of the wrong type -------------------------------------------------------------------------------------

HOSTILE = st.one_of(
    st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70), st.sampled_from([0, -1, 1, 2 ** 31, 2 ** 63, 10 ** 30]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6), st.just(""), st.just([]), st.just({}),
    st.lists(st.integers(-3, 3), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(-3, 3), max_size=2),
)


def paths(doc, here=()):
    """Every place in a JSON-like document: () is the whole document."""
    found = [here]
    if isinstance(doc, dict):
        for k, v in doc.items():
            found += paths(v, here + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:8]):
            found += paths(v, here + (i,))
    return found


def _put(doc, where, value):
    if not where:
        return value
    doc = json.loads(json.dumps(doc))  # a copy
    node = doc
    for k in where[:-1]:
        node = node[k]
    node[where[-1]] = value
    return doc


def lied(doc):
    """`doc` with one to three of its values (or itself) replaced by a value of another type or a hostile number."""
    places = paths(doc)

    def apply(edits):
        out = doc
        for where, value in edits:
            try:
                out = _put(out, where, value)
            except (KeyError, IndexError, TypeError):  # an earlier edit removed the place
                continue
        return out

    return st.lists(st.tuples(st.sampled_from(places), HOSTILE), min_size=1, max_size=3).map(apply)


def json_text(doc):
    return json.dumps(doc, allow_nan=True).encode("utf-8")


def damaged_json(doc):
    """A JSON file's bytes: its values lied about, or its text damaged."""
    return st.one_of(lied(doc).map(json_text), damaged(json_text(doc)))


def write(folder, name, data):
    path = os.path.join(folder, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode("utf-8"))
    return path
