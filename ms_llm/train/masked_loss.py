"""The fine-tuning loss: the mean cross-entropy over the target tokens the loss mask keeps, across the whole global
batch, whatever the accumulation and the number of data-parallel ranks.

    loss = Σ w·ce / Σ w   over every token of every micro-batch of every rank of the step

w is a per-token weight: 1 for a response token (the dataset's loss_mask column), 0 for prompts, padding and the
first token of a conversation (ms_llm.data.chat_pack). A mean per micro-batch, averaged over micro-batches (what the
plain step does with its equal-sized micro-batches), would weight a micro-batch of 10 response tokens like one of
1,000. The step differentiates each micro-batch's `loss × scale / accum`, sums them, sums over ranks and divides by
dp (ms_llm/train/step.py), so each micro-batch's loss here is

    L_m = Σ_m w·ce / d,   d = N / (accum · dp),   N = Σ_global w

and (1 / (accum · dp)) Σ_ranks Σ_m L_m = Σ_global w·ce / N exactly; the logged loss, averaged the same way, is the
global masked mean too. tests/test_finetune_train.py checks loss and gradients against numpy with uneven masks
across micro-batches and ranks.

N must be known before the first backward of the step. Where it comes from: each rank holds all its micro-batches
of the step on the host before the first one runs (Session.next_batches), so its own count is a numpy sum of their
weights; the other ranks' counts are not there. The step takes this local count as an input and sums it over the
data-parallel ranks with an AllReduce in the graph: one float32 scalar per micro-batch, latency only, no host round
trip, and none at all on one rank. The alternatives cost more: each rank reading every rank's masks (dp times the
mask reads), or a host-side all-reduce every step (a host sync that stalls the asynchronous dispatch of steps).
Counts are float32, exact up to 2^24 = 16.7M masked-in tokens per step; beyond, the denominator's relative error is
6e-8. An all-zero global mask gives loss 0 and zero gradients (d is clamped to ≥ 1/(accum·dp)), and `ms-llm
diagnose` names it (rules/finetune.py).

The weights are computed on the host (`target_weights`), once, and handed to the graph with their count, so the
count and the loss can never use two different rules. The same per-token weights fit the chunked cross-entropy of
`train.loss_chunk_tokens` (ms_llm/train/loss.py): its Σ w·ce over chunks divided by this `d` instead of the chunk
set's own Σ w.
"""
import numpy as np
import mindspore as ms
from mindspore import nn, ops


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


class MaskedLossFn(nn.Cell):
    """(ids (B, T+1), scale, weights (B, T), segments (B, T+1), local count ()) → (loss · scale / accum, loss), loss
    = Σ w·ce / d (module docstring). `documents`: the model gets the segment ids (packed samples: attention and
    positions per conversation); without, it sees each row as one sequence."""

    routed = False  # no router statistics: chat data with model.moe is refused (train/finetune.py)

    def __init__(self, model, accum, dp, documents=True):
        super().__init__(auto_prefix=False)  # parameter names as the model has them
        self.model = model
        self.accum, self.dp, self.documents = accum, dp, documents
        self.all_reduce = ops.AllReduce() if dp > 1 else None

    def denominator(self, count):
        total = self.all_reduce(count) if self.dp > 1 else count
        return ops.maximum(total, 1.0) / (self.accum * self.dp)

    def construct(self, ids, scale, weights, segments, count):
        logits = self.model(ids[:, :-1], segments[:, :-1]) if self.documents else self.model(ids[:, :-1])
        ce = token_cross_entropy(logits, ids[:, 1:])
        loss = (ce * weights.reshape(-1)).sum() / self.denominator(count)
        return loss * scale / self.accum, loss


class MaskedEvalStep(nn.Cell):
    """(ids, weights, prompt weights, segments) → (Σ w·ce, Σ w, Σ p·ce, Σ p) of one validation batch: the host sums
    them over batches and ranks, so validation is the token-weighted mean over the masked-in tokens, and the prompt
    tokens' loss is measured beside it (never trained on)."""

    def __init__(self, model, documents=True):
        super().__init__(auto_prefix=False)
        self.model, self.documents = model, documents

    def construct(self, ids, weights, prompt, segments):
        logits = self.model(ids[:, :-1], segments[:, :-1]) if self.documents else self.model(ids[:, :-1])
        ce = token_cross_entropy(logits, ids[:, 1:])
        w, p = weights.reshape(-1), prompt.reshape(-1)
        return (ce * w).sum(), w.sum(), (ce * p).sum(), p.sum()
