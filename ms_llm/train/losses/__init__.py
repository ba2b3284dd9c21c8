"""The training losses: one interface (base.py), chosen in one place (`choose`).

    loss = choose(cfg, parallel, manifest, model, backend, dp)
    scaled, logged, *aux = loss(grad_scale, *loss.inputs(batches)[i])

The first loss in IN_ORDER that applies to the run (its config, parallel layout and dataset) is its loss. A new loss
is a module of its own and one entry in IN_ORDER.
"""
from ms_llm.train.losses.chunked import ChunkedLoss
from ms_llm.train.losses.masked import MaskedLoss
from ms_llm.train.losses.pipeline import PipelineLoss
from ms_llm.train.losses.preference import PreferenceLoss
from ms_llm.train.losses.routed import RoutedLoss
from ms_llm.train.losses.token import TokenLoss

IN_ORDER = [PipelineLoss, PreferenceLoss, MaskedLoss, RoutedLoss, ChunkedLoss, TokenLoss]


def choose(cfg, parallel, manifest, model, backend, dp):
    """The loss cell of a run of `cfg` (resolved) under `parallel` on the dataset of `manifest`."""
    for cls in IN_ORDER:
        if cls.applies(cfg, parallel, manifest):
            return cls.build(cfg, parallel, manifest, model, backend, dp)
    raise AssertionError("TokenLoss applies to every run")
