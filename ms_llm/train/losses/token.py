"""The token objective over the whole logits: cross-entropy of the next token in float32 over the (tokens, vocab)
logits — the mean over every token, or with the loss mask of chat data (masked.py) the masked mean over the target
tokens of the step. Its chunked twin, a chunk of tokens at a time, is chunked.py's `ChunkedTokens`.

MindSpore's autodiff of the whole logits materialises about ten tensors of the logits' size in backward (the
softmax, the gradient of log-softmax, the max's gradient, the zero-weighted label-smoothing branch of
ops.cross_entropy, their sums): the chunked objective is the default for that reason, masked or not, with a mixture
of experts' router term or without."""
from ms_llm.train.losses.base import cross_entropy
from ms_llm.train.losses.masked import token_cross_entropy
from ms_llm.train.losses.part import TokenObjective


class WholeTokens(TokenObjective):
    """Reads the logits: the mean cross-entropy, or with `mask` Σ w·ce ÷ the step's share of the target tokens."""

    def train(self, logits, targets, grad_scale, share, columns):
        if self.masked:
            loss = self.mask.loss(token_cross_entropy(logits, targets), share, columns)
        else:
            loss = cross_entropy(logits, targets)
        return loss, loss, ()

    def evaluate(self, logits, targets, columns):
        if self.masked:
            return self.mask.evaluate(token_cross_entropy(logits, targets), columns)
        loss = cross_entropy(logits, targets)
        return loss, loss
