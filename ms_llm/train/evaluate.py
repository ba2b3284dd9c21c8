"""Validation loss: mean token cross-entropy over a fixed list of batches, averaged over ranks."""
import numpy as np
from mindspore import nn, ops

from ms_llm.train.step import cross_entropy


class EvalStep(nn.Cell):
    def __init__(self, model):
        super().__init__(auto_prefix=False)
        self.model = model

    def construct(self, ids):
        return cross_entropy(self.model(ids[:, :-1]), ids[:, 1:])


def evaluate(model, eval_step, batches, rt):
    """Mean validation loss over `batches` on every rank (each holds its slice of the same global batches)."""
    if not batches:
        return float("nan")
    model.set_train(False)
    losses = [eval_step(b) for b in batches]
    model.set_train(True)
    local = np.mean([float(x.asnumpy()) for x in losses])
    if rt.world_size > 1:
        import mindspore as ms

        total = ops.AllReduce()(ms.Tensor(np.array([local], np.float32)))
        return float(total.asnumpy()[0]) / rt.world_size
    return float(local)
