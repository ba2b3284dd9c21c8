"""Router health of a mixture-of-experts run, per MoE layer and log interval, for metrics.jsonl.

The training step adds every micro-batch's router statistics (expert counts, load-balancing loss, z-loss, dropped
assignments; ms_llm.nn.moe.STAT_NAMES), the aux output of the routed loss (train/losses/routed.py), into one buffer
inside the compiled graph (`StepState.aux_sums`, named router_stats); the
host reads that buffer once per log interval, as it reads the loss, and zeroes it. A checkpoint keeps the buffer,
so a resumed run logs the interval it was in as an uninterrupted one would.

Fields of a log record, for the MoE layer with index L (the layer's index in the model, not among MoE layers):

    moe/L/share          each expert's share of the interval's (token, expert) assignments (sums to 1; fair: 1/E)
    moe/L/max_min        busiest expert's tokens / idlest expert's (1.0: balanced; null when an expert got none)
    moe/L/lb_loss        load-balancing loss, mean over the interval's micro-batches (1.0 balanced, E collapsed)
    moe/L/z_loss         router z-loss, mean over the micro-batches
    moe/L/dropped        assignments dropped at capacity in the interval (0 when dropless)
    moe/L/dropped_frac   dropped / assignments
    aux_loss             what the router losses added to each micro-batch's loss: aux_loss_coef · lb_loss +
                         z_loss_coef · z_loss, averaged over the MoE layers (as the step adds it)
"""
import numpy as np

from ms_llm.config.validate import moe_layers
from ms_llm.nn.moe import STAT_NAMES

N_STATS = len(STAT_NAMES)


def interval_fields(sums, layers, aux_coef, z_coef):
    """The metrics fields of one interval from the summed statistics `sums` (MoE layers, E + 5) of `layers`."""
    out = {}
    lbs, zs = [], []
    for row, layer in zip(np.asarray(sums, dtype=np.float64), layers):
        counts, named = row[:-N_STATS], dict(zip(STAT_NAMES, row[-N_STATS:]))
        lb, z, dropped, assignments, calls = (named[k] for k in ("lb_loss", "z_loss", "dropped", "assignments",
                                                                 "calls"))
        if calls <= 0:
            return {}  # no step since the last read (a log right after a resume at a log boundary)
        total = counts.sum()
        lbs.append(lb / calls)
        zs.append(z / calls)
        out[f"moe/{layer}/share"] = [round(float(c / total), 6) for c in counts] if total else [0.0] * len(counts)
        out[f"moe/{layer}/max_min"] = float(counts.max() / counts.min()) if counts.min() > 0 else None
        out[f"moe/{layer}/lb_loss"] = float(lb / calls)
        out[f"moe/{layer}/z_loss"] = float(z / calls)
        out[f"moe/{layer}/dropped"] = int(round(dropped))
        out[f"moe/{layer}/dropped_frac"] = float(dropped / assignments) if assignments else 0.0
    out["aux_loss"] = float(aux_coef * np.mean(lbs) + z_coef * np.mean(zs))
    return out


class RouterStats:
    """`RouterStats(session).read()` → the interval's fields (one host read of the step's buffer, then zeroed)."""

    def __init__(self, session):
        m = session.cfg.model
        self.buffer = router_buffer(session.step_fn.state)
        self.layers = moe_layers(m)
        self.aux_coef, self.z_coef = m.moe.aux_loss_coef, m.moe.z_loss_coef

    def read(self):
        import mindspore as ms

        sums = self.buffer.asnumpy().copy()
        self.buffer.set_data(ms.Tensor(np.zeros(sums.shape, np.float32)))
        return interval_fields(sums, self.layers, self.aux_coef, self.z_coef)


def router_buffer(state):
    return next((p for p in state.aux_sums if p.name == "router_stats"), None)


def router_stats_for(session):
    """A RouterStats for a session whose model has MoE layers (and a step that accumulates them), else None."""
    if session.cfg.model.moe is None or router_buffer(session.step_fn.state) is None:
        return None
    return RouterStats(session)
