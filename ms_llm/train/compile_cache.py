"""MindSpore's compile cache for the training step, keyed so that a cached graph is only ever reused for the
same graph.

MindSpore keys its cache by the Python sources alone: a 4-layer run after a 24-layer run with the same
cache directory silently executes the 24-layer graph. So each distinct (config, code, MindSpore
version, world size, purpose) gets its own directory. What does not change the compiled graph (logging,
evaluation and checkpoint cadence, monitoring) is left out of the key, so a resumed run, a benchmark and
a run with another log interval share one entry. A hit turns a 13 s compile (24-layer quickstart on CPU)
into 1.5 s; on Ascend, where big models compile for many minutes, it is what makes a restart cheap.
"""
import copy
import glob
import hashlib
import json
import os

from ms_llm.config import to_dict

HOST_ONLY = {"train": ("log_interval", "eval_interval", "eval_steps"), "data": ("num_workers", "source")}
HOST_ONLY_SECTIONS = ("monitor", "checkpoint")


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


def close():
    """Stop caching once the training step is compiled. MindSpore numbers cached graphs in compile order
    (compile_cache_0, _1, ...), and later graphs (evaluation, statistics probes, the NaN hunter) depend on
    run settings left out of the key: caching them would hand one run another run's graph."""
    import mindspore as ms

    ms.set_context(enable_compile_cache=False)


def enable(cfg, rt, purpose="train"):
    """Point MindSpore's compile cache at this graph's own directory. Returns (path, hit)."""
    import mindspore as ms

    base = os.environ.get("MS_LLM_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "ms_llm"))
    path = os.path.join(base, "compile", cache_key(cfg, rt.world_size, purpose))
    hit = os.path.isdir(os.path.join(path, f"rank_{rt.rank}", "graph_cache"))
    ms.set_context(enable_compile_cache=True, compile_cache_path=path)
    return path, hit
