"""What a part of the composed loss (composed.py) implements: an objective, or a term added to it."""
from mindspore import nn

from ms_llm.train.losses.base import mean_loss_record, mean_loss_sums


class Objective(nn.Cell):
    """What the run trains the model's output on.

    Graph side: `segments(columns)` (the model's segment ids (B, T), or None: each row one sequence); `train(out,
    targets, grad_scale, share, columns)` → (the loss to differentiate, the loss to log, aux tuple), `out` the
    logits, or (final hidden states, head weight) when `reads_hidden`; `share` the step's divisor when `sums_tokens`
    (base.py), else None; when `scales_itself` the first is already × grad_scale; `evaluate(out, targets, columns)`
    → the outputs `eval_sums` reads. Host side: `inputs`, `prepare`, `log_fields`, `eval_sums`, `eval_record`
    (base.Loss says what each is). Which one a run gets: ms_llm/train/losses/__init__.py."""

    reads_hidden = False
    scales_itself = False
    sums_tokens = False
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

    def eval_sums(self, outputs):
        return mean_loss_sums(outputs)

    def eval_record(self, sums, ranks):
        return mean_loss_record(sums, ranks)


class TokenObjective(Objective):
    """What the token objectives (whole: token.py, chunked: chunked.py) share: an optional loss mask
    (masked.LossMask). Without it, the columns are none and the loss the mean over the tokens; with it, the columns,
    segments and host side are the mask's and the loss a sum over the tokens it keeps (`sums_tokens`)."""

    def __init__(self, mask=None):
        super().__init__()
        self.mask = mask
        self.masked = mask is not None
        self.sums_tokens = self.masked

    def segments(self, columns):
        return self.mask.segments(columns) if self.masked else None

    def inputs(self, batches, count, training):
        return self.mask.inputs(batches, count, training) if self.masked else [(b,) for b in batches]

    def log_fields(self):
        return self.mask.log_fields() if self.masked else {}

    def eval_sums(self, outputs):
        return self.mask.eval_sums(outputs) if self.masked else mean_loss_sums(outputs)

    def eval_record(self, sums, ranks):
        return self.mask.eval_record(sums, ranks) if self.masked else mean_loss_record(sums, ranks)


class Term(nn.Cell):
    """A term added to the objective: `train(router_aux, router_stats)` → (value, aux tuple); `reads_router`: it
    needs the model's router outputs (forward_layers). `applies(cfg, manifest)` / `build(cfg, model)` say when a run
    gets it."""

    reads_router = False
    aux_shapes = ()

    def __init__(self):
        super().__init__(auto_prefix=False)

    @classmethod
    def applies(cls, cfg, manifest):
        raise NotImplementedError

    @classmethod
    def build(cls, cfg, model):
        raise NotImplementedError
