"""What a part of the composed loss (composed.py) implements: an objective, or a term added to it."""
from mindspore import nn


class Objective(nn.Cell):
    """What the run trains the model's output on.

    Graph side: `segments(columns)` (the model's segment ids (B, T), or None: each row one sequence); `train(out,
    targets, grad_scale, share, columns)` → (the loss to differentiate, the loss to log, aux tuple), `out` the
    logits, or (final hidden states, head weight) when `reads_hidden`; `share` the step's divisor when `sums_tokens`
    (base.py), else None; when `scales_itself` the first is already × grad_scale; `evaluate(out, targets, columns)`
    → the outputs `eval_sums` reads. Host side, for an objective that `has_columns` (dataset columns beyond the
    ids: the loss mask's, the preference pairs'): `inputs(batches, count, training)`, `prepare(loss, session, log,
    resumed)`, `log_fields`, `eval_sums`, `eval_record` (base.Loss says what each is); without, the composed loss
    takes the ids alone and records the mean loss. Which objective a run gets: ms_llm/train/losses/__init__.py."""

    reads_hidden = False
    scales_itself = False
    sums_tokens = False
    has_columns = False
    aux_shapes = ()

    def __init__(self):
        super().__init__(auto_prefix=False)

    def segments(self, columns):
        return None


class TokenObjective(Objective):
    """What the token objectives (whole: token.py, chunked: chunked.py) share: an optional loss mask
    (masked.LossMask). Without it, the ids alone and the loss the mean over the tokens; with it, the columns,
    segments and host side are the mask's and the loss a sum over the tokens it keeps (`sums_tokens`)."""

    def __init__(self, mask=None):
        super().__init__()
        self.mask = mask
        self.masked = self.has_columns = self.sums_tokens = mask is not None

    def segments(self, columns):
        return self.mask.segments(columns) if self.masked else None

    def inputs(self, batches, count, training):
        return self.mask.inputs(batches, count, training)

    def prepare(self, loss, session, log, resumed):
        pass

    def log_fields(self):
        return self.mask.log_fields()

    def eval_sums(self, outputs):
        return self.mask.eval_sums(outputs)

    def eval_record(self, sums, ranks):
        return self.mask.eval_record(sums, ranks)


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
