"""The interface every training loss implements (ms_llm/train/losses/__init__.py chooses one per run).

    scaled, loss, *aux = loss_cell(grad_scale, ids, *columns)
    scaled, loss, *aux = loss_cell(grad_scale, share, ids, *columns)      (`sums_tokens`: a loss summed over tokens)

- `grad_scale`: the loss scale divided by the accumulation steps (the step's rule, the same for every loss);
- `share` (only when `sums_tokens`): what the loss divides its sum over tokens by. The loss returns what it sums;
  the step, which owns accumulation and data parallelism, says what to divide it by (ms_llm/train/step.py): the
  step's count of those tokens over every micro-batch and rank ÷ (accumulation · data-parallel ranks), so that its
  mean of the micro-batch losses is the mean over every token of the step. On the host the first element of
  `inputs` is this rank's count in that place (which is the share itself for one micro-batch on one rank);
- `scaled`: what the step differentiates, grad_scale × the loss it trains;
- `loss`: the float32 loss it logs (comparable with val_loss);
- `aux`: extra outputs, one per entry of `aux_shapes`, that the step sums over a step's micro-batches into buffers
  of those names (a mixture of experts' router statistics); none for most losses.

The same cell in evaluation mode (`set_train(False)`) computes the loss without gradients; `eval_sums` turns this
rank's outputs of a validation pass into the sums that add over ranks, and `eval_record` the sums of all ranks
into the pass's metrics (train/loop/evaluate.py adds them up). `inputs` turns a step's micro-batches into the
cell's arguments on the host. A loss reads the model's hidden states and head (`hidden_states`, `forward_layers`,
`logits`, `head_weight`), nothing else; it knows nothing of ranks, accumulation or parallel layouts.
"""
import numpy as np

import mindspore as ms
from mindspore import nn, ops


def cross_entropy(logits, targets):
    """Mean token cross-entropy in float32 over the whole logits."""
    vocab = logits.shape[-1]
    return ops.cross_entropy(logits.reshape(-1, vocab).astype(ms.float32), targets.reshape(-1))


class Loss(nn.Cell):
    aux_shapes = ()  # ((buffer name, shape), ...) of the aux outputs
    sums_tokens = False  # the loss is a sum over tokens, divided by the `share` the step gives it

    def __init__(self, model):
        super().__init__(auto_prefix=False)  # parameter names as the model has them ("layers.0...")
        self.model = model
        # built to train (its model too); evaluation switches it off and back (train/loop/evaluate.py)
        self.set_train(True)

    def inputs(self, batches, count=True):
        """The cell's arguments after grad_scale, per micro-batch (`count`: add them to the logged counts)."""
        return [(b,) for b in batches]

    def prepare(self, session, log, resumed=False):
        """Before the first step, once the weights are in place (loaded, resumed): what the loss needs from the
        session (the preference loss's reference log-probs). Nothing by default."""

    def log_fields(self):
        """Fields this loss adds to a log record (and resets); none by default."""
        return {}

    def eval_sums(self, outputs):
        """What this rank's outputs of a validation pass (one per batch) add to the pass over all ranks."""
        return mean_loss_sums(outputs)

    def eval_record(self, sums, ranks):
        """The validation record of a pass whose `eval_sums`, added over `ranks` ranks, are `sums`."""
        return mean_loss_record(sums, ranks)


def mean_loss_sums(outputs):
    """The mean loss (each output's second element) over this rank's batches."""
    return np.array([np.mean([float(out[1].asnumpy()) for out in outputs])], np.float64)


def mean_loss_record(sums, ranks):
    """val_loss: the mean of the ranks' means (each rank holds its slice of the same global batches)."""
    return {"val_loss": float(sums[0] / ranks)}
