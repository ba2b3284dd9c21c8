"""The ledger of a MindFormers config import: every key of the source file gets one row saying what became
of it (mapped to which ms_llm key, ignored and why, not supported), and the ms_llm config is built as the
rows are written, so the printed table and the written YAML cannot disagree."""
from dataclasses import dataclass

from ms_llm.errors import UserError

MAPPED, DEFAULT, IGNORED, UNSUPPORTED, ACTION, UNKNOWN = ("mapped", "default", "ignored", "NOT SUPPORTED",
                                                         "ACTION", "unknown")


@dataclass
class Row:
    key: str
    value: object
    status: str
    target: str = ""
    note: str = ""


class Alias:
    """A YAML alias (`dataset_config: *train_dataset`): the mapping it repeats is accounted for where it is defined."""

    def __init__(self, of):
        self.of = of

    def __repr__(self):
        return f"*{self.of}"


def flatten(node, prefix="", seen=None):
    """{dotted key: leaf value} in file order; lists of mappings (callbacks) become key[i].field."""
    seen = {} if seen is None else seen
    out = {}
    for k, v in node.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            if id(v) in seen:
                out[key] = Alias(seen[id(v)])
                continue
            seen[id(v)] = key
            out.update(flatten(v, key + ".", seen))
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            for i, item in enumerate(v):
                out.update(flatten(item, f"{key}[{i}].", seen))
        else:
            out[key] = v
    return out


def show(value, width=44):
    text = repr(value) if isinstance(value, str) else str(value)
    if isinstance(value, bool) or value is None:
        text = str(value).lower().replace("none", "null")
    return text if len(text) <= width else text[:width - 3] + "..."


class Ledger:
    def __init__(self, raw):
        self.flat = flatten(raw)
        self.rows = {}
        self.defaults = []
        self.ours = {}

    # -- reading the source --
    def get(self, key, default=None):
        v = self.flat.get(key, default)
        return default if v is None else v

    def has(self, key):
        return key in self.flat

    def keys(self, prefix):
        return [k for k in self.flat if k.startswith(prefix)]

    # -- writing our config --
    def put(self, dotted, value):
        section, *path = dotted.split(".")
        node = self.ours.setdefault(section, {})
        for p in path[:-1]:
            node = node.setdefault(p, {})
        node[path[-1]] = value
        return f"{dotted} = {show(value, 60)}"

    def target(self, pairs):
        return ", ".join(self.put(k, v) for k, v in pairs)

    # -- rows: the first rule to claim a key decides it --
    def open(self, key):
        return key in self.flat and key not in self.rows

    def _row(self, key, status, target="", note=""):
        if key in self.flat and key not in self.rows:
            self.rows[key] = Row(key, self.flat[key], status, target, note)

    def mapped(self, key, pairs, note=""):
        """`pairs`: [(our dotted key, value), ...] (a single pair may be given bare)."""
        if isinstance(pairs, tuple):
            pairs = [pairs]
        if self.open(key):
            self._row(key, MAPPED, self.target(pairs), note)

    def default(self, key, pairs, note):
        """`key` is absent from the file: MindFormers' own default for it differs from ours, so it is written."""
        if isinstance(pairs, tuple):
            pairs = [pairs]
        self.defaults.append(Row(key, "(absent)", DEFAULT, self.target(pairs), note))

    def ignored(self, key, note):
        self._row(key, IGNORED, "", note)

    def unsupported(self, key, note, pairs=()):
        if isinstance(pairs, tuple) and pairs:
            pairs = [pairs]
        if self.open(key):
            self._row(key, UNSUPPORTED, self.target(pairs) if pairs else "", note)

    def action(self, key, note):
        self._row(key, ACTION, "", note)

    def ignore_prefix(self, prefix, note):
        for k in self.keys(prefix):
            self.ignored(k, note)

    def finish(self):
        """Rows in file order, then the defaults; keys no rule knows are listed as unknown, never dropped."""
        for k in self.flat:
            self._row(k, UNKNOWN, "", "not a key this importer knows: left out (tell us if it matters)")
        return [self.rows[k] for k in self.flat] + self.defaults


def format_table(rows):
    lines = []
    head = ("MindFormers key = value", "ms_llm", "how / why")
    cells = []
    for r in rows:
        left = f"{r.key} = {show(r.value)}" if not isinstance(r.value, Alias) else f"{r.key} = {r.value!r}"
        mid = r.target if r.status in (MAPPED, DEFAULT) or r.target else r.status
        if r.status == DEFAULT:
            left = f"{r.key} (absent)"
        cells.append((left, mid, r.note))
    w0 = min(64, max(len(c[0]) for c in cells + [head]))
    w1 = min(60, max(len(c[1]) for c in cells + [head]))
    lines.append(f"{head[0]:<{w0}}  {head[1]:<{w1}}  {head[2]}")
    lines.append(f"{'-' * w0}  {'-' * w1}  {'-' * 20}")
    for left, mid, note in cells:
        lines.append(f"{left:<{w0}}  {mid:<{w1}}  {note}".rstrip())
    return "\n".join(lines)


def summary_counts(rows):
    counts = {}
    for r in rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    return counts


def num(value, key, kind=float):
    """A number from YAML: PyYAML reads 1e-5 (no dot) as a string."""
    try:
        return kind(float(value)) if kind is int else kind(value)
    except (TypeError, ValueError):
        raise UserError(f"{key} = {value!r} is not a number. Fix it in the MindFormers file.") from None
