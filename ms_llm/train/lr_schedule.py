"""Learning-rate schedules: linear warmup, then cosine / linear decay to min_lr, or constant.

`lr_at` is the single definition; the compiled step gathers from `lr_table`, built from it, so the
logged LR and the applied LR cannot disagree.
"""
import math

import numpy as np


def lr_at(step, t):
    """LR for optimizer step `step` (0-based) under TrainConfig `t`."""
    if t.warmup_steps and step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    if t.lr_schedule == "constant":
        return t.lr
    decay_steps = t.decay_steps or t.max_steps
    if step >= decay_steps:
        return t.min_lr
    progress = (step - t.warmup_steps) / max(1, decay_steps - t.warmup_steps)
    if t.lr_schedule == "cosine":
        coeff = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        coeff = 1.0 - progress
    return t.min_lr + coeff * (t.lr - t.min_lr)


def lr_table(t):
    return np.array([lr_at(s, t) for s in range(t.max_steps)], dtype=np.float32)
