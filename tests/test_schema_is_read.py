"""Every config key does something: a setting that is accepted and silently ignored is a defect.

A key counts as read only where the code follows the config to it: `cfg.train.lr`, `s.cfg.checkpoint.format`,
a name or `self.` attribute bound to a section (`t = cfg.train; t.lr`, `self.cfg = ckpt_cfg; self.cfg.format`,
`p = cfg.finetune.preference or Defaults()`), a function's return of a section at its calls (`p = settings(cfg);
p.beta`), a section handed to a function or class of the code base and read through its parameter (`TrainStep(...,
t.anomaly)` → `anomaly.zscore`), `getattr(section, "key")`, a run directory's `run.cfg("train.lr")` /
`run.section("train")`, or a raw section dict read by key while loading (`model["preset"]`). An attribute that
merely shares a key's name (`"...".format(...)` for checkpoint.format) does not count."""
import ast
import dataclasses
import glob
import os
import re
import typing

import pytest

from conftest import ROOT
from ms_llm.config.schema import Config

NOT_READERS = ("ms_llm/config/schema.py", "ms_llm/config/reference.py")
CONFIG_NAME = re.compile(r"(^|_)(cfg|config)$|^cfg")  # names that hold a whole Config: cfg, s.cfg, run_config


def schema_tree(cls=Config, prefix=""):
    """{dotted name: its section's dataclass, or None for a key}, nested sections (monitor.profile) included."""
    out = {}
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        sub = next((s for s in [tp, *typing.get_args(tp)] if dataclasses.is_dataclass(s)), None)
        out[prefix + f.name] = sub
        if sub is not None:
            out.update(schema_tree(sub, prefix + f.name + "."))
    return out


TREE = schema_tree()
SECTIONS = {k for k, v in TREE.items() if v is not None}


def sources(root=ROOT):
    for pkg in ("ms_llm", "model_zoo"):
        for path in glob.glob(os.path.join(root, pkg, "**", "*.py"), recursive=True):
            if not path.replace(os.sep, "/").endswith(NOT_READERS):
                with open(path, encoding="utf-8") as f:
                    yield ast.parse(f.read(), path)


RELEVANT = (ast.Assign, ast.Attribute, ast.Subscript, ast.Call, ast.Return)


def scopes_of(tree, classes):
    """[(scope, its nodes that can bind or read a section)] for a module and every function in it; a function's
    nodes are its own, not those of the functions defined inside it. Records each method's class in `classes`.
    One pass over the tree."""
    out, todo = {tree: []}, [(tree, tree)]
    while todo:
        node, scope = todo.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef):
                out[child] = []
                todo.append((child, child))
                if isinstance(node, ast.ClassDef):
                    classes[child] = node
            else:
                if isinstance(child, RELEVANT):
                    out[scope].append(child)
                todo.append((child, scope))
    return list(out.items())


def keys_read(trees):
    """The dotted config keys the code reads, by following sections through names, attributes and calls until
    nothing new is learned."""
    class_of = {}
    scopes = [pair for tree in trees for pair in scopes_of(tree, class_of)]
    funcs = {}
    for scope, _ in scopes:
        if isinstance(scope, ast.FunctionDef):
            funcs.setdefault(scope.name, []).append(scope)
            if scope.name == "__init__" and scope in class_of:  # calling the class binds __init__'s parameters
                funcs.setdefault(class_of[scope].name, []).append(scope)
    param_sections, self_sections, returns, read = {}, {}, {}, set()  # returns: {function name: its section}
    learned = True
    while learned:
        learned = False
        for scope, body in scopes:
            names = dict(param_sections.get(scope, {}))
            selfs = self_sections.setdefault(class_of.get(scope), {})

            def section_of(e):
                if isinstance(e, ast.Name):
                    return names.get(e.id)
                if isinstance(e, ast.Attribute):
                    if isinstance(e.value, ast.Name) and e.value.id == "self" and e.attr in selfs:
                        return selfs[e.attr]
                    if e.attr in SECTIONS and (isinstance(e.value, ast.Name) and CONFIG_NAME.search(e.value.id) or
                                               isinstance(e.value, ast.Attribute) and
                                               CONFIG_NAME.search(e.value.attr)):
                        return e.attr
                    base = section_of(e.value)
                    return f"{base}.{e.attr}" if base and f"{base}.{e.attr}" in SECTIONS else None
                if isinstance(e, ast.BoolOp) and isinstance(e.op, ast.Or):  # cfg.finetune.preference or Defaults()
                    return section_of(e.values[0])
                if isinstance(e, ast.Call) and isinstance(e.func, (ast.Name, ast.Attribute)):  # settings(cfg)
                    called = returns.get(e.func.id if isinstance(e.func, ast.Name) else e.func.attr)
                    if called:
                        return called
                if isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr == "section" \
                        and e.args and isinstance(e.args[0], ast.Constant) and e.args[0].value in SECTIONS:
                    return e.args[0].value
                return None

            for node in body:  # bindings: x = cfg.train; a, self.cfg = ..., ckpt_cfg
                if isinstance(node, ast.Assign):
                    for target in node.targets:
                        pairs = list(zip(target.elts, node.value.elts)) if isinstance(target, ast.Tuple) and \
                            isinstance(node.value, ast.Tuple) else [(target, node.value)]
                        for tgt, value in pairs:
                            s = section_of(value)
                            if s and isinstance(tgt, ast.Name):
                                names[tgt.id] = s
                            elif s and isinstance(tgt, ast.Attribute) and isinstance(tgt.value, ast.Name) and \
                                    tgt.value.id == "self" and tgt.attr not in selfs:
                                selfs[tgt.attr] = s
                                learned = True
            for node in body:  # reads, and sections handed to functions and classes of the code base
                if isinstance(node, ast.Return) and isinstance(scope, ast.FunctionDef) and node.value is not None:
                    s = section_of(node.value)
                    if s and scope.name not in returns:
                        returns[scope.name] = s
                        learned = True
                elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                    s = section_of(node.value)
                    if s and f"{s}.{node.attr}" in TREE:
                        read.add(f"{s}.{node.attr}")
                elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and \
                        node.value.id in SECTIONS and isinstance(node.slice, ast.Constant):
                    read.add(f"{node.value.id}.{node.slice.value}")
                elif isinstance(node, ast.Call):
                    f, args = node.func, node.args
                    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
                    first = args[0].value if args and isinstance(args[0], ast.Constant) else None
                    if name == "getattr" and len(args) >= 2 and isinstance(args[1], ast.Constant):
                        s = section_of(args[0])
                        if s:
                            read.add(f"{s}.{args[1].value}")
                    elif name == "cfg" and isinstance(first, str):  # run.cfg("train.lr")
                        read.add(first)
                    elif name == "get" and isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) \
                            and f.value.id in SECTIONS and first:
                        read.add(f"{f.value.id}.{first}")  # model.get("preset") on the raw YAML
                    for fd in funcs.get(name, []):
                        params = [a.arg for a in fd.args.args]
                        params = params[1:] if params and params[0] in ("self", "cls") else params
                        for param, value in list(zip(params, args)) + [(k.arg, k.value) for k in node.keywords]:
                            s = section_of(value)
                            if s and param not in param_sections.setdefault(fd, {}):
                                param_sections[fd][param] = s
                                learned = True
    return {k for k in read if k in TREE and TREE[k] is None}


@pytest.mark.slow  # parses and follows every module of the package (3-4 s)
def test_every_schema_key_is_read_by_the_code():
    keys = [k for k, sub in TREE.items() if sub is None]
    unread = sorted(set(keys) - keys_read(sources()))
    assert unread == [], f"config keys nothing reads: {unread} (wire them, or refuse them with a reason)"


def test_a_key_is_followed_from_the_config_not_matched_by_name():
    """The check itself: a same-named attribute elsewhere is not a read; each way of reaching a key is."""
    code = '''
def save(path, text):
    return "{}".format(text) + path.format      # not checkpoint.format
class Saver:
    def __init__(self, ckpt_cfg):
        self.dir, self.cfg = "x", ckpt_cfg
    def write(self):
        return self.cfg.async_save               # checkpoint.async_save, through a class and self
def settings(cfg):
    return cfg.finetune.preference or Defaults()
def main(cfg):
    t = cfg.train
    Saver(cfg.checkpoint)
    p = settings(cfg)                            # finetune.preference, through a function's return
    return t.lr, getattr(cfg.model, "dropout"), cfg.monitor.profile.stop_step, p.beta
'''
    assert keys_read([ast.parse(code)]) == {"checkpoint.async_save", "train.lr", "model.dropout",
                                            "monitor.profile.stop_step", "finetune.preference.beta"}


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
