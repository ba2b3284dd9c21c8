"""The loss of a mixture of experts: the LM cross-entropy plus the router's aux loss (load balancing, z-loss).

    scaled = (CE + aux) · grad_scale          logged: CE (comparable with val_loss and with dense runs)

The aux loss is differentiated with the LM loss and under the same ÷ accumulation rule. The router statistics of
every MoE layer (expert counts, losses, dropped assignments; ms_llm.nn.moe.STAT_NAMES) are its aux output, summed
by the step into the `router_stats` buffer that the trainer reads once per log interval (train/loop/router_stats.py).
The whole logits are used: the chunked loss has no router term."""
from mindspore import ops

from ms_llm.nn.moe import STAT_NAMES
from ms_llm.train.losses.base import Loss, cross_entropy


class RoutedLoss(Loss):
    @classmethod
    def applies(cls, cfg, parallel, manifest):
        return cfg.model.moe is not None

    def __init__(self, model, accum):
        super().__init__(model, accum)
        self.aux_shapes = (("router_stats", (model.num_moe_layers, model.router_experts + len(STAT_NAMES))),)

    def construct(self, grad_scale, ids):
        states, aux, stats = self.model.forward_layers(ids[:, :-1])
        loss = cross_entropy(self.model.logits(states[-1]), ids[:, 1:])
        return (loss + aux) * grad_scale, loss, ops.stack(stats)
