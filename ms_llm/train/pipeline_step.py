"""The pipelined step (parallel.pp > 1, Ascend) and its loss: one call takes all `micro_batch_num` micro-batches of
the step on this data-parallel rank, concatenated. MindSpore's `Pipeline` wrapper slices them and schedules the
stages (1F1B); the loss of one micro-batch, divided by their number, sits on the last stage; the pipeline
accumulates each stage's gradients, and `reducer` (PipelineGradReducer) hands them over and clears them.

The loss is the step's own, built here from the model: the plain token cross-entropy (the losses of
ms_llm/train/losses are the other steps'). It does not take grad_scale as an input: the wrapper slices every input
along the batch, so the loss scale enters as the backward's initial gradient (sens) instead. Unscaling, the overflow
check, clipping, the anomaly guard and the update are TrainStep's (ms_llm/train/step.py).

With `reducer=None` (a single device) the same graph is plain gradient accumulation inside one call, which is how
the CPU tests check it against TrainStep.
"""
import mindspore as ms
from mindspore import nn, ops

from ms_llm.train.losses.base import Loss, cross_entropy
from ms_llm.train.step import TrainStep


class StageLoss(nn.Cell):
    """cross_entropy as a Cell, so that pipeline parallelism can place it on the last stage."""

    def construct(self, logits, targets):
        return cross_entropy(logits, targets)


class PipelineLoss(Loss):
    """ids (B, T+1) → loss / micro_batch_num: the pipeline wrapper sums these over the micro-batches of a step."""

    def __init__(self, model, micro_batch_num):
        super().__init__(model)
        self.loss = StageLoss()
        self.micro_batch_num = micro_batch_num

    def construct(self, ids):
        return self.loss(self.model(ids[:, :-1]), ids[:, 1:]) / self.micro_batch_num


class ReusedPipelineLoss(PipelineLoss):
    """Compiled once for all micro-batches of the pipeline (MindSpore deprecates pipelines without it)."""

    @ms.lazy_inline
    def __init__(self, model, micro_batch_num):
        super().__init__(model, micro_batch_num)


class PipelineTrainStep(TrainStep):
    """TrainStep whose gradients are the pipeline's. `reuse`: the micro-batch loss compiled once for all of them
    (where the device can call a subgraph: Ascend)."""

    def __init__(self, optimizer, model, spec, micro_batch_num, reducer=None, reuse=False):
        """`spec`: accum and dp 1 (the pipeline accumulates and its reducer reduces: StepSpec.of_run)."""
        from mindspore.parallel.nn import Pipeline

        loss = (ReusedPipelineLoss if reuse else PipelineLoss)(model, micro_batch_num)
        super().__init__(optimizer, loss, spec)
        self.pipeline = Pipeline(loss, micro_batch_num)
        self.grad_op = ops.GradOperation(get_by_list=True, sens_param=True)
        self.reducer = reducer
        self.has_reducer = reducer is not None

    def loss_and_grad(self):
        return None  # the pipeline wrapper is differentiated instead (gradients)

    @property
    def loss_cell(self):
        return self.pipeline.network.loss

    def gradients(self, scale, ids):
        loss = self.pipeline(ids)
        grads = self.grad_op(self.pipeline, self.weights)(ids, ops.ones_like(loss) * scale)
        if self.has_reducer:
            grads = self.reducer(grads)
        return loss, grads
