"""The value grammar of `--vary KEY=SPEC`:

    train.lr=1e-4,3e-4,1e-3          a list (YAML scalars; brackets keep their commas: k=[2,2],[4,1])
    train.lr=log:1e-4..1e-2:5        5 values evenly spaced in log scale, both ends included
    train.weight_decay=lin:0..0.2:3  3 values evenly spaced, both ends included (integers stay integers)
"""
import math

import yaml

from ms_llm.errors import UserError

GRAMMAR = ("Write KEY=V1,V2,... (e.g. train.lr=1e-4,3e-4,1e-3), KEY=log:A..B:N (e.g. train.lr=log:1e-4..1e-2:5) "
           "or KEY=lin:A..B:N (e.g. train.weight_decay=lin:0..0.2:3).")


def parse_vary(text):
    """'KEY=SPEC' → (key, [values]). Bad input is a UserError naming --vary and the fix."""
    key, sep, spec = text.partition("=")
    key, spec = key.strip(), spec.strip()
    if not sep or not key or not spec:
        raise UserError(f"--vary {text!r} has no KEY=VALUES form. {GRAMMAR}")
    if "." not in key:
        raise UserError(f"--vary {text!r}: '{key}' is not a SECTION.KEY config key (e.g. train.lr). {GRAMMAR}")
    if spec.startswith(("log:", "lin:")):
        values = parse_range(text, spec)
    else:
        values = [scalar(v) for v in split_top(spec)]
        if any(v == "" for v in values):
            raise UserError(f"--vary {text!r} has an empty value (two commas, or a trailing one). {GRAMMAR}")
    unique = []
    for v in values:  # log:..:N with rounding can repeat a value; a repeated trial is the same trial
        if v not in unique:
            unique.append(v)
    return key, unique


def parse_range(text, spec):
    kind, _, rest = spec.partition(":")
    bounds, _, count = rest.rpartition(":")
    lo, dots, hi = bounds.partition("..")
    try:
        a, b, n = number(lo), number(hi), int(count)
    except ValueError:
        a = b = n = None
    if not dots or a is None or n is None:
        raise UserError(f"--vary {text!r}: '{spec}' is not {kind}:A..B:N with numbers A, B and a count N. {GRAMMAR}")
    if n < 2:
        raise UserError(f"--vary {text!r}: a range needs N >= 2 values (got {n}); for one value write KEY=V.")
    if kind == "log":
        if a <= 0 or b <= 0:
            raise UserError(f"--vary {text!r}: a log range needs positive ends (got {a:g} and {b:g}); use lin:A..B:N "
                            f"for a range through 0.")
        # 3 significant digits: log:1e-4..1e-2:5 gives 0.0001, 0.000316, 0.001, ...; names and tables stay readable
        return [float(f"{math.exp(math.log(a) + i * (math.log(b) - math.log(a)) / (n - 1)):.3g}") for i in range(n)]
    values = [a + i * (b - a) / (n - 1) for i in range(n)]
    if isinstance(a, int) and isinstance(b, int) and all(float(v).is_integer() for v in values):
        return [int(v) for v in values]  # lin:0..300:4 → 0, 100, 200, 300 for integer keys (warmup_steps)
    return [float(f"{v:.6g}") for v in values]


def number(text):
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        return float(text)


def split_top(spec):
    """Split at commas outside brackets: '[2,2],[4,1]' → ['[2,2]', '[4,1]']."""
    parts, depth, cur = [], 0, ""
    for ch in spec:
        depth += ch in "[{"
        depth -= ch in "]}"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return parts + [cur]


def scalar(text):
    """A value as the config loader would read it from --set (YAML), with 1e-4 a number (YAML 1.1 says string)."""
    text = text.strip()
    if text == "":
        return ""
    try:
        return number(text)
    except ValueError:
        pass
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def show(value):
    """A value as it is written back on the command line and in tables: 0.001, 1e-05, [2, 2], cosine."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(show(v) for v in value) + "]"
    return "null" if value is None else str(value)
