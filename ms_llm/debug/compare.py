"""Layer-by-layer dumps and their comparison: where do two runs part?

`ms-llm debug dump --run-dir D [--step N] [--set precision.compute_dtype=float16] --output DUMP` loads the
run's checkpoint, takes a fixed batch (the first validation batch) and writes every module's forward
output and every parameter's gradient as plain .npz plus an index.json and the batch — so a dump made on
Ascend can be compared on a laptop. The format is the one ms_llm.interop.torch_dump writes for PyTorch models
(docs/debugging.md, "The dump format"). `ms-llm compare A B` prints, per module in execution order, the max abs error,
the max relative error (to B's largest magnitude) and the cosine similarity, and names the first module
beyond tolerance.
"""
import os

import numpy as np

from ms_llm.errors import UserError
from ms_llm.interop.torch_dump import read_dump, write_dump


def make_dump(run_dir, out_dir, step=None, overrides=(), batch_size=None, log=print):
    from ms_llm.data.loader import eval_batches
    from ms_llm.data.manifest import load_manifest
    from ms_llm.debug.probe import param_grads, trace_forward
    from ms_llm.train.setup.context import setup_context
    from ms_llm.train.setup.run_model import find_run_checkpoint, load_run_config, load_run_model

    setup_context(load_run_config(run_dir, overrides).context)
    path, manifest = find_run_checkpoint(run_dir, step, log)
    step = manifest["step"]
    cfg, model, _ = load_run_model(run_dir, overrides=overrides, checkpoint=path)
    data_manifest = load_manifest(cfg.data.dataset_dir, blend=cfg.data.blend)
    batch = eval_batches(cfg.data.dataset_dir, data_manifest, batch_size or cfg.train.micro_batch_size, 1,
                         seq_length=cfg.model.seq_length)[0]
    records = trace_forward(model, batch, keep=True)
    loss, grads = param_grads(model, batch)
    forward = {}
    for name, _, _, arr in records:
        forward.setdefault(name, arr)  # a module called twice keeps its first output
    import mindspore as ms

    index = write_dump(out_dir, forward, grads, batch.asnumpy(), {
        "framework": f"mindspore {ms.__version__}", "names": "ms_llm", "step": step, "loss": loss,
        "compute_dtype": cfg.precision.compute_dtype, "device": cfg.context.device_target,
        "run_dir": os.path.abspath(run_dir)})
    log(f"dumped {len(forward)} module outputs and {len(grads)} gradients (step {step}, "
        f"{cfg.precision.compute_dtype}, loss {loss:.4f}) → {out_dir}")
    return index


def load_dump(path):
    """(index, forward, grads) of a dump (format: ms_llm.interop.torch_dump, one for MindSpore and PyTorch)."""
    if not os.path.isfile(os.path.join(path, "index.json")):
        raise UserError(f"'{path}' is not a dump (no index.json). Make one with `ms-llm debug dump --run-dir D "
                        f"--output {path}`.")
    return read_dump(path)


def errors(a, b):
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    finite = np.isfinite(a) & np.isfinite(b)
    if not finite.all():
        return {"max_abs": float("inf"), "max_rel": float("inf"), "cosine": float("nan"),
                "nonfinite": int((~finite).sum())}
    diff = np.abs(a - b)
    scale = max(np.abs(b).max(), 1e-30)
    cos = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-300))
    return {"max_abs": float(diff.max()), "max_rel": float(diff.max() / scale), "cosine": cos, "nonfinite": 0}


def compare(path_a, path_b, rtol=1e-2, min_cosine=0.999):
    ia, fa, ga = load_dump(path_a)
    ib, fb, gb = load_dump(path_b)
    if ia["batch_sha256"] != ib["batch_sha256"]:
        raise UserError("the two dumps were made on different batches (batch_sha256 differs): dump both from the "
                        "same run's data so the comparison means something.")
    rows = []
    for kind, xa, xb, names in (("forward", fa, fb, ia["modules"]), ("gradient", ga, gb, list(reversed(ia["parameters"])))):
        for name in names:
            if name not in xb or xa[name].shape != xb[name].shape:
                rows.append({"kind": kind, "name": name, "missing": True})
                continue
            e = errors(xa[name], xb[name])
            e.update(kind=kind, name=name, beyond=e["max_rel"] > rtol or not e["cosine"] >= min_cosine)
            rows.append(e)
    first = next((r for r in rows if r.get("beyond") or r.get("missing")), None)
    return {"a": ia, "b": ib, "rows": rows, "first_divergent": first, "rtol": rtol, "min_cosine": min_cosine}


def describe(index):
    """One line on where a dump came from: a run's checkpoint (ms-llm debug dump) or a PyTorch model (torch_dump)."""
    where = index.get("run_dir") or index.get("model") or "?"
    step = f" step {index['step']}" if index.get("step") is not None else ""
    return (f"{where}{step} {index.get('framework', 'mindspore')} {index.get('compute_dtype')} on "
            f"{index.get('device')}")


def format_comparison(r):
    lines = [f"A: {describe(r['a'])}", f"B: {describe(r['b'])}",
             f"{'':2}{'module / parameter':<44}{'max abs':>11}{'max rel':>11}{'cosine':>10}"]
    for row in r["rows"]:
        if row.get("missing"):
            lines.append(f"! {row['name']:<44} missing or different shape in B")
            continue
        mark = "!" if row["beyond"] else " "
        label = row["name"] if row["kind"] == "forward" else f"grad {row['name']}"
        lines.append(f"{mark} {label:<44}{row['max_abs']:>11.3g}{row['max_rel']:>11.3g}{row['cosine']:>10.6f}")
    first = r["first_divergent"]
    if first is None:
        lines.append(f"no divergence beyond max rel {r['rtol']:g} / cosine {r['min_cosine']}")
    else:
        lines.append(f"first divergence: {first['kind']} {first['name']} (max rel > {r['rtol']:g} or cosine < "
                     f"{r['min_cosine']})")
    return "\n".join(lines)
