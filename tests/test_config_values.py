"""Every key of the schema, given the values a typo or a bad script produces, is either accepted within its declared
legal range or refused in one paragraph naming the key and the value. A key added later is walked too: the keys
come from the schema's dataclasses, not from a list."""
import dataclasses
import math
import re
import typing

import pytest
import yaml

from conftest import ROOT
from ms_llm.config import loader
from ms_llm.config.loader import config_from_dict
from ms_llm.config.schema import LEGAL, Config
from ms_llm.errors import UserError

HOSTILE = [float("nan"), float("inf"), float("-inf"), 0, -1, 1.5, 10**12, 1e30, "abc", "", "nan", [], {}, None, True]


def schema_keys(cls=Config, prefix=""):
    """(dotted key, its type) for every leaf of the schema, nested sections included."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        args = [a for a in typing.get_args(hints[f.name]) if a is not type(None)] or [hints[f.name]]
        if dataclasses.is_dataclass(args[0]):
            yield from schema_keys(args[0], f"{prefix}{f.name}.")
        else:
            yield prefix + f.name, args[0]


KEYS = dict(schema_keys())
PLAIN = yaml.safe_load(open(f"{ROOT}/configs/shakespeare_char.yaml").read())
MOE = yaml.safe_load(open(f"{ROOT}/configs/shakespeare_moe.yaml").read())  # where the moe and rope keys mean something


def with_value(key, value):
    base = MOE if key.startswith(("model.moe.", "model.rope_scaling.")) else PLAIN
    raw = {s: dict(v) if isinstance(v, dict) else v for s, v in base.items()}
    *sections, leaf = key.split(".")
    node = raw
    for s in sections:
        node[s] = dict(node.get(s) or {})
        node = node[s]
    node[leaf] = value
    return raw


def loaded(cfg, key):
    v = cfg
    for part in key.split("."):
        v = getattr(v, part)
    return v


def problems(keys=KEYS, values=HOSTILE):
    """What is wrong with how each (key, value) is handled: a refusal that does not name both, an escape of any other
    exception, or an accepted number that is not finite or lies outside the key's declared range."""
    found = []
    for key in keys:
        for value in values:
            try:
                cfg = config_from_dict(with_value(key, value))
            except UserError as e:
                text = str(e)
                section, leaf = key.rsplit(".", 1)
                if section not in text or leaf not in text or (repr(value) not in text and str(value) not in text and str(value).lower() not in text):
                    found.append(f"{key} = {value!r}: the refusal does not name the key and the value: {text}")
                if "\n" in text.strip():
                    found.append(f"{key} = {value!r}: the refusal is not one paragraph: {text}")
                continue
            except Exception as e:  # noqa: BLE001 (the point: nothing else may escape)
                found.append(f"{key} = {value!r}: {type(e).__name__}: {e}")
                continue
            got = loaded(cfg, key)
            for v in got if isinstance(got, list) else [got]:
                if isinstance(v, float) and not math.isfinite(v):
                    found.append(f"{key} = {value!r} was accepted as {v}")
                elif isinstance(v, (int, float)) and not isinstance(v, bool) and key in LEGAL \
                        and not LEGAL[key].admits(v):
                    found.append(f"{key} = {value!r} was accepted outside {LEGAL[key]}")
    return found


def test_every_number_key_declares_its_legal_range():
    numbers = [k for k, tp in KEYS.items() if tp in (int, float)]
    assert len(numbers) >= 80
    assert [k for k in numbers if k not in LEGAL] == []
    assert [k for k in LEGAL if k not in KEYS] == []  # no range for a key that is gone


def test_every_key_every_hostile_value_is_accepted_legally_or_refused_naming_both():
    assert len(KEYS) * len(HOSTILE) >= 2000
    assert problems() == []


def test_the_walk_finds_a_key_that_accepts_nan(monkeypatch):
    from ms_llm.config import validate

    monkeypatch.setattr(loader, "check_finite", lambda *a: None)  # the planted defect: NaN read as a number,
    monkeypatch.setattr(validate, "check_legal_ranges", lambda cfg: None)  # and no range behind it
    found = problems(["train.lr", "model.norm_eps"], [float("nan")])
    assert any("train.lr = nan was accepted as nan" in p for p in found), found


def test_a_refusal_names_the_range():
    with pytest.raises(UserError, match=r"model.num_layers = 1000000000000 is outside its legal range \[1, 4,096\]"):
        config_from_dict(with_value("model.num_layers", 10**12))
    with pytest.raises(UserError, match=r"train.lr = nan is not a finite number; its legal range is \(0, 1000\]"):
        config_from_dict(with_value("train.lr", float("nan")))


def test_every_plain_string_key_refuses_an_empty_value():
    """Every key typed as a plain string (no None to fall back on), found by walking the schema, refuses '' and
    blanks in one paragraph naming it: a key added later is covered without being listed."""
    import dataclasses

    from ms_llm.config.schema import Config

    def plain_strings(cls, prefix=""):
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(f.type):
                yield from plain_strings(f.type, f"{prefix}{f.name}.")
            elif f.type is str:
                yield prefix + f.name

    keys = list(plain_strings(Config))
    assert {"data.dataset_dir", "data.text_field", "model.arch"} <= set(keys), keys
    for key in keys:
        for blank in ("", "  "):
            with pytest.raises(UserError, match=re.escape(key)):
                config_from_dict(with_value(key, blank))
