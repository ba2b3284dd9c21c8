"""Dropout whose mask is a function of (seed, step, micro-batch, sample, dropout site, element), not of a
generator's hidden state.

MindSpore's Dropout draws from a per-kernel stateful generator: two cold runs of one config part after a few steps
on CPU (the kernel's threads take their streams in whatever order they run), and neither a resume nor a graph loaded
from the compile cache can continue the stream. Here the mask is a counter-based hash (the integer finaliser of
Mueller's hash32, on 31-bit values in int64 so that no product overflows):

    site key  = mix(mix(seed · 1000003 + site) ^ step)
    row key   = mix(site key ^ mix(sample))           sample = (micro · B + row) · dp + rank: the row's position in
                                                       the optimizer step's global batch
    keep      = mix(row key ^ element)  & 2²⁴-1  >=  p · 2²⁴

so a rerun, a resume (the step counter is checkpointed), a cached graph and the same global batch split over more
ranks or micro-batches draw the same masks. The key lives in one int32 parameter of the model, `dropout_key`
(seed, step, micro-batch, rank, data-parallel size): the model is built with it (`bind_dropout`), the training step
writes (step, micro-batch) into it before each micro-batch's forward, and a graph binds it like any other parameter.
Outside training (`set_train(False)`) a site is the identity. On a backend with the fused CPU kernels the mask is one
kernel (DropoutKeep, bit for bit this hash) instead of some fifty ops a site: a graph with dropout compiled in 2.4x
the time of one without on CPU before it.
"""
import numpy as np

import mindspore as ms
from mindspore import Parameter, nn, ops

KEY_NAME = "dropout_key"
_M31 = (1 << 31) - 1
_MUL = 0x45D9F3B  # < 2^27: a 31-bit value times this stays below 2^58
_BITS = 1 << 24


def _mix(x):
    x = ((x ^ ops.floor_divide(x, 65536)) * _MUL) & _M31
    x = ((x ^ ops.floor_divide(x, 65536)) * _MUL) & _M31
    return x ^ ops.floor_divide(x, 65536)


def keep_mask(shape, key, site, p):
    """Boolean mask of `shape` (rows on the first axis) with P(keep) = 1 - p, from the key and the site's number."""
    k = key.astype(ms.int64)
    rows = shape[0]
    width = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    site_key = _mix(_mix((k[0] * 1000003 + site) & _M31) ^ k[1])
    sample = (k[2] * rows + ops.arange(0, rows, dtype=ms.int64)) * k[4] + k[3]
    row_key = _mix(site_key ^ _mix(sample & _M31)).reshape(rows, 1)
    h = _mix(row_key ^ ops.arange(0, width, dtype=ms.int64).reshape(1, width))
    return ((h & (_BITS - 1)) >= int(round(p * _BITS))).reshape(shape)


class StatelessDropout(nn.Cell):
    """Dropout with probability p, its mask from the model's dropout key (`bind_dropout` numbers the sites)."""

    def __init__(self, p):
        super().__init__()
        if not 0.0 < p < 1.0:
            raise ValueError(f"dropout probability must be in (0, 1), got {p}")
        self.p = float(p)
        self.site = 0
        self.key = None
        self.fused_mask = None  # the fused CPU kernel of keep_mask (bind_dropout), or None: the composition
        self.site_threshold = None

    def construct(self, x):
        if not self.training:
            return x
        if self.fused_mask is not None:
            keep = self.fused_mask(x, self.key, self.site_threshold)
        else:
            keep = keep_mask(x.shape, self.key, self.site, self.p)
        return ops.select(keep, x / (1.0 - self.p), ops.zeros_like(x))


def dropout_site(p):
    """A dropout site of probability p, or the identity when p is 0."""
    return StatelessDropout(p) if p > 0 else nn.Identity()


def bind_dropout(model, backend=None):
    """Give every dropout site of `model` its number and the model's one key parameter (made here on first use;
    seed 0, step 0, rank 0 of 1 until the training step says otherwise), and the fused mask kernel when the backend
    the model was built for has it. Call again after adding sites (LoRA), without `backend`: the model's is kept."""
    if backend is not None:
        model.dropout_backend = backend
    backend = getattr(model, "dropout_backend", None)
    sites = [cell for _, cell in model.cells_and_names() if isinstance(cell, StatelessDropout)]
    if not sites:
        return None
    key = getattr(model, KEY_NAME, None)
    if key is None:
        key = Parameter(ms.Tensor(np.array([0, 0, 0, 0, 1], np.int32)), name=KEY_NAME, requires_grad=False)
        setattr(model, KEY_NAME, key)
    fused = backend.kernel("dropout_keep") if backend is not None else None
    for number, cell in enumerate(sites):
        cell.site, cell.key, cell.fused_mask = number, key, fused
        cell.site_threshold = ms.Tensor(np.array([number, int(round(cell.p * _BITS))], np.int32))
    return key


def seed_dropout(model, seed, rank=0, data_parallel=1):
    """Set the run's seed and this rank's place in the global batch in the model's dropout key (no-op without
    dropout)."""
    key = getattr(model, KEY_NAME, None)
    if key is not None:
        key.set_data(ms.Tensor(np.array([seed % _M31, 0, 0, rank, data_parallel], np.int32)))
