"""Looking inside one step: per-module forward outputs and per-parameter gradients, in PyNative mode.

Training runs compiled (graph mode), where intermediate tensors are not observable. The probe switches
MindSpore to PyNative for one forward/backward on a given batch, with a forward hook on every cell (in
execution order), then switches back; compiled training graphs stay cached, so training continues
without recompiling. This is the instrument behind the NaN hunter, tensor statistics and dumps.
"""
from contextlib import contextmanager

import numpy as np


@contextmanager
def pynative():
    import mindspore as ms

    previous = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        yield
    finally:
        ms.set_context(mode=previous)


def stats(a):
    """Summary statistics of an array, robust to non-finite values."""
    a = np.asarray(a, dtype=np.float64)
    finite = np.isfinite(a)
    f = a[finite]
    return {"mean": float(f.mean()) if f.size else float("nan"), "std": float(f.std()) if f.size else float("nan"),
            "max_abs": float(np.abs(f).max()) if f.size else float("nan"),
            "norm": float(np.sqrt((f * f).sum())), "zero_frac": float((a == 0).mean()) if a.size else 0.0,
            "nonfinite": int(a.size - finite.sum())}


def _first(x):
    return x[0] if isinstance(x, (tuple, list)) else x


def trace_forward(model, ids, keep=False):
    """[(module name, input stats, output stats, output array or None)] in execution order.

    Inputs are summarised over their floating-point tensors (token ids are not activations)."""
    import mindspore as ms

    records = []

    def hook(name):
        def fn(cell, inputs, output):
            floats = [x.asnumpy() for x in inputs if isinstance(x, ms.Tensor) and x.dtype in (ms.float16, ms.float32,
                                                                                             ms.bfloat16)]
            out = _first(output).asnumpy()
            in_stats = stats(np.concatenate([f.ravel() for f in floats])) if floats else None
            records.append((name, in_stats, stats(out), out.copy() if keep else None))
        return fn

    with pynative():
        handles = [c.register_forward_hook(hook(n)) for n, c in model.cells_and_names() if n]
        try:
            logits = model(ids[:, :-1]).asnumpy()
        finally:
            for h in handles:
                h.remove()
    records.append(("logits", None, stats(logits), logits if keep else None))
    return records


def param_grads(model, ids, loss_fn=None):
    """(loss, {parameter name: gradient}) of the mean next-token loss on `ids`, in PyNative."""
    import mindspore as ms

    from ms_llm.train.losses.base import cross_entropy

    params = model.trainable_params()
    loss_fn = loss_fn or (lambda x: cross_entropy(model(x[:, :-1]), x[:, 1:]))
    with pynative():
        loss, grads = ms.value_and_grad(loss_fn, None, params)(ids)
        return float(loss.asnumpy()), {p.name: g.asnumpy() for p, g in zip(params, grads)}


def execution_order(records):
    """Module names in forward execution order (first appearance)."""
    seen, order = set(), []
    for name, *_ in records:
        if name not in seen:
            seen.add(name)
            order.append(name)
    return order
