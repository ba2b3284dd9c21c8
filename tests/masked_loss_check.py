"""The masked loss through the real training step against numpy, with uneven masks across micro-batches and ranks.

The model is a lookup table, logits = E[ids], so that numpy computes the exact loss and gradient:
    L = Σ w·ce / Σ w over every micro-batch of every rank,    dL/dE[x] = Σ over positions reading x of w·(p − onehot)/Σw
TrainStep returns the step's loss and the global norm of its gradient; both must equal numpy's.

In-process (tests/test_finetune_model.py: one rank, accumulation 3) and under msrun (tests/test_finetune_train.py:
`msrun --worker_num=2 ... tests/masked_loss_check.py OUT`, accumulation 2 on each of 2 ranks), where each rank
writes OUT/rank_<r>.json.
"""
import json
import os
import sys

import numpy as np

V, T, B = 11, 8, 2  # vocabulary, tokens per row, rows per micro-batch


def micro_batches(n, seed=0):
    """n micro-batches of (ids (B, T+1), weights (B, T)) with very uneven masks: micro-batch 1 keeps nothing."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        ids = rng.integers(0, V, (B, T + 1)).astype(np.int32)
        keep = [0.9, 0.0, 0.2, 0.6][k % 4]
        w = (rng.random((B, T)) < keep).astype(np.float32)
        out.append((ids, w))
    return out


def table(seed=1):
    return np.random.default_rng(seed).normal(0, 1, (V, V)).astype(np.float32)


def reference(E, batches):
    """(loss, gradient norm) of the masked mean over all `batches`, in float64."""
    E = E.astype(np.float64)
    total_w = sum(w.sum() for _, w in batches)
    loss, grad = 0.0, np.zeros_like(E)
    for ids, w in batches:
        x, y = ids[:, :-1], ids[:, 1:]
        logits = E[x]
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        ce = -np.log(np.take_along_axis(p, y[..., None], -1))[..., 0]
        loss += (w * ce).sum()
        d = p.copy()
        np.put_along_axis(d, y[..., None], np.take_along_axis(d, y[..., None], -1) - 1, -1)
        np.add.at(grad, x, d * w[..., None])
    return loss / total_w, float(np.linalg.norm(grad / total_w))


def mean_of_micro_means(E, batches):
    """What a per-micro-batch mean averaged over micro-batches would report (the defect the token weighting
    avoids); micro-batches without tokens count as 0."""
    return float(np.mean([reference(E, [b])[0] if b[1].sum() else 0.0 for b in batches]))


def step(E, batches, accum, dp):
    """(loss, grad norm) of one TrainStep over this rank's `batches` (accum of them), with the masked loss."""
    import mindspore as ms
    from mindspore import nn, ops

    from ms_llm.config import load_config
    from ms_llm.train.losses import MaskedLoss
    from ms_llm.train.optimizer import AdamW
    from ms_llm.train.step import StepSpec, TrainStep

    class Lookup(nn.Cell):
        def __init__(self):
            super().__init__()
            self.table = ms.Parameter(ms.Tensor(E), name="table")

        def construct(self, ids, segments=None):
            return ops.gather(self.table, ids, 0)

    model = Lookup()
    cfg = load_config(None, [])
    train = TrainStep(AdamW(model.trainable_params()), MaskedLoss(model, with_documents=False),
                      StepSpec(cfg.precision, 0.0, np.zeros(4, np.float32), accum=accum, dp=dp))
    count = ms.Tensor(np.float32(sum(w.sum() for _, w in batches)))
    seg = ms.Tensor(np.ones((B, T + 1), np.int32))
    inputs = [(count, ms.Tensor(ids), ms.Tensor(w), seg, ms.Tensor(np.zeros_like(w))) for ids, w in batches]
    if accum == 1:
        loss, norm, _, _ = train(*inputs[0])
    else:
        for x in inputs:
            train.accumulate(*x)
        loss, norm, _, _ = train()  # the update, from the accumulated buffers
    return float(loss.asnumpy()), float(norm.asnumpy())


if __name__ == "__main__":  # one rank of the msrun check: accumulation 2, data parallel 2
    import mindspore as ms
    from mindspore.communication import get_rank, init

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    init()
    rank = get_rank()
    everything = micro_batches(4)
    mine = [everything[2 * rank], everything[2 * rank + 1]]  # rank 0: 90% and 0% kept; rank 1: 20% and 60%
    loss, norm = step(table(), mine, accum=2, dp=2)
    with open(os.path.join(sys.argv[1], f"rank_{rank}.json"), "w") as f:
        json.dump({"loss": loss, "grad_norm": norm}, f)
