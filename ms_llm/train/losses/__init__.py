"""The training losses: one loss of parts (composed.py), built in one place (`choose`).

    loss = choose(cfg, manifest, model, backend)
    scaled, logged, *aux = loss(grad_scale, *loss.inputs(batches)[i])

    objective   the preference pairs' objective on a preference dataset (preference.py), else the next-token one:
                over the whole logits (token.py) or chunked (chunked.py: train.loss_chunk_tokens > 0), with the loss
                mask of chat data (masked.py: a dataset with a loss_mask column) or without, whatever else the run has
    terms       each entry of TERMS that applies (a mixture of experts' router losses), added to any objective

A new term is a module of its own and one entry in TERMS; a new objective a module and one branch in `objective`.

A loss knows nothing of parallelism: the step owns accumulation and data parallelism and gives a loss summed over
tokens the share it divides by (base.py); the pipelined step has its own loss (ms_llm/train/pipeline_step.py); the
config as run says whether the loss is chunked (not under semi-auto parallel: ms_llm/train/setup/resolve.py).
"""
from ms_llm.data.preference import is_preference
from ms_llm.train.losses.chunked import ChunkedTokens
from ms_llm.train.losses.composed import ComposedLoss
from ms_llm.train.losses.masked import build_mask
from ms_llm.train.losses.preference import PairObjective
from ms_llm.train.losses.presets import ChunkedLoss, MaskedLoss, PreferenceLoss, RoutedLoss, TokenLoss  # noqa: F401
from ms_llm.train.losses.routed import RouterTerm
from ms_llm.train.losses.token import WholeTokens

TERMS = [RouterTerm]


def choose(cfg, manifest, model, backend):
    """The loss cell of a run of `cfg` (resolved) on the dataset of `manifest`, `backend` its fused kernels."""
    return ComposedLoss(model, objective(cfg, manifest, model, backend),
                        [t.build(cfg, model) for t in TERMS if t.applies(cfg, manifest)])


def objective(cfg, manifest, model, backend):
    """What the run trains the model's output on."""
    if is_preference(manifest):  # chosen/rejected pairs (ms-llm preprocess --format preference)
        return PairObjective.of(cfg)
    mask = build_mask(cfg, manifest)
    chunk = cfg.train.loss_chunk_tokens  # 0 under semi-auto parallel (ms_llm/train/setup/resolve.py)
    return ChunkedTokens(chunk, model.dtype, backend, mask) if chunk > 0 else WholeTokens(mask)
