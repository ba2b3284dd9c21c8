"""The interface every training loss implements (ms_llm/train/losses/__init__.py chooses one per run).

    scaled, loss, *aux = loss_cell(grad_scale, ids, *columns)

- `grad_scale`: the loss scale divided by the accumulation steps (the step's rule, the same for every loss);
- `scaled`: what the step differentiates, grad_scale × the loss it trains;
- `loss`: the float32 loss it logs (comparable with val_loss);
- `aux`: extra outputs, one per entry of `aux_shapes`, that the step sums over a step's micro-batches into buffers
  of those names (a mixture of experts' router statistics); none for most losses.

The same cell in evaluation mode (`set_train(False)`) computes the loss without gradients; `eval_record` turns a
validation pass's outputs into its metrics. `inputs` turns a step's micro-batches into the cell's arguments on the
host. A loss reads the model's hidden states and head (`hidden_states`, `forward_layers`, `logits`, `head_weight`),
nothing else.
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

    def __init__(self, model, accum):
        super().__init__(auto_prefix=False)  # parameter names as the model has them ("layers.0...")
        self.model = model
        self.accum = accum
        # built to train (its model too); evaluation switches it off and back (train/loop/evaluate.py)
        self.set_train(True)

    @classmethod
    def applies(cls, cfg, parallel, manifest):
        """Whether this loss is the one for a run of `cfg` on the dataset of `manifest`."""
        raise NotImplementedError

    @classmethod
    def build(cls, cfg, parallel, manifest, model, backend, dp):
        """The loss for a run (what `applies` accepted), from its config and layout."""
        return cls(model, parallel.accumulation)

    def inputs(self, batches, count=True):
        """The cell's arguments after grad_scale, per micro-batch (`count`: add them to the logged counts)."""
        return [(b,) for b in batches]

    def prepare(self, session, log, resumed=False):
        """Before the first step, once the weights are in place (loaded, resumed): what the loss needs from the
        session (the preference loss's reference log-probs). Nothing by default."""

    def log_fields(self):
        """Fields this loss adds to a log record (and resets); none by default."""
        return {}

    def eval_record(self, outputs, rt):
        """The validation record of a pass whose outputs (one per batch of this rank) are `outputs`."""
        return mean_loss_record(outputs, rt)


def mean_loss_record(outputs, rt):
    """The mean loss (each output's second element) over the batches, averaged over ranks (each holds its slice of
    the same global batches)."""
    local = float(np.mean([float(out[1].asnumpy()) for out in outputs]))
    if rt.world_size > 1:
        local = float(ops.AllReduce()(ms.Tensor(np.array([local], np.float32))).asnumpy()[0]) / rt.world_size
    return {"val_loss": local}
