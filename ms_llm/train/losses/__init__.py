"""The training losses: one loss of parts (composed.py), built in one place (`choose`).

    loss = choose(cfg, parallel, manifest, model, backend, dp)
    scaled, logged, *aux = loss(grad_scale, *loss.inputs(batches)[i])

The objective is the first entry of IN_ORDER that applies to the run (its config, parallel layout and dataset);
each entry of TERMS that applies is then added to it (a mixture of experts' router losses to the plain, the masked
or the preference objective alike). A new objective or term is a module of its own and one entry in a list.
"""
from ms_llm.train.losses.chunked import ChunkedLoss
from ms_llm.train.losses.composed import ComposedLoss
from ms_llm.train.losses.masked import MaskedLoss
from ms_llm.train.losses.pipeline import PipelineLoss
from ms_llm.train.losses.preference import PreferenceLoss
from ms_llm.train.losses.routed import RoutedLoss, RouterTerm
from ms_llm.train.losses.token import TokenLoss

IN_ORDER = [PipelineLoss, PreferenceLoss, MaskedLoss, RoutedLoss, ChunkedLoss, TokenLoss]
TERMS = [RouterTerm]


def choose(cfg, parallel, manifest, model, backend, dp):
    """The loss cell of a run of `cfg` (resolved) under `parallel` on the dataset of `manifest`."""
    loss = next(cls for cls in IN_ORDER if cls.applies(cfg, parallel, manifest)).build(cfg, parallel, manifest,
                                                                                      model, backend, dp)
    if isinstance(loss, ComposedLoss):  # the pipeline's loss is the pipeline wrapper's own (pipeline.py)
        for term in TERMS:
            if term.applies(cfg, parallel, manifest) and not loss.has_term(term):
                loss.add_term(term.build(cfg, model))
    return loss
