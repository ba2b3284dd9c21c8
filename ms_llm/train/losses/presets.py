"""Named losses of parts, for the tools and tests that build a loss by hand (a run's own is `choose`'s,
ms_llm/train/losses/__init__.py): each is a ComposedLoss, its objective and terms fixed, with MindSpore's own ops
(no fused kernels)."""
from ms_llm.train.losses.chunked import ChunkedTokens
from ms_llm.train.losses.composed import ComposedLoss
from ms_llm.train.losses.masked import LossMask
from ms_llm.train.losses.preference import PairObjective
from ms_llm.train.losses.routed import RouterTerm
from ms_llm.train.losses.token import WholeTokens


class TokenLoss(ComposedLoss):
    """The mean token cross-entropy over the whole logits, nothing added."""

    def __init__(self, model):
        super().__init__(model, WholeTokens())


class ChunkedLoss(ComposedLoss):
    """The chunked token objective, nothing added: equal to the whole-logits loss within float32 rounding."""

    def __init__(self, model, chunk):
        super().__init__(model, ChunkedTokens(chunk, model.dtype))


class MaskedLoss(ComposedLoss):
    """The token objective with the loss mask, over the whole logits or (`chunk` > 0) a chunk at a time:
    (grad_scale, share, ids (B, T+1), weights (B, T), segments (B, T+1), prompt weights (B, T)) → (loss ·
    grad_scale, loss)."""

    def __init__(self, model, use_mask=True, with_documents=True, chunk=0):
        mask = LossMask(use_mask, with_documents)
        super().__init__(model, ChunkedTokens(chunk, model.dtype, mask=mask) if chunk else WholeTokens(mask))


class RoutedLoss(ComposedLoss):
    """A mixture of experts on plain text: the token objective over the whole logits plus the router term."""

    def __init__(self, model):
        super().__init__(model, WholeTokens(), [RouterTerm(model.num_moe_layers, model.router_experts)])


class PreferenceLoss(ComposedLoss):
    """The pair objective (preference.py), nothing added."""

    def __init__(self, model, objective="dpo", beta=0.1, simpo_gamma=0.5):
        super().__init__(model, PairObjective(objective, beta, simpo_gamma))
