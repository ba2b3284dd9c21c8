"""The router term of a mixture of experts, added to the run's objective (composed.py): the router's aux loss, the
coefficient-weighted load-balancing and z-losses averaged over the MoE layers (ms_llm.nn.moe, `forward_layers`).

    scaled = (objective + aux) · grad_scale          logged: the objective (comparable with val_loss and dense runs)

The aux loss is differentiated with the objective under the same ÷ accumulation rule, whatever the objective is:
the plain token loss or the masked loss of fine-tuning data (SFT), each whole or chunked, or a preference objective
(DPO, IPO, SimPO). The router statistics of every MoE layer (expert counts, losses, dropped assignments;
ms_llm.nn.moe.STAT_NAMES) are its aux output, summed by the step into the `router_stats` buffer that the trainer
reads once per log interval (train/loop/router_stats.py)."""
from mindspore import ops

from ms_llm.nn.moe import STAT_NAMES
from ms_llm.train.losses.part import Term


class RouterTerm(Term):
    """(router aux loss, router statistics rows) → (aux, (statistics (MoE layers, E + 5),))."""

    reads_router = True

    @classmethod
    def applies(cls, cfg, manifest):
        return cfg.model.moe is not None

    @classmethod
    def build(cls, cfg, model):
        return cls(model.num_moe_layers, model.router_experts)

    def __init__(self, moe_layers, experts):
        super().__init__()
        self.aux_shapes = (("router_stats", (moe_layers, experts + len(STAT_NAMES))),)

    def train(self, router_aux, router_stats):
        return router_aux, (ops.stack(router_stats),)

