"""What a part of the composed loss (composed.py) implements: an objective, or a term added to it."""
from mindspore import nn

from ms_llm.train.losses.base import mean_loss_record


class Objective(nn.Cell):
    """What the run trains the model's output on.

    Graph side: `segments(columns)` (the model's segment ids (B, T), or None: each row one sequence); `train(out,
    targets, grad_scale, columns)` → (the loss to differentiate, the loss to log, aux tuple), `out` the logits, or
    (final hidden states, head weight) when `reads_hidden`; when `scales_itself` the first is already × grad_scale;
    `evaluate(out, targets, columns)` → the outputs `eval_record` reads. Host side: `inputs`, `prepare`,
    `log_fields`, `eval_record` (base.Loss says what each is)."""

    reads_hidden = False
    scales_itself = False
    aux_shapes = ()

    def __init__(self):
        super().__init__(auto_prefix=False)

    def segments(self, columns):
        return None

    def inputs(self, batches, count, training):
        return [(b,) for b in batches]

    def prepare(self, loss, session, log, resumed):
        """Before the first step (`loss`: the composed loss this objective is part of)."""

    def log_fields(self):
        return {}

    def eval_record(self, outputs, rt):
        return mean_loss_record(outputs, rt)


class Term(nn.Cell):
    """A term added to the objective: `train(router_aux, router_stats)` → (value, aux tuple); `reads_router`: it
    needs the model's router outputs (forward_layers). `applies` / `build` say when a run gets it."""

    reads_router = False
    aux_shapes = ()

    def __init__(self):
        super().__init__(auto_prefix=False)

    @classmethod
    def applies(cls, cfg, parallel, manifest):
        raise NotImplementedError

    @classmethod
    def build(cls, cfg, model):
        raise NotImplementedError
