"""The token objective: cross-entropy of the next token in float32 — the mean over every token, or with the loss
mask of chat data (masked.py) the masked mean over the target tokens of the step — over the whole (tokens, vocab)
logits (`WholeTokens`, here) or a chunk of tokens at a time (`ChunkedTokens`, chunked.py).

    next_token:   (whole | chunked: train.loss_chunk_tokens > 0) × (loss mask | none: the dataset's columns)

MindSpore's autodiff of the whole logits materialises about ten tensors of the logits' size in backward (the
softmax, the gradient of log-softmax, the max's gradient, the zero-weighted label-smoothing branch of
ops.cross_entropy, their sums): the chunked objective is the default for that reason, masked or not, with a mixture
of experts' router term or without."""
from ms_llm.train.losses.base import cross_entropy
from ms_llm.train.losses.chunked import ChunkedTokens
from ms_llm.train.losses.masked import build_mask, token_cross_entropy
from ms_llm.train.losses.part import TokenObjective


def next_token(cfg, manifest, compute_dtype, backend):
    """The token objective of a run of `cfg` on the dataset of `manifest`, `backend` the chunked loss's kernels."""
    mask = build_mask(cfg, manifest)
    chunk = cfg.train.loss_chunk_tokens  # 0 under semi-auto parallel (ms_llm/train/setup/resolve.py)
    return ChunkedTokens(chunk, compute_dtype, backend, mask) if chunk > 0 else WholeTokens(mask)


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
