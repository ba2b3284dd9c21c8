"""Validation: the run's own loss cell in evaluation mode (no gradients, no dropout) over a fixed list of batches.

Each rank evaluates its slice of the same global batches; the loss says what its outputs add up to
(`Loss.eval_sums`), the sums are added over the ranks here, and the loss turns the totals into its record
(`Loss.eval_record`): the mean loss over the batches and ranks, or for fine-tuning data the token-weighted mean
over the responses with the prompts' loss beside it."""
import numpy as np

import mindspore as ms
from mindspore import ops


def evaluate(loss, batches, rt):
    """The validation record of `batches` (this rank's slice of the same global batches on every rank)."""
    if not batches:
        return {"val_loss": float("nan")}
    loss.set_train(False)
    one = ms.Tensor(1.0, ms.float32)
    try:
        outputs = [loss(one, *loss.inputs([b], count=False)[0]) for b in batches]
    finally:
        loss.set_train(True)
    return loss.eval_record(sum_over_ranks(loss.eval_sums(outputs), rt), rt.world_size)


def sum_over_ranks(sums, rt):
    """Each rank's float64 sums added over the ranks (float32 on the wire); one rank's as they are."""
    if rt.world_size == 1:
        return sums
    return ops.AllReduce()(ms.Tensor(np.asarray(sums, np.float32))).asnumpy().astype(np.float64)


def evaluate_session(s):
    """The evaluation record of a session: val_loss (and, per loss, val_tokens / val_loss_prompt), with data.extra_val's
    extra_val_loss when set."""
    record = evaluate(s.loss, s.val, s.rt)
    if "val_tokens" not in record and s.val:
        record["val_tokens"] = len(s.val) * int(s.val[0].shape[0]) * s.cfg.model.seq_length * s.rt.world_size
    st = s.finetune
    if st is not None and st.extra_val:
        record["extra_val_loss"] = evaluate(st.extra_loss, st.extra_val, s.rt)["val_loss"]
    return record
