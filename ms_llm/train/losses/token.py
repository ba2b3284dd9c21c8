"""The token objective: cross-entropy of the next token over the whole (tokens, vocab) logits in float32 — the mean
over every token, or with a loss mask (masked.py) the masked mean over the target tokens of the step.

MindSpore's autodiff of it materialises about ten tensors of the logits' size in backward (the softmax, the
gradient of log-softmax, the max's gradient, the zero-weighted label-smoothing branch of ops.cross_entropy, their
sums): at a large vocabulary without a mask the chunked objective (chunked.py) is the default for that reason."""
from ms_llm.train.losses.base import cross_entropy
from ms_llm.train.losses.composed import ComposedLoss
from ms_llm.train.losses.part import Objective


class WholeTokens(Objective):
    """Reads the logits. Without `mask`: the columns are none, the loss the mean cross-entropy. With `mask`
    (masked.LossMask): the columns are the mask's, the loss Σ w·ce ÷ the step's share of the target tokens."""

    def __init__(self, mask=None):
        super().__init__()
        self.mask = mask
        self.masked = mask is not None

    def segments(self, columns):
        return self.mask.segments(columns) if self.masked else None

    def train(self, logits, targets, grad_scale, columns):
        loss = self.mask.loss(logits, targets, columns) if self.masked else cross_entropy(logits, targets)
        return loss, loss, ()

    def evaluate(self, logits, targets, columns):
        if self.masked:
            return self.mask.evaluate(logits, targets, columns)
        loss = cross_entropy(logits, targets)
        return loss, loss

    # host side
    def inputs(self, batches, count, training):
        return self.mask.inputs(batches, count, training) if self.masked else [(b,) for b in batches]

    def log_fields(self):
        return self.mask.log_fields() if self.masked else {}

    def eval_record(self, outputs, rt):
        return self.mask.eval_record(outputs, rt) if self.masked else super().eval_record(outputs, rt)


class TokenLoss(ComposedLoss):
    """The plain loss: the mean token cross-entropy over the whole logits, nothing added."""

    @classmethod
    def applies(cls, cfg, parallel, manifest):
        return True

    def __init__(self, model, accum):
        super().__init__(model, accum, WholeTokens())
