"""MindSpore's compile cache for the training step, keyed so that a cached graph is only ever reused for the
same graph, and checked so that a reused graph is never trusted blindly.

MindSpore keys its cache by the Python sources alone: a 4-layer run after a 24-layer run with the same
cache directory silently executes the 24-layer graph. So each distinct (config, code, MindSpore
version, world size, purpose) gets its own directory. What does not change the compiled graph (logging,
evaluation and checkpoint cadence, monitoring) is left out of the key, so a resumed run, a benchmark and
a run with another log interval share one entry. A hit turns a 13 s compile (24-layer quickstart on CPU)
into 1.5 s; on Ascend, where big models compile for many minutes, it is what makes a restart cheap.

Two checks guard a hit (`Guard`):
- Binding. A graph loaded from the cache is bound to the parameters its Cell owns (`parameters_dict`); any
  other parameter it reads or writes (one captured only by a closure, say) becomes a private copy that
  starts at zero and is never seen again. A fresh compile binds the real objects, so such a graph trains
  right when compiled and wrong when reused. Every step graph is checked before it runs, filling or reusing.
- Behaviour. The run that fills an entry from a fresh start records its first step (outputs, and sums of
  the small parameters and moments, and their change in the update). A later fresh start of the same config reusing the
  entry must reproduce them, or the entry is discarded and the step compiled afresh.
"""
import copy
import glob
import hashlib
import json
import math
import os
import shutil
import sys

from ms_llm.config import to_dict

HOST_ONLY = {"train": ("log_interval", "eval_interval", "eval_steps", "stop_at_step"),
             "data": ("num_workers", "source")}
HOST_ONLY_SECTIONS = ("monitor", "checkpoint")
RECORD = "first_step.json"
# The first step of a fresh start, reused against filled: equal on CPU to the bit; the tolerance leaves room
# for devices whose reductions are not deterministic (a wrong graph differs by far more).
RTOL = 1e-4


class CacheMismatch(Exception):
    """A reused graph did not reproduce the step it was cached from; the caller starts again uncached."""


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


def cache_key(cfg, world_size, purpose):
    import mindspore as ms

    d = copy.deepcopy(to_dict(cfg))
    for section in HOST_ONLY_SECTIONS:
        d.pop(section, None)
    for section, keys in HOST_ONLY.items():
        for k in keys:
            d[section].pop(k, None)
    blob = json.dumps({"config": d, "world_size": world_size, "purpose": purpose, "mindspore": ms.__version__,
                       "code": _code_digest()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def cache_root():
    return os.environ.get("MS_LLM_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "ms_llm"))


def unusable_reason():
    """Why MindSpore's compile cache cannot run in this process, or None. MindSpore parses the entry script
    (sys.argv[0]) for the source files the graph depends on, at every compile with the cache on; a process started
    with `python -c`, a notebook or a REPL has no such file, and the compile would fail on it."""
    entry = sys.argv[0] if sys.argv else ""
    if not os.path.isfile(os.path.realpath(entry)):
        return (f"this process has no entry script for MindSpore to read (sys.argv[0] = {entry!r}: python -c, a "
                f"notebook or a REPL); run a script or `ms-llm train` to reuse compiled graphs")
    return None


def enable(cfg, rt, purpose="train"):
    """Point MindSpore's compile cache at this graph's own directory. Returns a Guard for the entry.

    Through MindSpore's environment variables, read at each compile (set_context's switches are deprecated)."""
    key = cache_key(cfg, rt.world_size, purpose)
    path = os.path.join(cache_root(), "compile", key)
    rank_dir = os.path.join(path, f"rank_{rt.rank}")
    hit = os.path.isdir(os.path.join(rank_dir, "graph_cache"))
    os.environ["MS_COMPILER_CACHE_PATH"] = path
    os.environ["MS_COMPILER_CACHE_ENABLE"] = "1"
    return Guard(key, path, rank_dir, hit)


def close():
    """Stop caching once the training step is compiled. MindSpore numbers cached graphs in compile order
    (compile_cache_0, _1, ...), and later graphs (evaluation, statistics probes, the NaN hunter) depend on
    run settings left out of the key: caching them would hand one run another run's graph.

    Also called before any graph of a command is compiled (context.select_device): MindSpore's switch is an
    environment variable, so one exported by the user (MindSpore's docs suggest it) or inherited from a process
    whose run failed mid-compile would otherwise cache every graph under MindSpore's key of the source files
    alone — `ms-llm sample` then ran a graph of another model (a Gather index out of range, or wrong numbers)."""
    os.environ["MS_COMPILER_CACHE_ENABLE"] = "0"
    os.environ.pop("MS_COMPILER_CACHE_PATH", None)


def graph_parameter_names(cell):
    """Names of the parameters the compiled graph of `cell` reads or writes. MindSpore has no public API for
    this; tests/test_compile_cache.py fails the day this private call changes."""
    from mindspore.graph.api import _cell_graph_executor

    return list(_cell_graph_executor._graph_executor.get_params(cell.phase_cache["train"]))


def unowned_parameters(cell):
    """Parameters the compiled graph of `cell` uses but the cell does not own: each would be a private copy in a
    graph loaded from the cache."""
    owned = cell.parameters_dict()
    return [n for n in graph_parameter_names(cell) if n not in owned]


def recompile(cells, batches):
    """Drop the loaded graphs of `cells` and compile them afresh (the compile cache must be off)."""
    from mindspore.graph.api import _cell_graph_executor

    for cell, batch in zip(cells, batches):
        _cell_graph_executor.del_net_res(cell, set(cell.compile_cache))
        cell.compile_cache.clear()
        cell.compile(*batch) if isinstance(batch, tuple) else cell.compile(batch)


def fingerprint(step_fn):
    """Sums and sums of squares of the small (0-d and 1-d) parameters of the step: norm gains, biases, their
    AdamW moments, the loss scale and counters. A host copy of a few MB even for a 70B model, and they move
    with the learning rate, clipping, betas and loss scaling of the update."""
    out = []
    for p in sorted(step_fn.get_parameters(), key=lambda p: p.name):
        if len(p.shape) <= 1 and not p.name.startswith(("grad_accum.", "accu_grads.")):
            a = p.asnumpy().astype("float64")
            out.append([p.name, float(a.sum()), float((a * a).sum())])
    return out


def _close(a, b):
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= RTOL * max(abs(a), abs(b)) + 1e-12


def first_difference(recorded, seen):
    """None when two first-step records agree, else a short description of the first difference."""
    for field in ("outputs", "before", "change"):
        a, b = recorded.get(field), seen.get(field)
        if a is None or len(a) != len(b):
            return f"{field}: recorded {a!r}, now {b!r}"
        for x, y in zip(a, b):
            xs, ys = (x, y) if isinstance(x, list) else ([x], [y])
            if len(xs) != len(ys) or not all(_close(u, v) for u, v in zip(xs, ys)):
                return f"{field}: recorded {x}, now {y}"
    return None


class Guard:
    """The compile cache entry of one run, and the checks that decide whether its graphs can be trusted."""

    def __init__(self, key, path, rank_dir, hit):
        self.key, self.path, self.rank_dir, self.hit = key, path, rank_dir, hit
        self.discarded = False
        self.record_path = os.path.join(rank_dir, RECORD)

    def discard(self):
        shutil.rmtree(self.rank_dir, ignore_errors=True)

    def check_binding(self, cells, batches, log):
        """Compile (or load) the step's graphs, stop caching, and make sure every graph is bound to the
        parameters of its cell; a graph that is not gets compiled afresh (when loaded) and the entry dropped."""
        try:
            for cell, batch in zip(cells, batches):
                cell.compile(*batch) if isinstance(batch, tuple) else cell.compile(batch)  # a tuple: the step's inputs
        finally:  # a failed compile must not leave caching on for the graphs compiled after it
            close()
        bad = {type(c).__name__: unowned_parameters(c) for c in cells}
        bad = {k: v for k, v in bad.items() if v}
        if not bad:
            return
        names = "; ".join(f"{k} reads {len(v)} parameter(s) it does not own, e.g. {v[0]}" for k, v in bad.items())
        self.discard()
        self.discarded = True
        if self.hit:
            recompile(cells, batches)
            log(f"warning: compile cache entry {self.path} discarded and the step compiled afresh: {names}")
        else:
            log(f"warning: the training step was not cached ({names}); a graph loaded from the cache would read "
                f"private copies of those parameters")

    def first_step_record(self, outputs, before, after):
        """What a fresh start's first step did: its outputs, the small parameters before it, and how the update
        changed them (the change, not the values after it, carries the learning rate: a 1e-5 step on a gain of
        1.0 hides in the value's rounding)."""
        change = [[a[0], a[1] - b[1], a[2] - b[2]] for a, b in zip(after, before)]
        return {"key": self.key, "outputs": [float(x) for x in outputs], "before": before, "change": change}

    def check_first_step(self, seen):
        """Compare a fresh start's first step with the one recorded when the entry was filled (on a hit), or
        record it (on a fill). Raises CacheMismatch when a reused graph computed something else."""
        if self.discarded:
            return
        if not self.hit:
            os.makedirs(self.rank_dir, exist_ok=True)
            tmp = self.record_path + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(seen, f)
            os.replace(tmp, self.record_path)
            return
        try:
            with open(self.record_path, encoding="utf-8") as f:
                recorded = json.load(f)
        except (OSError, ValueError):
            return  # filled by a resumed run: nothing to compare against (the binding check still ran)
        diff = "entry filled for another config" if recorded.get("key") != self.key else \
            first_difference(recorded, seen)
        if diff:
            self.discard()
            raise CacheMismatch(f"the compile cache entry {self.path} did not reproduce the first step it was "
                                f"filled with ({diff}); it was discarded and the run restarts with a fresh compile")
