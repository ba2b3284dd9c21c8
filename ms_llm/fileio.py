"""Small file helpers shared by the data, checkpoint and run-directory code."""
import contextlib
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


# --- a user's file: read, decoded and interpreted into one paragraph that names it ----------------------------

def refuse_if_larger(path, limit, what):
    """A `what` larger than `limit` bytes is refused with its size before a byte of it is read: parsing it would cost
    memory and time out of proportion to what such a file holds."""
    from ms_llm.errors import UserError

    size = os.path.getsize(path)
    if size > limit:
        raise UserError(f"'{path}' is {size:,} bytes; a {what} is far smaller, and ms_llm reads none over {limit:,} "
                        f"bytes. Check that the path names the {what} itself.")


def read_user_text(path, what, limit=None):
    """The UTF-8 text of a user's file; a missing, unreadable, oversized or non-UTF-8 one is a UserError naming it."""
    from ms_llm.errors import UserError

    try:
        if limit is not None:
            refuse_if_larger(path, limit, what)
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise UserError(f"{what} '{path}' cannot be read ({e.strerror or e}). Check the path and its "
                        f"permissions.") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise UserError(f"{what} '{path}' is not UTF-8 text: byte {e.start:,} (line {line}) is "
                        f"{data[e.start:e.start + 1]!r}. The file is damaged or not a {what}: copy or download it "
                        f"again.") from None


DAMAGED = "The file is damaged or cut short: copy or download it again."


def read_user_json(path, what, expect=dict, limit=None, fix=DAMAGED):
    """The JSON document of a user's file, of type `expect`; anything else is a UserError naming the file, the
    position of a syntax error or the type found."""
    from ms_llm.errors import UserError

    text = read_user_text(path, what, limit)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{what} '{path}' cannot be read as JSON ({e.msg}: line {e.lineno}, column {e.colno}). "
                        f"{fix}") from None
    except (ValueError, RecursionError) as e:
        raise UserError(f"{what} '{path}' cannot be read as JSON ({type(e).__name__}: {str(e)[:120]}). {fix}") from None
    if expect is not None and not isinstance(doc, expect):
        raise UserError(f"{what} '{path}' holds a JSON {json_kind(doc)}, not a JSON "
                        f"{'object' if expect is dict else expect.__name__}: it is damaged or not a {what}. {fix}")
    return doc


def json_kind(value):
    """What JSON calls the type of `value` (null, object, array, string, number, boolean)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return {dict: "object", list: "array", str: "string"}.get(type(value), "number")


@contextlib.contextmanager
def interpreting(path, what, fix="", name_refusals=True):
    """Around code that interprets the values of a user's file: a key it lacks or a value of the wrong type, met
    deep inside as a KeyError, TypeError, ValueError, ..., becomes one paragraph naming the file; so does (with
    `name_refusals`) a UserError raised there that names a key but not the file."""
    from ms_llm.errors import UserError

    try:
        yield
    except UserError as e:
        if not name_refusals or path in str(e):
            raise
        raise UserError(f"{what} '{path}': {e}") from None
    except KeyError as e:
        raise UserError(f"{what} '{path}' lacks {e.args[0]!r}. {fix}".strip()) from None
    except (TypeError, ValueError, AttributeError, IndexError, OverflowError, ZeroDivisionError) as e:
        raise UserError(f"{what} '{path}' holds a value of the wrong type or out of range ({type(e).__name__}: "
                        f"{str(e)[:200]}). {fix}".strip()) from None


def typed(doc, types):
    """`doc` without the values whose type is not the one `types` gives for their key ({"*": t}: every key; a type
    or a tuple of types for a leaf, where None always passes and a bool passes only as bool). For a record that is
    advisory (run_info.json, measure.json): a value of the wrong type is left out, as if the file did not state it,
    and what reads the record never meets a string where it compares numbers. `typed` of a leaf of the wrong type,
    or of a non-dict where a dict is wanted, is LEFT_OUT."""
    if isinstance(types, (type, tuple)):
        kinds = types if isinstance(types, tuple) else (types,)
        if doc is None or (isinstance(doc, kinds) and (bool in kinds or not isinstance(doc, bool))):
            return doc
        return LEFT_OUT
    if not isinstance(doc, dict):
        return LEFT_OUT
    out = {}
    for k, v in doc.items():
        want = types.get(k, types.get("*"))
        v = v if want is None else typed(v, want)
        if v is not LEFT_OUT:
            out[k] = v
    return out


LEFT_OUT = object()
