"""The loss under pipeline parallelism (Ascend): MindSpore's `Pipeline` wrapper slices the step's micro-batches and
schedules the stages; the loss of one micro-batch, divided by their number, sits on the last stage.

The one loss that does not take grad_scale as an input: the wrapper slices every input along the batch, so the loss
scale enters as the backward's initial gradient instead (train/step.py, PipelineTrainStep)."""
import mindspore as ms
from mindspore import nn

from ms_llm.train.losses.base import Loss, cross_entropy


class StageLoss(nn.Cell):
    """cross_entropy as a Cell, so that pipeline parallelism can place it on the last stage."""

    def construct(self, logits, targets):
        return cross_entropy(logits, targets)


class PipelineLoss(Loss):
    """ids (B, T+1) → loss / micro_batch_num: the pipeline wrapper sums these over the micro-batches of a step."""

    @classmethod
    def applies(cls, cfg, parallel, manifest):
        return parallel.pp > 1

    @classmethod
    def build(cls, cfg, parallel, manifest, model, backend, dp):
        # compiled once for all micro-batches where the backend can call a subgraph
        return (ReusedPipelineLoss if backend.ascend else PipelineLoss)(model, parallel.micro_batch_num)

    def __init__(self, model, micro_batch_num):
        super().__init__(model, 1)
        self.loss = StageLoss()
        self.micro_batch_num = micro_batch_num

    def construct(self, ids):
        return self.loss(self.model(ids[:, :-1]), ids[:, 1:]) / self.micro_batch_num


class ReusedPipelineLoss(PipelineLoss):
    """Compiled once for all micro-batches of the pipeline (MindSpore deprecates pipelines without it)."""

    @ms.lazy_inline
    def __init__(self, model, micro_batch_num):
        super().__init__(model, micro_batch_num)
