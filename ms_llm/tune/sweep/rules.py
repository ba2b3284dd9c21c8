"""The tuning rules of docs/tuning.md as checks on a sweep: warnings, never refusals.

- Warmup is usually 1-3% of the steps.
- One dimension at a time: a one-at-a-time sweep whose golden start already moves the learning rate and the
  batch size together (through --set) cannot say which of the two did what; and the peak LR scales with the
  batch size (linearly or as its square root), so an LR tuned before the batch size belongs to the old batch.
"""
from ms_llm.tune.values import show

WARMUP_RANGE = (0.01, 0.03)
LR_KEYS = ("train.lr",)
BATCH_KEYS = ("train.global_batch_size", "train.micro_batch_size")


def plan_warnings(spec):
    from ms_llm.config import load_config

    out = []
    base = load_config(spec.config, spec.overrides + spec.fixed)
    warmups = spec.vary.get("train.warmup_steps", [base.train.warmup_steps])
    for w in warmups:
        share = w / spec.steps
        if not WARMUP_RANGE[0] <= share <= WARMUP_RANGE[1]:
            lo, hi = (max(1, round(f * spec.steps)) for f in WARMUP_RANGE)
            out.append(f"train.warmup_steps = {w} is {100 * share:.1f}% of the {spec.steps} steps of a trial; the "
                       f"common practice (docs/tuning.md) puts warmup at 1-3% of the steps ({lo}-{hi} here): "
                       f"--set train.warmup_steps={round(0.02 * spec.steps) or 1}")
    if spec.strategy == "one-at-a-time":
        out += lr_batch_warnings(spec, base)
    return out


def lr_batch_warnings(spec, base):
    from ms_llm.config import load_config

    out = []
    plain = load_config(spec.config, [o for o in spec.fixed if o.startswith("train.max_steps")])
    moved = [k for k in LR_KEYS + BATCH_KEYS if _get(plain, k) != _get(base, k)]
    if any(k in LR_KEYS for k in moved) and any(k in BATCH_KEYS for k in moved):
        out.append("the golden start changes the learning rate and the batch size together ("
                   + ", ".join(f"{k}: {show(_get(plain, k))} → {show(_get(base, k))}" for k in moved)
                   + "); one-at-a-time tuning changes one dimension at a time from a golden config: fix one of them "
                     "in the config and vary the other")
    keys = list(spec.vary)
    lr = [i for i, k in enumerate(keys) if k in LR_KEYS]
    batch = [i for i, k in enumerate(keys) if k in BATCH_KEYS]
    if lr and batch and lr[0] < batch[0]:
        out.append(f"{keys[lr[0]]} is tuned before {keys[batch[0]]}: the best LR found belongs to the golden batch "
                   f"size, and the peak LR scales with the batch (linearly or as its square root; docs/tuning.md). Put "
                   f"--vary {keys[batch[0]]} first, or keep --rounds >= 2 so the LR is tuned again at the new batch")
    return out


def edge_notes(spec, best):
    """A best value at the end of its range may not be the optimum: the range should be extended."""
    out = []
    for key, values in spec.vary.items():
        numeric = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        v = best["values"].get(key)
        if len(numeric) >= 3 and v in (min(numeric), max(numeric)):
            side = "largest" if v == max(numeric) else "smallest"
            if side == "smallest" and v == 0:
                continue  # weight decay, dropout, warmup: nothing lies below 0
            out.append(f"the best {key} = {show(v)} is the {side} value tried: the optimum may lie beyond it; extend "
                       f"the range on that side")
    return out


def _get(cfg, key):
    section, name = key.split(".", 1)
    return getattr(getattr(cfg, section), name)
