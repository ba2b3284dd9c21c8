"""Log-probabilities of given tokens, in batches padded to a few compiled shapes: what lm-eval's loglikelihood and
loglikelihood_rolling requests come down to.

A row is (input ids, number of scored positions at its end). Rows are sorted longest first, cut into batches of
`batch_size` (the last one padded with empty rows), and each batch is right-padded to the smallest length bucket
that holds its longest row: causal attention never looks right, so padding changes no real position, and graph
mode compiles one graph per bucket used instead of one per length.
"""
import mindspore as ms
import numpy as np
from mindspore import nn, ops


class TokenScores(nn.Cell):
    """ids (B, T), targets (B, T) → log p(target) (B, T) float32 and whether the target is the argmax (B, T)."""

    def __init__(self, model):
        super().__init__(auto_prefix=False)
        self.model = model
        self.log_softmax = nn.LogSoftmax(-1)

    def construct(self, ids, targets):
        logits = self.model(ids)  # float32
        logp = self.log_softmax(logits)
        picked = ops.gather_elements(logp, 2, targets.expand_dims(2)).squeeze(2)
        greedy = ops.argmax(logits, -1).astype(ms.int32) == targets
        return picked, greedy


class Scorer:
    def __init__(self, model, buckets, batch_size):
        self.cell = TokenScores(model)
        self.cell.set_train(False)
        self.buckets, self.batch_size = buckets, batch_size

    def score(self, rows, progress=None):
        """[(sum of log p over the row's scored tokens, all of them greedy)] for rows [(tokens, n_scored)] whose
        tokens are the input followed by the last target (the input is tokens[:-1], the targets tokens[1:])."""
        from ms_llm.generate.generator import bucket

        order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))
        out = [None] * len(rows)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            width = bucket(max(len(rows[i][0]) - 1 for i in chunk), self.buckets)
            ids = np.zeros((self.batch_size, width), np.int32)
            targets = np.zeros((self.batch_size, width), np.int32)
            for r, i in enumerate(chunk):
                tokens = rows[i][0]
                ids[r, :len(tokens) - 1] = tokens[:-1]
                targets[r, :len(tokens) - 1] = tokens[1:]
            logp, greedy = self.cell(ms.Tensor(ids), ms.Tensor(targets))
            logp, greedy = logp.asnumpy(), greedy.asnumpy()
            for r, i in enumerate(chunk):
                tokens, n = rows[i]
                end = len(tokens) - 1
                out[i] = (float(logp[r, end - n:end].astype(np.float64).sum()), bool(greedy[r, end - n:end].all()))
            if progress is not None:
                progress(len(chunk))
        return out
