"""The plain loss: mean token cross-entropy over the whole (tokens, vocab) logits in float32.

MindSpore's autodiff of it materialises about ten tensors of the logits' size in backward (the softmax, the
gradient of log-softmax, the max's gradient, the zero-weighted label-smoothing branch of ops.cross_entropy, their
sums): at a large vocabulary the chunked loss (chunked.py) is the default for that reason."""
from ms_llm.train.losses.base import Loss, cross_entropy


class TokenLoss(Loss):
    @classmethod
    def applies(cls, cfg, parallel, manifest):
        return True

    def construct(self, grad_scale, ids):
        loss = cross_entropy(self.model.logits(self.model.hidden_states(ids[:, :-1])[-1]), ids[:, 1:])
        return loss * grad_scale, loss
