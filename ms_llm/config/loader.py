"""YAML file + preset + `--set section.key=value` overrides → a typed, validated `Config`.

Every problem becomes a `UserError` naming the field, the value and the fix, raised before any graph
is compiled or any file is written.
"""
import copy
import math
import dataclasses
import os
import typing

import yaml

from ms_llm.config.foreign import looks_like_mindformers
from ms_llm.config.schema import Config
from ms_llm.errors import UserError, closest
from ms_llm.fileio import interpreting

SECTIONS = {f.name: f.type for f in dataclasses.fields(Config)}
# Keys that existed and were removed because nothing honoured them: refused with the reason, not "unknown".
RETIRED = {
    "parallel_config.gradient_aggregation_group": "it was never applied: MindSpore fuses the gradient all-reduce "
                                                  "itself (semi-auto parallel) or ms_llm reduces each gradient "
                                                  "(data parallel). Remove the key",
}


def load_config(path=None, overrides=(), validate=True):
    """Read `path` (YAML), apply `overrides` (["section.key=value", ...]) and return a `Config`."""
    if not path:
        return config_from_dict({}, overrides) if validate else from_dict(apply_overrides({}, overrides))
    raw = read_yaml(path)
    # a value's refusal names the file it came from; with overrides it may have come from one of them, and the
    # refusal (which names the key, the value and both places to fix it) is left as it is
    with interpreting(path, "config file", name_refusals=not overrides):
        return config_from_dict(raw, overrides) if validate else from_dict(apply_overrides(raw, overrides))


def config_from_dict(raw, overrides=()):
    """The validated Config of a plain dict (sections → keys → values) with `overrides` applied: how every command
    and tool builds a config that is not a file (a checkpoint's record, a converted model, a debugging variant)."""
    from ms_llm.config.validate import validate_config

    return validate_config(from_dict(apply_overrides(raw, overrides)))


def with_overrides(cfg, overrides):
    """`cfg` with `overrides` (["section.key=value", ...]) applied, validated again."""
    return config_from_dict(to_dict(cfg), overrides)


def apply_overrides(raw, overrides):
    raw = copy.deepcopy(raw)
    for item in overrides:
        apply_override(raw, item)
    return raw


class DuplicateKey(yaml.YAMLError):
    def __init__(self, where, first, second):
        super().__init__(f"{where} at lines {first} and {second}")
        self.where, self.first, self.second = where, first, second


class OversizedDocument(yaml.YAMLError):
    def __init__(self, reason):
        super().__init__(reason)
        self.reason = reason


# A config is a few hundred values; a document that expands to more is an alias bomb or not a config. Counting
# each node once (aliases share nodes) bounds the check itself: a "billion laughs" of 10^9 values is refused after
# reading its few hundred nodes, before anything is constructed.
MAX_EXPANDED_VALUES = 100_000
# A config file is a few KiB; reading one of more than this is refused with its size instead.
MAX_CONFIG_BYTES = 4 * 1024 * 1024
# Deeper nesting than this is not a config, and PyYAML's composer recurses once per level.
MAX_NESTING = 64


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a mapping giving one key twice (PyYAML keeps the last one without a word) and a
    document that expands to more values than a config can hold (an alias bomb)."""

    depth = 0

    def compose_node(self, parent, index):
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise OversizedDocument(f"it nests its values more than {MAX_NESTING} levels deep (a config nests three: "
                                    f"section, key, list)")
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_document(self, node):
        expanded_size(node, {})
        refuse_repeated_keys(node, set())
        return super().construct_document(node)


def expanded_size(node, sizes):
    """How many values `node` becomes once every alias is expanded; each node is visited once (memo by identity)."""
    key = id(node)
    if key in sizes:
        if sizes[key] is None:
            raise OversizedDocument("an alias refers to the node that contains it, so it would expand forever")
        return sizes[key]
    sizes[key] = None
    children = ()
    if isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
    elif isinstance(node, yaml.SequenceNode):
        children = node.value
    total = 1
    for child in children:
        total += expanded_size(child, sizes)
        if total > MAX_EXPANDED_VALUES:
            raise OversizedDocument(f"its aliases expand to more than {MAX_EXPANDED_VALUES:,} values (a config holds "
                                    f"a few hundred; this is the shape of an alias bomb)")
    sizes[key] = total
    return total


def refuse_repeated_keys(node, visited, path=""):
    if id(node) in visited:  # an alias: its node was checked where it was anchored
        return
    visited.add(id(node))
    if isinstance(node, yaml.MappingNode):
        seen = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key_node.value)
            where = f"{path}.{key}" if path else key
            if key in seen:
                raise DuplicateKey(f"'{where}'", seen[key], key_node.start_mark.line + 1)
            seen[key] = key_node.start_mark.line + 1
            refuse_repeated_keys(value_node, visited, where)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            refuse_repeated_keys(item, visited, path)


def read_yaml(path):
    if not os.path.isfile(path):
        raise UserError(f"config file '{path}' does not exist. Pass an existing YAML file with --config, "
                        f"e.g. --config configs/shakespeare_char.yaml (paths are relative to the current directory).")
    size = os.path.getsize(path)
    if size > MAX_CONFIG_BYTES:
        raise UserError(f"config file '{path}' is {size:,} bytes; a config is a few KiB, and ms_llm reads none over "
                        f"{MAX_CONFIG_BYTES:,} bytes. Pass the YAML config itself (model:, data:, train:, ...), not a "
                        f"data or checkpoint file.")
    try:
        with open(path, "rb") as f:
            data = f.read()
        raw = yaml.load(data.decode("utf-8"), Loader=UniqueKeyLoader)  # noqa: S506 (a SafeLoader refusing repeats)
    except OversizedDocument as e:
        raise UserError(f"config file '{path}' is refused: {e.reason}. Write the values out, or use a few "
                        f"anchors for repeated sections.") from None
    except DuplicateKey as e:
        raise UserError(f"config file '{path}' gives {e.where} twice (line {e.first} and line {e.second}); YAML would "
                        f"silently keep the second. Keep one of them.") from None
    except OSError as e:
        raise UserError(f"config file '{path}' cannot be read ({e.strerror}). Check its permissions.") from None
    except UnicodeDecodeError as e:
        line = e.object.count(b"\n", 0, e.start) + 1
        raise UserError(f"config file '{path}' is not UTF-8 text (byte {e.start:,}, line {line}, is "
                        f"{e.object[e.start:e.start + 1]!r}). Save it as UTF-8, or copy it again if it is "
                        f"damaged.") from None
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        loc = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        raise UserError(f"config file '{path}' is not valid YAML{loc}: {getattr(e, 'problem', e)}. "
                        f"Fix the syntax there (indentation uses spaces; 'key: value' needs the space).") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise UserError(f"config file '{path}' must hold a mapping of sections (model:, data:, train:, ...), "
                        f"not a {type(raw).__name__}.")
    return raw


def apply_override(raw, item):
    """Apply one `section.key=value` (value parsed as YAML, so 3, 1e-3, true, [1, 2] are typed)."""
    if "=" not in item:
        raise UserError(f"--set '{item}' is not of the form section.key=value, e.g. --set train.max_steps=300.")
    dotted, text = item.split("=", 1)
    keys = dotted.strip().split(".")
    if len(keys) < 2 or not all(keys):
        raise UserError(f"--set '{item}': '{dotted}' must name a section and a key, e.g. train.max_steps.")
    try:
        value = yaml.load(text, Loader=UniqueKeyLoader) if text.strip() else ""  # noqa: S506 (a SafeLoader)
    except OversizedDocument as e:
        raise UserError(f"--set '{dotted}=...' is refused: {e.reason}. Give the value itself.") from None
    except yaml.YAMLError:
        value = text
    node = raw
    for k in keys[:-1]:
        child = node.get(k)
        if child is None:
            child = node[k] = {}
        if not isinstance(child, dict):
            raise UserError(f"--set '{item}': '{k}' holds a value, not a section, so '{dotted}' cannot be set.")
        node = child
    node[keys[-1]] = value


def from_dict(raw):
    """Build the typed Config from a plain dict (sections → keys → values)."""
    raw = dict(raw)
    for name in raw:
        if name not in SECTIONS:
            if looks_like_mindformers(raw):  # name a MindFormers file as one
                raise UserError(looks_like_mindformers(raw))
            hint = closest(name, SECTIONS)
            raise UserError(f"unknown config section '{name}'"
                            + (f" — did you mean '{hint}'?" if hint else ".")
                            + f" Valid sections: {', '.join(SECTIONS)}.")
    model = raw.get("model") or {}
    if isinstance(model, dict) and model.get("preset"):
        raw["model"] = with_preset(model)
    sections = {}
    for name, cls in SECTIONS.items():
        values = raw.get(name) or {}
        if not isinstance(values, dict):
            raise UserError(f"config section '{name}' must be a mapping of keys, got {values!r}. "
                            f"Write it as '{name}:' followed by indented 'key: value' lines.")
        sections[name] = build_section(name, cls, values)
    return Config(**sections)


def with_preset(model):
    from ms_llm.config.presets import PRESETS

    name = model["preset"]
    if name not in PRESETS:
        hint = closest(str(name), PRESETS)
        raise UserError(f"model.preset = '{name}' is not a known preset"
                        + (f" — did you mean '{hint}'?" if hint else ".")
                        + f" Known presets: {', '.join(sorted(PRESETS))}.")
    merged = dict(PRESETS[name])
    for key, value in model.items():  # a nested section (rope_scaling) is merged key by key, not replaced
        both = isinstance(value, dict) and isinstance(merged.get(key), dict)
        merged[key] = {**merged[key], **value} if both else value
    return merged


def build_section(section, cls, values):
    """Typed `cls` from a dict; nested dataclass fields are sections of their own (e.g. monitor.profile)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in values.items():
        if f"{section}.{key}" in RETIRED:
            raise UserError(f"{section}.{key} is no longer a setting: {RETIRED[section + '.' + key]}.")
        if key not in fields:
            hint = closest(str(key), fields)
            raise UserError(f"unknown key '{key}' in section '{section}'"
                            + (f" — did you mean '{hint}'?" if hint else ".")
                            + f" Valid keys in '{section}': {', '.join(fields)}.")
        kwargs[key] = coerce(value, hints[key], f"{section}.{key}")
        check_finite(f"{section}.{key}", value, kwargs[key], fields[key].metadata.get("help", ""))
        choices = fields[key].metadata.get("choices")
        if choices and kwargs[key] is not None and kwargs[key] not in choices:
            hint = closest(str(kwargs[key]), choices)
            raise UserError(f"{section}.{key} = {value!r} is not allowed"
                            + (f" — did you mean '{hint}'?" if hint else ".")
                            + f" Choose one of: {', '.join(map(str, choices))}.")
    return cls(**kwargs)


def check_finite(path, given, value, help):
    """No NaN or infinity reaches a check, the model or MindSpore: refused as the key is read."""
    from ms_llm.config.schema import LEGAL, numbers_of

    if any(not math.isfinite(v) for v in numbers_of(value)):
        legal = LEGAL.get(path)
        raise UserError(f"{path} = {given!r} is not a finite number" + (f"; its legal range is {legal}" if legal
                        else "") + f" ({help}). Give a number.")


def type_name(tp):
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        name = " or ".join(type_name(a) for a in args)
        return name + (" or null" if type(None) in typing.get_args(tp) else "")
    if origin in (list, typing.List):
        return f"list of {type_name(typing.get_args(tp)[0])}"
    if dataclasses.is_dataclass(tp):
        return "a mapping of " + ", ".join(f.name for f in dataclasses.fields(tp))
    return getattr(tp, "__name__", str(tp))


class _Mismatch(Exception):
    pass


def coerce(value, tp, path):
    """Convert `value` to type `tp`, accepting the spellings YAML and the command line produce."""
    try:
        return _coerce(value, tp, path)
    except _Mismatch:
        raise UserError(f"{path} = {value!r} ({type(value).__name__}) has the wrong type: expected "
                        f"{type_name(tp)}. Fix the value in the config file or in --set {path}=...") from None


def _coerce(value, tp, path=""):
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        args = typing.get_args(tp)
        if value is None or (isinstance(value, str) and value.strip().lower() in ("null", "none", "~")):
            if type(None) in args:
                return None
            raise _Mismatch
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, path)
            except _Mismatch:
                continue
        raise _Mismatch
    if origin in (list, typing.List):
        if not isinstance(value, (list, tuple)):
            raise _Mismatch
        (item,) = typing.get_args(tp)
        return [_coerce(v, item, path) for v in value]
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "yes", "on", "false", "no", "off"):
            return value.strip().lower() in ("true", "yes", "on")
        raise _Mismatch
    if tp is int:
        if isinstance(value, bool):
            raise _Mismatch
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:  # beyond, a float is no count
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        raise _Mismatch
    if tp is float:
        if isinstance(value, bool):
            raise _Mismatch
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):  # PyYAML reads 1e-3 (no dot) as a string
            try:
                return float(value.strip())
            except ValueError:
                pass
        raise _Mismatch
    if tp is str:
        if isinstance(value, str):
            return value
        raise _Mismatch
    if dataclasses.is_dataclass(tp):
        if isinstance(value, dict):
            return build_section(path, tp, value)
        if value is True:  # `profile: true` means "with the defaults"
            return tp()
        raise _Mismatch
    raise _Mismatch


def to_dict(cfg):
    return dataclasses.asdict(cfg)


def save_config(cfg, path):
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(to_dict(cfg), f, sort_keys=False, default_flow_style=None)
