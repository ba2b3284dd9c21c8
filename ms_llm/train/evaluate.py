"""Validation loss: mean token cross-entropy over a fixed list of batches, averaged over ranks."""
import numpy as np
from mindspore import nn, ops

from ms_llm.nn.backend import PORTABLE
from ms_llm.train.loss import ChunkedCrossEntropyLoss, cross_entropy, head_inputs


class EvalStep(nn.Cell):
    """ids (B, T+1) → mean token loss; chunked like the training loss when `loss_chunk` > 0."""

    def __init__(self, model, loss_chunk=0, backend=PORTABLE):
        super().__init__(auto_prefix=False)
        self.model = model
        self.chunked = loss_chunk > 0
        self.chunked_loss = ChunkedCrossEntropyLoss(loss_chunk, model.dtype, backend) if self.chunked else None

    def construct(self, ids):
        if self.chunked:
            return self.chunked_loss(*head_inputs(self.model, ids))
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


def evaluate_masked(model, eval_step, batches, rt):
    """Fine-tuning data: {val_loss, val_loss_prompt, val_tokens} over `batches` (loader.Batch). val_loss is the
    token-weighted mean over the masked-in (response) tokens of all batches and ranks, whatever the run's
    finetune.loss_mask; val_loss_prompt the same over the prompt tokens, which the loss should not have trained."""
    import mindspore as ms

    from ms_llm.train.masked_loss import prompt_weights, target_weights

    sums = np.zeros(4, np.float64)
    model.set_train(False)
    for b in batches:
        m, s = b.loss_mask.asnumpy(), b.segments.asnumpy()
        out = eval_step(b.ids, ms.Tensor(target_weights(m, s)), ms.Tensor(prompt_weights(m, s)), b.segments)
        sums += [float(x.asnumpy()) for x in out]
    model.set_train(True)
    if rt.world_size > 1:
        sums = ops.AllReduce()(ms.Tensor(sums.astype(np.float32))).asnumpy().astype(np.float64)
    return {"val_loss": sums[0] / sums[1] if sums[1] else float("nan"),
            "val_loss_prompt": sums[2] / sums[3] if sums[3] else float("nan"), "val_tokens": int(sums[1])}

