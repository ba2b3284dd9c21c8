"""Every config key does something: a setting that is accepted and silently ignored is a defect (issue 16)."""
import ast
import dataclasses
import glob
import os
import typing

from conftest import ROOT
from ms_llm.config.schema import Config

NOT_READERS = ("ms_llm/config/schema.py", "ms_llm/config/reference.py")


def names_read():
    """Attribute names the code reads (`cfg.train.lr`, `t.lr`) and keys it reads by name (`getattr(x, "k")`,
    `d.get("k")`), over ms_llm and model_zoo, the schema itself left out."""
    seen = set()
    for path in glob.glob(os.path.join(ROOT, "ms_llm", "**", "*.py"), recursive=True) + \
            glob.glob(os.path.join(ROOT, "model_zoo", "**", "*.py"), recursive=True):
        if path.replace(os.sep, "/").endswith(NOT_READERS):
            continue
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                seen.add(node.attr)
            elif isinstance(node, ast.Call):
                by_name = isinstance(node.func, ast.Name) and node.func.id == "getattr" and len(node.args) >= 2
                key = node.args[1] if by_name else node.args[0] if (
                    isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args) else None
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    seen.add(key.value)
    return seen


def schema_keys(cls=Config, prefix=""):
    """(dotted key, field name) of every key, nested sections (monitor.profile.start_step) included."""
    for f in dataclasses.fields(cls):
        yield prefix + f.name, f.name
        tp = typing.get_type_hints(cls)[f.name]
        for sub in [tp, *typing.get_args(tp)]:
            if dataclasses.is_dataclass(sub):
                yield from schema_keys(sub, f"{prefix}{f.name}.")


def test_every_schema_key_is_read_by_the_code():
    read = names_read()
    sections = {f.name for f in dataclasses.fields(Config)}
    unread = [dotted for dotted, name in schema_keys() if dotted not in sections and name not in read]
    assert unread == [], f"config keys nothing reads: {unread} (wire them, or refuse them with a reason)"


def test_retired_and_meaningless_settings_are_refused_with_the_reason():
    import pytest

    from ms_llm.config import load_config
    from ms_llm.errors import UserError

    with pytest.raises(UserError, match="never applied"):
        load_config(None, ["parallel_config.gradient_aggregation_group=4"])
    with pytest.raises(UserError, match="Llama's linear layers and RMSNorm have no biases"):
        load_config(None, ["model.arch=llama", "model.bias=true", "model.hidden_size=64"])
    from ms_llm.parallel.layout import build_plan

    with pytest.raises(UserError, match="micro_batch_num = 4 without a pipeline"):
        build_plan(load_config(None, ["parallel_config.micro_batch_num=4", "model.vocab_size=66"]), 1)
