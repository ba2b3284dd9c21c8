"""Split a full checkpoint into per-rank tensor-parallel shards for a layout, and merge shards back.

Each parameter's slicing follows the strategy of the primitive that consumes it (ms_llm.parallel.layout):
a column-parallel Linear splits its weight (and bias) along the output rows, a row-parallel one along the
input columns, a vocabulary-split embedding / LM head along the vocabulary; everything else (norms,
row-parallel biases, positions) is replicated. Rank r holds model-parallel slice r % mp (MindSpore's
device matrix puts the model-parallel axis last); data-parallel replicas hold identical slices.
Optimizer moments are sliced like their parameter.
"""
import numpy as np

from ms_llm.errors import UserError

LINEAR_WEIGHT = {"qkv": 0, "up": 0, "gate_up": 0, "out": 1, "down": 1}  # split axis per Linear role
LINEAR_BIAS = {"qkv": 0, "up": 0, "gate_up": 0}  # row-parallel biases are added after the reduction


def split_axis(name, plan):
    """The axis `name` (a parameter or an optimizer moment of one) is split along, or None (replicated)."""
    base = name.split(".", 1)[1] if name.startswith(("adam_m.", "adam_v.")) else name
    if plan.mp == 1:
        return None
    parts = base.split(".")
    if len(parts) >= 2 and parts[-2] in LINEAR_WEIGHT and parts[-1] == "weight":
        return LINEAR_WEIGHT[parts[-2]]
    if len(parts) >= 2 and parts[-2] in LINEAR_BIAS and parts[-1] == "bias":
        return LINEAR_BIAS[parts[-2]]
    if base in ("embedding", "lm_head") and not plan.vocab_emb_dp:
        return 0
    return None


def split(arrays, plan):
    """{rank: {name: array}} for every rank of the plan."""
    shards = {r: {} for r in range(plan.devices)}
    for name, arr in arrays.items():
        axis = split_axis(name, plan)
        if axis is not None and arr.shape[axis] % plan.mp:
            raise UserError(f"cannot split {name} {arr.shape} along axis {axis} into {plan.mp} equal parts: the "
                            f"model's dimensions must be divisible by model_parallel.")
        pieces = np.split(arr, plan.mp, axis=axis) if axis is not None else [arr] * plan.mp
        for r in range(plan.devices):
            shards[r][name] = np.ascontiguousarray(pieces[r % plan.mp])
    return shards


def merge(shards, plan):
    """The full checkpoint from {rank: {name: array}}; data-parallel replicas must agree."""
    ranks = sorted(shards)
    if len(ranks) < plan.mp:
        raise UserError(f"merging needs the shards of all {plan.mp} model-parallel ranks; found ranks {ranks}.")
    out = {}
    for name in shards[ranks[0]]:
        axis = split_axis(name, plan)
        if axis is None:
            out[name] = shards[ranks[0]][name]
            continue
        out[name] = np.concatenate([shards[r][name] for r in range(plan.mp)], axis=axis)
    for r in ranks[plan.mp:]:  # replicas (data-parallel ranks) must hold exactly the same slices
        for name, arr in shards[r].items():
            if not np.array_equal(arr, shards[r % plan.mp][name]):
                raise UserError(f"rank {r} holds a different {name} than its replica rank {r % plan.mp}: the shards "
                                f"come from different steps or runs.")
    return out
