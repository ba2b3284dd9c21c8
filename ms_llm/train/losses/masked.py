"""The loss mask of fine-tuning data, a part of the token objective (token.py, whole or chunked): the mean
cross-entropy over the target tokens the loss mask keeps, across the whole global batch, whatever the accumulation
and the number of data-parallel ranks.

    loss = Σ w·ce / Σ w   over every token of every micro-batch of every rank of the step

w is a per-token weight: 1 for a response token (the dataset's loss_mask column), 0 for prompts, padding and the
first token of a conversation (ms_llm.data.chat_pack). A mean per micro-batch, averaged over micro-batches (what the
plain step does with its equal-sized micro-batches), would weight a micro-batch of 10 response tokens like one of
1,000. So the masked objective is a sum over tokens (`sums_tokens`, base.py): each micro-batch's loss is its sum
divided by the share the step gives it,

    L_m = Σ_m w·ce / d,   d = N / (accum · dp),   N = Σ_global w

and the step's mean over micro-batches and ranks, (1 / (accum · dp)) Σ_ranks Σ_m L_m, is Σ_global w·ce / N exactly;
the logged loss, averaged the same way, is the global masked mean too. This part knows nothing of ranks: the step
computes d (ms_llm/train/step.py, StepState.loss_inputs). tests/test_finetune_train.py checks loss and gradients
against numpy with uneven masks across micro-batches and ranks.

N must be known before the first backward of the step. Where it comes from: each rank holds all its micro-batches
of the step on the host before the first one runs (Session.next_batches), so its own count is a numpy sum of their
weights (`inputs` puts it first in each micro-batch's arguments); the other ranks' counts are not there. The step
sums this local count over the data-parallel ranks with an AllReduce in the graph: one float32 scalar per
micro-batch, latency only, no host round trip, and none at all on one rank. The alternatives cost more: each rank
reading every rank's masks (dp times the mask reads), or a host-side all-reduce every step (a host sync that stalls
the asynchronous dispatch of steps). Counts are float32, exact up to 2^24 = 16.7M masked-in tokens per step;
beyond, the denominator's relative error is 6e-8. An all-zero global mask gives loss 0 and zero gradients (the step
clamps N to ≥ 1), and `ms-llm diagnose` names it (rules/finetune.py).

The weights are computed on the host (`target_weights`), once, and handed to the graph with their count, so the
count and the loss can never use two different rules.

The mask changes nothing else: the chunked objective takes it as it takes the plain one's weights, and the terms a
run adds (a mixture of experts' router losses, routed.py) are added to this loss as to the plain one (composed.py),
so an MoE model fine-tunes with its load-balancing loss, at any vocabulary.

In evaluation the same cell returns the sums a validation pass needs (Σ w·ce, Σ w, and the same over the prompt
tokens, which are never trained on); evaluation adds them over batches and ranks and `eval_record` divides them.
"""
import numpy as np

import mindspore as ms
from mindspore import nn, ops

from ms_llm.data.manifest import has_loss_mask


def target_weights(loss_mask, segments, use_mask=True):
    """(B, T) float32 weights of the targets ids[:, 1:] of a batch of (B, T+1) columns (numpy): the loss mask, or
    with `use_mask=False` every real token (prompts included: what training without the mask does). Never a token
    that starts a conversation (its context is another conversation) or padding."""
    loss_mask, segments = np.asarray(loss_mask), np.asarray(segments)
    same = (segments[:, 1:] == segments[:, :-1]) & (segments[:, 1:] != 0)
    keep = loss_mask[:, 1:] != 0 if use_mask else np.ones(same.shape, bool)
    return (keep & same).astype(np.float32)


def prompt_weights(loss_mask, segments):
    """The real target tokens the loss mask leaves out (prompts, template text): what `val_loss_prompt` averages."""
    return target_weights(np.ones_like(np.asarray(loss_mask)), segments) - target_weights(loss_mask, segments)


def token_cross_entropy(logits, targets):
    """Per-token cross-entropy in float32, (B·T,)."""
    vocab = logits.shape[-1]
    return ops.cross_entropy(logits.reshape(-1, vocab).astype(ms.float32), targets.reshape(-1), reduction="none")


def documents(cfg, manifest):
    """Whether the model gets segment ids: packed samples, unless finetune.document_mask is off. One conversation
    per sample (--no-pack) needs no mask: its padding comes after it, which causal attention never sees."""
    return bool(manifest.get("packed")) and cfg.finetune.document_mask


class LossMask(nn.Cell):
    """The columns (weights (B, T), segments (B, T+1), prompt weights (B, T)) of a micro-batch, after its count and
    ids, and what the token objective does with them: loss = Σ w·ce / share (module docstring). With `documents`,
    the model gets the segment ids (packed samples: attention and positions per conversation); without, it sees each
    row as one sequence."""

    def __init__(self, use_mask=True, with_documents=True):
        super().__init__(auto_prefix=False)
        self.use_mask, self.documents = use_mask, with_documents
        # this rank's masked-in and real targets since the last log: host-side counts, not graph state, so private
        # (the compile cache's key describes a cell's public attributes: these would key it on the first batch)
        self._loss_tokens = self._target_tokens = 0.0

    def inputs(self, batches, count, training):
        """(this rank's count of the step's masked-in targets, ids, weights, segments, prompt weights) per
        micro-batch."""
        cols = [(b.loss_mask.asnumpy(), b.segments.asnumpy()) for b in batches]
        # validation counts the responses whatever finetune.loss_mask says (what the loss should have learnt)
        weights = [target_weights(m, s, self.use_mask or not training) for m, s in cols]
        masked_in = ms.Tensor(np.float32(sum(float(w.sum()) for w in weights)))
        if count:
            self._loss_tokens += float(sum(w.sum() for w in weights))
            self._target_tokens += float(sum(target_weights(m, s, False).sum() for m, s in cols))
        return [(masked_in, b.ids, ms.Tensor(w), b.segments, ms.Tensor(prompt_weights(m, s)))
                for b, w, (m, s) in zip(batches, weights, cols)]

    def log_fields(self):
        """The share of this rank's target tokens the loss counted since the last record."""
        if not self._target_tokens:
            return {}
        out = {"loss_tokens_frac": round(self._loss_tokens / self._target_tokens, 5)}
        self._loss_tokens = self._target_tokens = 0.0
        return out

    def segments(self, columns):
        return columns[1][:, :-1] if self.documents else None

    def weights(self, columns):
        return columns[0].reshape(-1)

    def loss(self, ce, share, columns):
        """Σ w·ce / share, `ce` the per-token cross-entropy (B·T,)."""
        return (ce * self.weights(columns)).sum() / share

    def evaluate(self, ce, columns):
        w, p = columns[0].reshape(-1), columns[2].reshape(-1)
        return ops.zeros((), ms.float32), ops.zeros((), ms.float32), (ce * w).sum(), w.sum(), (ce * p).sum(), \
            p.sum()

    def eval_sums(self, outputs):
        """Σ w·ce, Σ w and the same over the prompt tokens, over this rank's batches."""
        sums = np.zeros(4, np.float64)
        for out in outputs:
            sums += [float(x.asnumpy()) for x in out[2:]]
        return sums

    def eval_record(self, sums, ranks):
        """val_loss: the token-weighted mean over the masked-in (response) tokens of all batches and ranks, whatever
        the run's finetune.loss_mask; val_loss_prompt the same over the prompt tokens."""
        return {"val_loss": sums[0] / sums[1] if sums[1] else float("nan"),
                "val_loss_prompt": sums[2] / sums[3] if sums[3] else float("nan"), "val_tokens": int(sums[1])}


def build_mask(cfg, manifest):
    """The loss mask of a run on the dataset of `manifest`, or None (a dataset without a loss_mask column)."""
    return LossMask(cfg.finetune.loss_mask, documents(cfg, manifest)) if has_loss_mask(manifest) else None
