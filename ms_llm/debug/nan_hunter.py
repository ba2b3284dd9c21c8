"""Where did the first NaN/Inf come from? Replays one step with every module instrumented.

Forward: the first module, in execution order, whose output is non-finite while its inputs were finite
is where the value was created (a module fed non-finite inputs only propagated it). Backward: the first
non-finite parameter gradient in reverse execution order is where the backward pass broke. The cause
is then named from what that module computes: for attention the scaled QK^T scores are recomputed in
float32 and compared with the float16 range, the classic overflow of long sequences or large weights.
"""
import math

import numpy as np

from ms_llm.data.loader import check_token_ids
from ms_llm.debug.probe import execution_order, param_grads, pynative, stats, trace_forward

FP16_MAX = 65504.0


def attention_scores(model, layer_name, ids):
    """Max |scaled QK^T| of one attention layer, recomputed in float32 from its own inputs."""
    import mindspore as ms

    attention = dict(model.cells_and_names())[layer_name.rsplit(".core", 1)[0]]
    core = attention.core
    captured = {}

    def grab(cell, inputs, output):
        captured["qkv"] = [x.asnumpy().astype(np.float32) for x in inputs[:3]]  # q, k, v (then documents, or None)

    with pynative():
        h = core.register_forward_hook(grab)
        try:
            model(ms.Tensor(ids[:, :-1]))
        finally:
            h.remove()
    q, k, _ = captured["qkv"]
    if k.shape[1] != q.shape[1]:  # grouped-query attention: each kv head serves a group of q heads
        k = np.repeat(k, q.shape[1] // k.shape[1], axis=1)
    scores = np.einsum("bhtd,bhsd->bhts", q, k) * core.scale
    return float(np.abs(scores).max())


def hunt(model, ids, compute_dtype="float32"):
    """Report (dict) on one batch: first non-finite forward module, first non-finite gradient, cause, fix."""
    import mindspore as ms

    report = {"compute_dtype": compute_dtype}
    problem = check_token_ids(ids, model.vocab_size)
    if problem:
        report.update(stage="input", culprit="input batch", cause=problem,
                      fix="check the dataset (ms-llm preprocess) and that model.vocab_size matches its manifest")
        return report
    records = trace_forward(model, ms.Tensor(ids))
    report["forward"] = None
    for name, in_stats, out_stats, _ in records:
        if out_stats["nonfinite"] and (in_stats is None or in_stats["nonfinite"] == 0):
            report["forward"] = {"module": name, "input": in_stats, "output": out_stats, "input_finite": True}
            break
    if report["forward"] is None:
        bad = next((r for r in records if r[2]["nonfinite"]), None)
        if bad is not None:  # non-finite from the start: propagated from an input we do not see
            report["forward"] = {"module": bad[0], "input": bad[1], "output": bad[2], "input_finite": False}
    loss, grads = param_grads(model, ms.Tensor(ids))
    report["loss"] = loss
    order = execution_order(records)
    owner = {p.name: p.name.rsplit(".", 1)[0] for p in model.trainable_params()}
    rank = {name: i for i, name in enumerate(order)}
    by_reverse = sorted(grads, key=lambda n: -rank.get(owner[n], -1))
    first_grad = next((n for n in by_reverse if not np.isfinite(grads[n]).all()), None)
    report["backward"] = {"parameter": first_grad, "stats": stats(grads[first_grad])} if first_grad else None
    report.update(explain(model, ids, report, compute_dtype))
    return report


def explain(model, ids, report, compute_dtype):
    fwd = report.get("forward")
    if fwd is None and report.get("backward") is None:
        if math.isfinite(report.get("loss", 0.0)):
            return {"stage": "none", "culprit": None, "cause": "this batch is finite in the forward and backward "
                    "pass with these weights", "fix": "the non-finite value came from elsewhere: check loss-scale "
                    "overflows (ms-llm diagnose) and the optimizer state"}
    if fwd is not None:
        module = fwd["module"]
        if module.endswith("attention.core") or ".attention.core." in module:
            peak = attention_scores(model, module, ids)
            if compute_dtype == "float16" and peak > FP16_MAX:
                return {"stage": "forward", "culprit": f"{module} (attention scores QK^T)",
                        "cause": f"attention scores overflow float16 (max |QK^T|·scale = {peak:.3g} > {FP16_MAX:.0f})",
                        "fix": "compute the scores in float32 (precision.compute_dtype: bfloat16 or float32), or lower "
                               "the init scale / learning rate so the weights stay smaller"}
            return {"stage": "forward", "culprit": module, "max_abs_scores": peak,
                    "cause": f"attention produced non-finite values from finite inputs (max |QK^T|·scale = {peak:.3g})",
                    "fix": "inspect the mask and the softmax input; ms-llm debug dump to compare with a float32 run"}
        if not fwd["input_finite"]:
            return {"stage": "forward", "culprit": module, "cause": "non-finite values were already in the first "
                    "module's input (the embedding / parameters are non-finite)",
                    "fix": "restore the last good checkpoint; the weights were damaged by an earlier update"}
        big = fwd["input"]["max_abs"] if fwd["input"] else float("nan")
        limit = FP16_MAX if compute_dtype == "float16" else 3.4e38
        return {"stage": "forward", "culprit": module,
                "cause": f"{module} turned finite inputs (max |x| = {big:.3g}) into non-finite outputs"
                         + (" near the float16 range" if big * 100 > limit else ""),
                "fix": "keep this module in float32 or bound its input (normalisation, lower LR)"}
    grad = report["backward"]
    return {"stage": "backward", "culprit": grad["parameter"],
            "cause": f"the forward pass is finite but the gradient of {grad['parameter']} is not "
                     f"(backward overflow, e.g. float16 gradients without enough loss scaling)",
            "fix": "use dynamic loss scaling (precision.loss_scale: dynamic) or bfloat16; clip gradients"}


def format_report(r):
    lines = [f"NaN/Inf hunt ({r['compute_dtype']}):"]
    if r.get("forward"):
        f = r["forward"]
        lines.append(f"  forward: first non-finite output in {f['module']} "
                     f"({f['output']['nonfinite']} values); its input was "
                     + ("finite (max |x| = %.3g): this module created it" % f["input"]["max_abs"] if f["input_finite"]
                        and f["input"] else "already non-finite"))
    if r.get("backward"):
        lines.append(f"  backward: first non-finite gradient (reverse order): {r['backward']['parameter']}")
    if r.get("culprit") or r.get("cause"):
        lines.append(f"  culprit: {r.get('culprit')}")
        lines.append(f"  cause: {r['cause']}")
        lines.append(f"  fix: {r['fix']}")
    return "\n".join(lines)
