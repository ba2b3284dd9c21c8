"""MindSpore's compile cache for the training step: keyed on the step that was built, so that a cached graph is
only ever reused for the same graph, and checked so that a reused graph is never trusted blindly.

MindSpore keys its cache by the Python sources alone: a 4-layer run after a 24-layer run with the same cache
directory silently executes the 24-layer graph. So every distinct step gets its own directory, keyed on
(`cache_key`):
- the fingerprint of the step as built (`step_fingerprint`): every cell of the step, its class, its plain-data
  attributes, its primitives and their attributes, the values of the constant tensors it holds (the learning-rate
  table, RoPE tables), its parameters' names, shapes and dtypes, and the step's inputs' shapes and dtypes;
- the whole resolved config, except the keys in `HOST_ONLY`: deny by default, so a key added to the schema later is
  in the key until a test proves otherwise (tests/test_compile_cache_key.py compiles the step with each of those
  keys at its default and changed, and finds the two graphs identical);
- the code of ms_llm and model_zoo, MindSpore's version, the world size, the purpose and MindSpore's MS_DEV_*
  switches.
A hit turns a 13 s compile (24-layer quickstart on CPU) into 1.5 s; on Ascend, where big models compile for many
minutes, it is what makes a restart cheap.

Only the step's own graphs are cached: the cache is switched on just before they compile and off right after
(ms_llm/train/compile_step.py). MindSpore numbers cached graphs in compile order (compile_cache_0, _1, ...), so a graph compiled
while the cache was on for another reason (the tensor-statistics probe before the first step, say) would be handed to
the next run as its step.

Checks on a hit (`Entry`), each a warning line and a fresh compile when it fails, never a traceback:
- Signature. The loaded graph's inputs and the parameters it binds (MindSpore's own view of the graph) must be the
  step's; its outputs must be those recorded when the entry was filled (number, shape, dtype). A missing, corrupt
  or truncated record is a mismatch too.
- Binding. A graph loaded from the cache is bound to the parameters its Cell owns (`parameters_dict`); any other
  parameter it reads or writes (one captured only by a closure, say) becomes a private copy that starts at zero
  and is never seen again. Checked for every step graph before it runs, filling or reusing.
- Behaviour. The run that fills an entry from a fresh start records its first step (outputs, and sums of the small
  parameters and moments, and their change in the update). A later fresh start of the same run (same config and
  data, `run_identity`) reusing the entry must reproduce them.
"""
import contextlib
import fcntl
import functools
import glob
import hashlib
import inspect
import json
import math
import os
import re
import shutil
import sys
import types

import numpy as np

from ms_llm.config import to_dict

# Schema keys that do not change the compiled step, each proven by tests/test_compile_cache_key.py (the step built
# and compiled with the key at its default and changed: identical fingerprints and identical graphs). A key names
# a whole subsection too (monitor.tensor_stats). Every other key of the schema is part of the cache key.
HOST_ONLY = (
    "train.log_interval", "train.eval_interval", "train.eval_steps", "train.stop_at_step", "train.seed",
    "train.stop_on", "data.dataset_dir", "data.source", "data.tokenizer", "data.val_fraction", "data.text_field",
    "data.num_workers", "data.blend", "data.extra_val",
    "checkpoint.save_interval", "checkpoint.auto_resume", "checkpoint.keep_last", "checkpoint.format",
    "checkpoint.async_save", "checkpoint.remote_dir", "checkpoint.uploader", "checkpoint.remote_endpoint",
    "checkpoint.upload_budget_s", "checkpoint.load_weights",
    "monitor.summary", "monitor.tensorboard", "monitor.report", "monitor.telemetry_interval_s", "monitor.progress_bar",
    "monitor.peak_tflops", "monitor.nan_check", "monitor.tensor_stats", "monitor.profile",
    "monitor.trackers", "monitor.tracker_project", "monitor.diagnose",
    "eval.tasks", "eval.interval", "eval.limit", "eval.at_start", "eval.include_path", "eval.num_fewshot",
    "eval.batch_size",
    "context.compile_cache", "context.num_threads",
)
RECORD = "first_step.json"
RECORD_VERSION = 2
# The first step of a fresh start, reused against filled: equal on CPU to the bit; the tolerance leaves room for
# devices whose reductions are not deterministic (a wrong graph differs by far more).
RTOL = 1e-4


class CacheMismatch(Exception):
    """A reused graph is not the step's, or did not reproduce the step it was cached from."""


# --- the key ------------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def _code_digest():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    h = hashlib.sha256()
    for pkg in ("ms_llm", "model_zoo"):
        for path in sorted(glob.glob(os.path.join(root, pkg, "**", "*.py"), recursive=True) +
                           glob.glob(os.path.join(root, pkg, "**", "*.cc"), recursive=True)):
            h.update(path[len(root):].encode())
            with open(path, "rb") as f:
                h.update(f.read())
    return h.hexdigest()


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
# Cell attributes MindSpore keeps for itself that say how the cell compiles (recompute, mixed precision, jit and
# sharding settings); the rest of its private bookkeeping (ids, creation times, caches) differs between processes.
_CELL_PRIVATE = ("_amp_level", "_auto_prefix", "_has_config_recompute", "_jit_config_dict", "_in_strategy",
                 "_out_strategy", "_dynamic_shape_inputs", "_recompute_cell")
_CELL_SKIP = ("arguments_key", "phase", "cell_type")
_CLOSURE_SKIP = ("hash_obj",)  # MindSpore's jit wrapper closes over an object id


def describe(value, depth=0, seen=None):
    """A deterministic, plain-data description of what a cell attribute contributes to its graph: numbers, strings,
    dtypes, shapes, the bytes of constant tensors and arrays, primitives with their attributes, functions by name
    and the values they close over; objects by class and their own attributes. Addresses and ids are left out."""
    import mindspore as ms
    from mindspore import nn
    from mindspore.ops.primitive import Primitive

    seen = set() if seen is None else seen
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return repr(value)  # exact, and nan/inf survive JSON
    if depth > 6:
        return type(value).__qualname__
    if isinstance(value, ms.Parameter):
        return ["parameter", value.name, list(value.shape), str(value.dtype), bool(value.requires_grad)]
    if isinstance(value, ms.Tensor):
        a = value.asnumpy()
        return ["tensor", str(value.dtype), list(a.shape), hashlib.sha256(a.tobytes()).hexdigest()[:16]]
    if isinstance(value, np.ndarray):
        return ["array", str(value.dtype), list(value.shape), hashlib.sha256(value.tobytes()).hexdigest()[:16]]
    if isinstance(value, np.generic):
        return repr(value.item())
    if isinstance(value, ms.dtype.Type):
        return ["dtype", str(value)]
    if isinstance(value, nn.Cell):
        return ["cell", type(value).__qualname__]  # its own contents are described where the walk reaches it
    if isinstance(value, Primitive):
        return ["primitive", value.name, describe(dict(value.attrs), depth + 1, seen)]
    if id(value) in seen:
        return ["cycle", type(value).__qualname__]
    seen = seen | {id(value)}
    if isinstance(value, dict):
        return {str(k): describe(v, depth + 1, seen) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return [type(value).__name__, [describe(v, depth + 1, seen) for v in items]]
    if isinstance(value, (types.FunctionType, types.MethodType, functools.partial)):
        fn = getattr(value, "func", None) or getattr(value, "__func__", value)
        code = getattr(fn, "__code__", None)
        closure = {name: c.cell_contents for name, c in zip(code.co_freevars if code else (),
                                                            getattr(fn, "__closure__", None) or ())
                   if name not in _CLOSURE_SKIP and _filled(c)}
        closure["args"] = list(getattr(value, "args", ()))
        closure["keywords"] = dict(getattr(value, "keywords", None) or {})
        return ["function", getattr(fn, "__module__", ""), getattr(fn, "__qualname__", type(fn).__name__),
                describe(closure, depth + 1, seen)]
    if inspect.isclass(value) or isinstance(value, types.ModuleType):
        return ["name", getattr(value, "__module__", ""), getattr(value, "__qualname__", value.__name__)]
    attrs = getattr(value, "__dict__", None)
    if attrs is None and hasattr(type(value), "__slots__"):
        attrs = {k: getattr(value, k) for k in type(value).__slots__ if hasattr(value, k)}
    if attrs is not None:
        return ["object", type(value).__module__, type(value).__qualname__, describe(dict(attrs), depth + 1, seen)]
    return ["value", type(value).__qualname__, _ADDRESS.sub("", repr(value))]


def _filled(cell):
    try:
        cell.cell_contents
        return True
    except ValueError:
        return False


def describe_cell(cell):
    """One cell's own contribution to the graph: class, attributes, primitives, parameters (children are walked by
    the caller)."""
    attrs = {k: v for k, v in vars(cell).items() if not k.startswith("_") and k not in _CELL_SKIP}
    attrs.update({k: vars(cell)[k] for k in _CELL_PRIVATE if k in vars(cell)})
    attrs["primitives"] = dict(cell._primitives)
    attrs["parameters"] = [describe(p) for p in cell._params.values() if p is not None]
    return [type(cell).__module__, type(cell).__qualname__, describe(attrs)]


def input_spec(inputs):
    """Shapes and dtypes of the step's inputs (a tuple of tensors per compiled cell)."""
    return [[[list(x.shape), str(x.dtype)] if hasattr(x, "shape") else describe(x) for x in cell_inputs]
            for cell_inputs in inputs]


def step_fingerprint(cells, inputs):
    """SHA-256 of everything the step's graphs are built from: each cell of each step cell, depth first, with its
    name in the tree, and the shapes and dtypes of the step's inputs."""
    h = hashlib.sha256()
    for top in cells:
        for name, cell in top.cells_and_names():
            h.update(json.dumps([name, describe_cell(cell)], sort_keys=True, default=str).encode())
    h.update(json.dumps(input_spec(inputs)).encode())
    return h.hexdigest()


def graph_config(cfg_dict):
    """The config's part of the key: every key but the proven host-only ones."""
    import copy

    d = copy.deepcopy(cfg_dict)
    for path in HOST_ONLY:
        section, key = path.split(".", 1)
        d.get(section, {}).pop(key, None)
    return d


def mindspore_switches():
    """MindSpore's developer switches (MS_DEV_*) of this process: several change how graphs compile."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("MS_DEV_")}


def cache_key(cfg, cells, inputs, world_size, purpose):
    import mindspore as ms

    blob = json.dumps({"config": graph_config(to_dict(cfg)), "step": step_fingerprint(cells, inputs),
                       "world_size": world_size, "purpose": purpose, "mindspore": ms.__version__,
                       "switches": mindspore_switches(), "code": _code_digest()}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def run_identity(cfg, manifest):
    """What decides the first step's numbers beyond the graph: the whole config (seed, initial weights, data order)
    and the dataset's content (its splits' sizes and checksums; not where it lies). Only a fresh start with the
    filling run's identity is compared value for value."""
    d = to_dict(cfg)
    for key in ("dataset_dir", "source"):
        d["data"].pop(key, None)
    blob = json.dumps({"config": d, "dataset": manifest.get("splits"), "blend": manifest.get("blend")},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


# --- MindSpore's switch ---------------------------------------------------------------------------------------

def cache_root():
    from ms_llm import env

    return env.cache_root()


def unusable_reason():
    """Why MindSpore's compile cache cannot run in this process, or None. MindSpore parses the entry script
    (sys.argv[0]) for the source files the graph depends on, at every compile with the cache on; a process started
    with `python -c`, a notebook or a REPL has no such file, and the compile would fail on it."""
    entry = sys.argv[0] if sys.argv else ""
    if not os.path.isfile(os.path.realpath(entry)):
        return (f"this process has no entry script for MindSpore to read (sys.argv[0] = {entry!r}: python -c, a "
                f"notebook or a REPL); run a script or `ms-llm train` to reuse compiled graphs")
    return None


def enable(path):
    """Point MindSpore's compile cache at an entry, through its environment variables (read at each compile;
    set_context's switches are deprecated). Only ever around the step's own compile."""
    os.environ["MS_COMPILER_CACHE_PATH"] = path
    os.environ["MS_COMPILER_CACHE_ENABLE"] = "1"


def close():
    """Stop caching. Called right after the step compiles, and before any graph of a command is compiled
    (context.select_device): MindSpore's switch is an environment variable, so one exported by the user (MindSpore's
    docs suggest it) or inherited from a process whose run failed mid-compile would otherwise cache every graph under
    MindSpore's key of the source files alone — `ms-llm sample` then ran a graph of another model (a Gather index out
    of range, or wrong numbers)."""
    os.environ["MS_COMPILER_CACHE_ENABLE"] = "0"
    os.environ.pop("MS_COMPILER_CACHE_PATH", None)


# --- what a compiled graph is ---------------------------------------------------------------------------------

def _phase(cell):
    return cell.phase_cache["train"]


def cell_graph_executor():
    """MindSpore's (private) executor of cell graphs. It moved from mindspore.common.api to mindspore.graph.api in
    MindSpore 2.9, which keeps the old module as a deprecated alias; 2.8 and older have only the old one."""
    try:
        from mindspore.graph.api import _cell_graph_executor
    except ImportError:  # MindSpore <= 2.8
        from mindspore.common.api import _cell_graph_executor
    return _cell_graph_executor


def graph_parameter_names(cell):
    """Names of the parameters the compiled graph of `cell` reads or writes. MindSpore has no public API for
    this; tests/test_compile_cache.py fails the day this private call changes."""
    return list(cell_graph_executor()._graph_executor.get_params(_phase(cell)))


def unowned_parameters(cell):
    """Parameters the compiled graph of `cell` uses but the cell does not own: each would be a private copy in a
    graph loaded from the cache."""
    owned = cell.parameters_dict()
    return [n for n in graph_parameter_names(cell) if n not in owned]


def _type_text(t):
    """A graph value's type from MindSpore's IR: dtype and shape where the IR has them, tuples element by element."""
    from mindspore.train import anf_ir_pb2

    if t.data_type == anf_ir_pb2.DT_TENSOR:
        return [anf_ir_pb2.DataType.Name(t.tensor_type.elem_type), [d.size for d in t.tensor_type.shape.dim]]
    if t.data_type == anf_ir_pb2.DT_TUPLE:
        return [_type_text(e) for e in t.sequence_type.elem_types]
    return anf_ir_pb2.DataType.Name(t.data_type)


def graph_signature(cell):
    """MindSpore's own view of the compiled (or loaded) graph of `cell`: its parameters (inputs, then the weights it
    binds) and its outputs, each with dtype and shape, from the graph's IR."""
    from mindspore.train import anf_ir_pb2

    model = anf_ir_pb2.ModelProto()
    model.ParseFromString(cell_graph_executor()._graph_executor.get_func_graph_proto(_phase(cell), "anf_ir"))
    g = model.graph
    return {"parameters": [[p.name, _type_text(p.type)] for p in g.parameters],
            "outputs": [_type_text(o.type) for o in g.outputs]}


def expected_parameters(cell, inputs):
    """The graph parameters a compile of `cell` on `inputs` must have: one per input, then weights of the cell's own."""
    owned = cell.parameters_dict()
    return len(inputs), {n: [list(p.shape), str(p.dtype)] for n, p in owned.items()}


def recompile(cells, inputs):
    """Drop the graphs of `cells` (loaded from the cache) and compile them afresh (the compile cache must be off)."""
    executor = cell_graph_executor()
    for cell, x in zip(cells, inputs):
        executor.del_net_res(cell, set(cell.compile_cache))
        cell.compile_cache.clear()
        cell.compile(*x)


def small_parameter_sums(step_fn):
    """Sums and sums of squares of the small (0-d and 1-d) parameters of the step: norm gains, biases, their
    AdamW moments, the loss scale and counters. A host copy of a few MB even for a 70B model, and they move
    with the learning rate, clipping, betas and loss scaling of the update."""
    out = []
    for p in sorted(step_fn.get_parameters(), key=lambda p: p.name):
        if len(p.shape) <= 1 and not p.name.startswith(("grad_accum.", "accu_grads.")):
            a = p.asnumpy().astype("float64")
            out.append([p.name, float(a.sum()), float((a * a).sum())])
    return out


def describe_outputs(outputs):
    """The step's outputs as a record keeps them: dtype, shape, and the values (up to 64 of them; a larger output
    by its sum and sum of squares)."""
    out = []
    for x in outputs:
        a = np.asarray(x.asnumpy() if hasattr(x, "asnumpy") else x)
        v = a.astype("float64").ravel()
        values = [float(u) for u in v] if v.size <= 64 else [float(v.sum()), float((v * v).sum())]
        out.append({"dtype": str(a.dtype), "shape": list(a.shape), "values": values})
    return out


def _close(a, b):
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= RTOL * max(abs(a), abs(b)) + 1e-12


def output_difference(recorded, seen):
    """None when the outputs agree in number, dtype and shape, else what differs first."""
    if not isinstance(recorded, list) or len(recorded) != len(seen):
        return f"{len(seen)} outputs, the entry recorded {len(recorded) if isinstance(recorded, list) else recorded!r}"
    for i, (a, b) in enumerate(zip(recorded, seen)):
        if not isinstance(a, dict) or a.get("dtype") != b["dtype"] or a.get("shape") != b["shape"]:
            return (f"output {i} is {b['dtype']} {b['shape']}, the entry recorded "
                    f"{a.get('dtype') if isinstance(a, dict) else a!r} {a.get('shape') if isinstance(a, dict) else ''}")
    return None


def first_difference(recorded, seen):
    """None when two first-step records agree (outputs: number, dtype, shape and values; the small parameters before
    the step and their change), else a short description of the first difference. Never raises on a malformed
    record: anything unreadable is a difference."""
    try:
        diff = output_difference(recorded.get("outputs"), seen["outputs"])
        if diff:
            return diff
        for i, (a, b) in enumerate(zip(recorded["outputs"], seen["outputs"])):
            if len(a["values"]) != len(b["values"]) or not all(_close(u, v) for u, v in zip(a["values"], b["values"])):
                return f"output {i}: recorded {a['values'][:4]}, now {b['values'][:4]}"
        for field in ("before", "change"):
            a, b = recorded.get(field), seen.get(field)
            if not isinstance(a, list) or len(a) != len(b):
                return f"{field}: recorded {a!r:.80}, now {len(b)} parameters"
            for x, y in zip(a, b):
                if not isinstance(x, list) or len(x) != len(y) or x[0] != y[0] or \
                        not all(_close(u, v) for u, v in zip(x[1:], y[1:])):
                    return f"{field}: recorded {x}, now {y}"
    except (TypeError, KeyError, AttributeError, IndexError, ValueError) as e:
        return f"the record cannot be read ({type(e).__name__}: {e})"
    return None


# --- one entry -----------------------------------------------------------------------------------------------

class Entry:
    """The compile cache entry of one step, and the checks that decide whether its graphs can be trusted."""

    def __init__(self, key, rank):
        self.key = key
        self.path = os.path.join(cache_root(), "compile", key)
        self.rank_dir = os.path.join(self.path, f"rank_{rank}")
        self.record_path = os.path.join(self.rank_dir, RECORD)
        self.hit = os.path.isdir(os.path.join(self.rank_dir, "graph_cache"))
        self.record = self._read_record() if self.hit else None

    def _read_record(self):
        """The record of the run that filled the entry, or a string saying why there is none to trust."""
        try:
            with open(self.record_path, encoding="utf-8") as f:
                record = json.load(f)
        except FileNotFoundError:
            return "the entry has no first_step.json"
        except (OSError, ValueError) as e:
            return f"its first_step.json is unreadable ({type(e).__name__})"
        if not isinstance(record, dict) or record.get("version") != RECORD_VERSION or record.get("key") != self.key:
            return "its first_step.json is not a record of this entry"
        return record

    def discard(self):
        shutil.rmtree(self.rank_dir, ignore_errors=True)

    @contextlib.contextmanager
    def locked(self):
        """Hold the rank's entry while compiling and checking: two processes of one machine (a sweep's trials, two
        test workers) filling the same entry at once would write one set of files together; the second waits, then
        loads what the first wrote and recorded."""
        os.makedirs(os.path.dirname(self.rank_dir), exist_ok=True)
        with open(self.rank_dir + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if not self.hit and os.path.isdir(os.path.join(self.rank_dir, "graph_cache")):
                    self.hit, self.record = True, self._read_record()  # filled while this process waited
                yield self
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def compile(self, cells, inputs):
        """Compile the step's graphs with this entry as MindSpore's cache (loading them on a hit), then stop caching."""
        enable(self.path)
        try:
            for cell, x in zip(cells, inputs):
                cell.compile(*x)
        finally:  # a failed compile must not leave caching on for the graphs compiled after it
            close()

    def signature_mismatch(self, cells, inputs):
        """None when each graph takes the step's inputs, binds the cell's own parameters with their shapes and dtypes
        and (on a hit) has the outputs the filling run recorded; else what differs first. Never raises."""
        try:
            for i, (cell, x) in enumerate(zip(cells, inputs)):
                sig = graph_signature(cell)
                n_inputs, owned = expected_parameters(cell, x)
                params = sig["parameters"]
                spec = [[str(t.dtype), list(t.shape)] for t in x]
                got = [[_dtype_name(p[1]), p[1][1]] if isinstance(p[1], list) and len(p[1]) == 2 else p[1]
                       for p in params[:n_inputs]]
                if len(params) < n_inputs or got != spec:
                    return f"{type(cell).__name__}'s graph takes {got}, the step gives {spec}"
                for name, t in params[n_inputs:]:
                    if name not in owned:
                        continue  # a parameter the cell does not own: the binding check names it
                    if [_dtype_name(t), t[1]] != [owned[name][1], owned[name][0]]:
                        return f"{type(cell).__name__}'s graph binds {name} as {t}, the cell has {owned[name]}"
                if self.hit:
                    if not isinstance(self.record, dict):
                        return self.record
                    recorded = self.record.get("signatures")
                    if not isinstance(recorded, list) or i >= len(recorded) or recorded[i] != sig["outputs"]:
                        return (f"{type(cell).__name__}'s graph returns {sig['outputs']}, the entry recorded "
                                f"{recorded[i] if isinstance(recorded, list) and i < len(recorded) else 'none'}")
        except Exception as e:  # noqa: BLE001 (whatever MindSpore or the record holds: a mismatch, not a crash)
            return f"its graphs cannot be read ({type(e).__name__}: {e})"
        return None

    def write_record(self, cells, identity, first_step=None):
        """Record what a filling run compiled (the graphs' output signatures) and, on a fresh start, what its first
        step did. Written atomically; a failure to write leaves the entry without a record (then never reused)."""
        record = {"version": RECORD_VERSION, "key": self.key, "identity": identity,
                  "signatures": [graph_signature(c)["outputs"] for c in cells], "first_step": first_step}
        try:
            os.makedirs(self.rank_dir, exist_ok=True)
            tmp = self.record_path + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(record, f)
            os.replace(tmp, self.record_path)
        except OSError:
            self.discard()

    def recorded_first_step(self, identity):
        """The filling run's first step, when that run was this one (same identity, a fresh start); else None."""
        r = self.record
        if isinstance(r, dict) and r.get("identity") == identity and isinstance(r.get("first_step"), dict):
            return r["first_step"]
        return None


def _dtype_name(t):
    """IR dtype (DT_FLOAT32) → MindSpore's name (Float32), for comparison with a tensor's dtype."""
    if not isinstance(t, list) or not t or not isinstance(t[0], str):
        return str(t)
    name = (t[0][3:] if t[0].startswith("DT_") else t[0]).capitalize()
    return name.replace("Bfloat", "BFloat").replace("Uint", "UInt")


def first_step_record(outputs, before, after):
    """What a fresh start's first step did: its outputs, the small parameters before it, and how the update changed
    them (the change, not the values after it, carries the learning rate: a 1e-5 step on a gain of 1.0 hides in
    the value's rounding)."""
    change = [[a[0], a[1] - b[1], a[2] - b[2]] for a, b in zip(after, before)]
    return {"outputs": describe_outputs(outputs), "before": before, "change": change}
