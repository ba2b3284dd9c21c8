"""The compiled training step.

One optimizer step over `accum` micro-batches on each of `dp` ranks:

    for each micro-batch:  loss = CE(model(ids[:, :-1]), ids[:, 1:]) in float32
                           grads += d(loss / accum * scale) / dW          (value_and_grad)
    all-reduce over data-parallel ranks; grad_norm = ||grads|| / (scale * dp)
    finite = isfinite(grad_norm)                     (inf/NaN in any gradient makes the norm non-finite)
    grads *= min(1, clip / grad_norm) / (scale * dp)  (unscale, average and clip after accumulation)
    if finite: AdamW(grads, lr_table[step])          (else the update is skipped)
    dynamic scale: x factor after scale_window finite steps, / factor on overflow
    anomaly guard (train.anomaly): a finite step whose grad norm or loss is more than `zscore` standard
    deviations above its running mean is skipped too (the statistics live in the graph, so the decision
    costs no host round trip)

The third output says what happened to the update: 0 applied, 1 skipped (non-finite gradients),
2 skipped by the anomaly guard.

A loss summed over tokens (the masked loss of chat data: `Loss.sums_tokens`) is divided by its share of the step's
tokens, which the step computes before each micro-batch's forward (`StepState.loss_inputs`): this rank's count of
them in the step (summed on the host), all-reduced over the data-parallel ranks in the graph, ÷ (accum · dp). The
step's mean of the micro-batch losses is then the mean over every token of every micro-batch and rank, with no host
round trip; the loss itself knows nothing of ranks.

With accum > 1 every micro-batch accumulates (`AccumulateStep`) and `TrainStep`, called without inputs, updates
from the buffers: two graphs, one of them with the model's forward and backward (a TrainStep with its own forward for
the last micro-batch compiled the model twice: 3.8 against 2.6 CPU s for the tests' tiny model at accumulation 2, and
the sums are the same, addition being commutative). With accum == 1 a step is a single compiled call of TrainStep on
the batch. The pipelined step is ms_llm/train/pipeline_step.py. What the step does besides the forward and the
optimizer (precision, clipping, the anomaly guard, accumulation, data parallelism, dropout) is one `StepSpec`, built
from the run's config and layout in `StepSpec.of_run`.
"""
from dataclasses import dataclass
from typing import Any, NamedTuple

import mindspore as ms
from mindspore import Parameter, ParameterTuple, nn, ops
from mindspore.common.initializer import initializer

from ms_llm.nn.backend import PORTABLE
from ms_llm.nn.dropout import KEY_NAME


class AnomalyGuard(NamedTuple):
    """What the in-graph anomaly guard of train.anomaly uses (its rollback settings are the trainer hook's)."""
    zscore: float  # standard deviations above the running mean that make a step a spike
    window: int  # accepted steps the running statistics span, and must have seen before the guard acts


@dataclass(frozen=True, eq=False)
class StepSpec:
    precision: Any  # cfg.precision: the loss scale (none, static or dynamic) and its schedule
    clip_grad: float  # global gradient norm to clip to; 0: no clipping
    lr_table: Any  # the learning rate of every step (ms_llm.train.lr_schedule.lr_table)
    anomaly: Any = None  # AnomalyGuard; None: no guard
    accum: int = 1  # micro-batches per step on this rank
    dp: int = 1  # ranks whose gradients (and token counts) the step all-reduces itself (1 under semi-auto parallel)
    dropout_key: Any = None  # the model's dropout key (ms_llm/nn/dropout.py), or None: a model without dropout
    backend: Any = PORTABLE  # ms_llm.nn.backend.Backend: the fused kernels (the sum of squares of the grad norm)

    @classmethod
    def of_run(cls, cfg, parallel, world_size, model, backend):
        """The step of a run: its config, its parallel layout (`parallel`, ms_llm.parallel.layout.ParallelPlan),
        its world size and the model built for it. The pipelined step takes all micro-batches in one call and its
        reduction is the pipeline's, so it neither accumulates nor all-reduces itself."""
        from ms_llm.train.lr_schedule import lr_table

        t = cfg.train
        pipelined = parallel.pp > 1
        guard = AnomalyGuard(t.anomaly.zscore, t.anomaly.window) if t.anomaly is not None else None
        return cls(cfg.precision, t.clip_grad, lr_table(t), guard,
                   accum=1 if pipelined else parallel.accumulation,
                   dp=1 if pipelined or parallel.semi_auto else world_size,
                   dropout_key=getattr(model, KEY_NAME, None), backend=PORTABLE if pipelined else backend)


def sum_of_squares(x, fused_op=None):
    """Sum of x^2 over all elements: one fused kernel with cpu_kernels, else square + two reductions.
    Reducing the last axis first is ~4x faster on CPU than one all-axes ReduceSum (not vectorised)."""
    if fused_op is not None:
        return fused_op(x)[0]
    sq = ops.square(x)
    if sq.ndim > 1:
        sq = sq.sum(-1)
    return sq.sum()


def squared_norm(grads, fused_all=None, fused_one=None):
    """Σ g² over every gradient: with cpu_kernels one kernel for all of them (bit for bit the AddN of each one's
    sum_of_squares, two kernels fewer per gradient: each kernel launch costs ~15 µs on CPU), else that AddN."""
    if fused_all is not None:
        return fused_all(*grads).reshape(())
    return ops.addn([sum_of_squares(g, fused_one) for g in grads])


def scaled(grads, factor, hyper_map, fused_op=None):
    """Every gradient times `factor`: with cpu_kernels in one kernel (the same float32 multiply as a Mul each, one
    kernel launch in place of one per gradient)."""
    if fused_op is not None:
        return fused_op(*grads, factor.reshape((1,)))
    return hyper_map(ops.partial(ops.mul, factor), grads)


class StepState(nn.Cell):
    """Everything the step owns besides the model and optimizer: loss scale, counters, grad buffers, the sums of the
    loss's aux outputs, the share of a loss summed over tokens."""

    def __init__(self, params, spec, aux_shapes=(), sums_tokens=False):
        super().__init__(auto_prefix=False)
        precision, accum = spec.precision, spec.accum
        self.lr_scale = Parameter(initializer(1.0, (), ms.float32), name="lr_scale")  # lowered by rollbacks
        self.anomaly_count = Parameter(initializer(0, (), ms.int32), name="anomaly_count")
        self.anomaly_stats = Parameter(initializer(0, (4,), ms.float32), name="anomaly_stats")  # EMA mean/var x2
        init_scale = precision.init_scale if precision.loss_scale != "none" else 1.0
        self.loss_scale = Parameter(initializer(init_scale, (), ms.float32), name="loss_scale")
        self.good_steps = Parameter(initializer(0, (), ms.int32), name="good_steps")
        self.global_step = Parameter(initializer(0, (), ms.int32), name="global_step")
        self.accum_loss = Parameter(initializer(0, (), ms.float32), name="accum_loss")
        self.grad_buffers = params.clone(prefix="grad_accum", init="zeros") if accum > 1 else None
        self.lr_table = ms.Tensor(spec.lr_table)
        # the loss's aux outputs (a mixture of experts' router statistics) summed over the micro-batches since the
        # host last read them (once per log interval: train/loop/router_stats.py)
        self.aux_sums = ParameterTuple([Parameter(initializer(0, shape, ms.float32), name=name, requires_grad=False)
                                        for name, shape in aux_shapes])
        self.has_aux = len(aux_shapes) > 0
        # dropout: the model's key (seed, step, micro-batch, rank, dp) gets this step's and micro-batch's numbers
        # before each forward, so that a mask is a function of them (ms_llm/nn/dropout.py)
        self.has_dropout = spec.dropout_key is not None
        self.micro = Parameter(initializer(0, (), ms.int32), name="micro_batch", requires_grad=False) \
            if self.has_dropout else None
        self.sums_tokens, self.accum, self.dp = sums_tokens, accum, spec.dp
        self.all_reduce = ops.AllReduce() if sums_tokens and spec.dp > 1 else None

    def loss_inputs(self, inputs):
        """The loss's arguments after grad_scale, from a micro-batch's inputs. A loss summed over tokens gets, in
        place of this rank's count of them in the step (its first input), the share it divides by: that count over
        every rank, at least 1 (an all-zero mask: loss 0, gradients 0), ÷ (accum · dp)."""
        if not self.sums_tokens:
            return inputs
        count = inputs[0]
        total = self.all_reduce(count) if self.dp > 1 else count
        return (ops.maximum(total, 1.0) / (self.accum * self.dp),) + inputs[1:]

    def key_dropout(self, dropout_key, last):
        """Write (global step, micro-batch) into the model's dropout key before a micro-batch's forward, and count
        the micro-batch: the step's `last` one starts the next step at micro-batch 0."""
        now = ops.stack([self.global_step.value(), self.micro.value()])
        ops.assign(dropout_key, ops.concat([dropout_key[0:1], now, dropout_key[3:]]))
        ops.assign(self.micro, ops.zeros((), ms.int32) if last else self.micro + 1)

    def add_aux(self, aux):
        for total, x in zip(self.aux_sums, aux):
            ops.assign_add(total, x.astype(ms.float32))


class AccumulateStep(nn.Cell):
    """A micro-batch that is not the last of its step: add its gradients to the buffers."""

    def __init__(self, loss, weights, state, accum):
        super().__init__(auto_prefix=False)
        # The loss cell is an attribute, not only captured by grad_fn: a graph loaded from the compile cache is
        # bound to the parameters its Cell owns, and any other parameter it reads becomes a private zero copy.
        self.loss, self.state = loss, state
        self.grad_fn = ms.value_and_grad(loss, None, weights, has_aux=True)
        self.hyper_map = ops.HyperMap()
        self.accum = accum
        self.dropout_key = getattr(loss.model, KEY_NAME, None) if state.has_dropout else None

    def construct(self, *inputs):
        st = self.state
        if st.has_dropout:
            st.key_dropout(self.dropout_key, last=False)
        out, grads = self.grad_fn(st.loss_scale.value() / self.accum, *st.loss_inputs(inputs))
        loss = out[1]
        self.hyper_map(ops.assign_add, st.grad_buffers, grads)
        ops.assign_add(st.accum_loss, loss)
        if st.has_aux:
            st.add_aux(out[2:])
        return loss


class TrainStep(nn.Cell):
    """The last micro-batch of a step plus the update. Returns (loss, grad_norm, code, loss_scale); code: 0 applied,
    1 skipped (non-finite), 2 skipped by the anomaly guard. `loss`: the run's loss cell (ms_llm/train/losses)."""

    def __init__(self, optimizer, loss, spec):
        super().__init__(auto_prefix=False)
        anomaly, precision, accum, dp = spec.anomaly, spec.precision, spec.accum, spec.dp
        self.guard = anomaly is not None
        if self.guard:
            self.zscore, self.window = anomaly.zscore, anomaly.window
            self.ema = 2.0 / (anomaly.window + 1)
        self.optimizer = optimizer
        self.weights = optimizer.params
        self.loss = loss
        self.grad_fn = self.loss_and_grad()
        self.dropout_key = spec.dropout_key
        self.state = StepState(self.weights, spec, loss.aux_shapes, loss.sums_tokens)
        self.accumulate = AccumulateStep(loss, self.weights, self.state, accum) if accum > 1 else None
        self.accum, self.dp, self.clip = accum, dp, spec.clip_grad
        self.dynamic = precision.loss_scale == "dynamic"
        self.scale_window, self.scale_factor = precision.scale_window, precision.scale_factor
        self.last_step = len(spec.lr_table) - 1
        self.hyper_map = ops.HyperMap()
        self.all_reduce = ops.AllReduce() if dp > 1 else None
        self.sum_squares = spec.backend.kernel("sum_squares")
        self.sum_squares_all = spec.backend.kernel("sum_squares_all")
        self.scale_all = spec.backend.kernel("scale_all")
        self.set_train(True)  # the loss and the model inside train (dropout on, the loss's gradient path)

    def loss_and_grad(self):
        return ms.value_and_grad(self.loss, None, self.weights, has_aux=True)

    def gradients(self, scale, *inputs):
        """(mean loss of the step, gradients of loss * scale summed over its micro-batches and ranks): of `inputs`
        (accum == 1), or read from the buffers every micro-batch was accumulated into, which start the next step
        at zero."""
        st = self.state
        if self.accum > 1:  # the buffers themselves: construct zeroes them once the update has read them
            grads = st.grad_buffers
            loss = st.accum_loss.value() / self.accum
        else:
            if st.has_dropout:
                st.key_dropout(self.dropout_key, last=True)
            out, grads = self.grad_fn(scale, *st.loss_inputs(inputs))
            loss = out[1]
            if st.has_aux:
                st.add_aux(out[2:])
        if self.dp > 1:
            grads = self.hyper_map(self.all_reduce, grads)
            loss = self.all_reduce(loss) / self.dp
        return loss, grads

    def construct(self, *inputs):
        if self.accum > 1 and inputs:  # (decided at compile time) a batch given here would be silently left out
            raise ValueError("with accumulation, TrainStep() takes no batch: accumulate every micro-batch first")
        st = self.state
        scale = st.loss_scale.value()
        loss, grads = self.gradients(scale, *inputs)
        # Gradients are still multiplied by scale * dp here. One norm serves three purposes: it is finite
        # exactly when every gradient is (an inf or NaN anywhere makes the sum of squares inf or NaN), it is
        # the reported grad norm once divided by scale * dp, and it sets the clip factor. Unscaling and
        # clipping are then one multiply per gradient instead of 2 + an IsFinite/ReduceAll pair.
        inv = 1.0 / (scale * self.dp)
        grad_norm = ops.sqrt(squared_norm(grads, self.sum_squares_all, self.sum_squares)) * inv
        finite = ops.isfinite(grad_norm)
        factor = inv
        if self.clip > 0:
            factor = inv * ops.minimum(self.clip / (grad_norm + 1e-6), 1.0)
        grads = scaled(grads, factor, self.hyper_map, self.scale_all)
        if self.accum > 1:
            self.next_step_starts_at_zero()
        lr = st.lr_table[ops.minimum(st.global_step, self.last_step)] * st.lr_scale
        update = finite
        code = ops.select(finite, ops.zeros((), ms.int32), ops.ones((), ms.int32))
        if self.guard:
            spike = self.anomalous(grad_norm, loss) & finite
            update = finite & ops.logical_not(spike)
            code = ops.select(spike, ops.ones((), ms.int32) * 2, code)
        if update:
            self.optimizer(grads, lr)
        ops.assign(st.global_step, st.global_step + 1)
        if self.dynamic:
            good = ops.select(finite, st.good_steps + 1, ops.zeros((), ms.int32))
            grow = good >= self.scale_window
            new_scale = ops.select(finite, ops.select(grow, scale * self.scale_factor, scale),
                                   ops.maximum(scale / self.scale_factor, 1.0))
            ops.assign(st.good_steps, ops.select(grow, ops.zeros((), ms.int32), good))
            ops.assign(st.loss_scale, new_scale)
        return loss, grad_norm, code, st.loss_scale.value()

    def next_step_starts_at_zero(self):
        """The buffers and the loss sum cleared, after the update's last read of them; dropout's micro-batch count
        back to 0."""
        st = self.state
        self.hyper_map(ops.assign, st.grad_buffers, self.hyper_map(ops.zeros_like, st.grad_buffers))
        ops.assign(st.accum_loss, ops.zeros((), ms.float32))
        if st.has_dropout:
            ops.assign(st.micro, ops.zeros((), ms.int32))

    def anomalous(self, grad_norm, loss):
        """z-score of grad norm and loss against exponential moving statistics over ~`window` accepted steps;
        the statistics only absorb steps that were accepted, so a run of spikes cannot normalise itself."""
        st = self.state
        stats = st.anomaly_stats.value()
        x = ops.stack([grad_norm, loss.astype(ms.float32)])
        mean, var = stats[0::2], stats[1::2]
        z = (x - mean) / ops.sqrt(var + 1e-12)
        warm = st.anomaly_count >= self.window
        spike = warm & ((z[0] > self.zscore) | (z[1] > self.zscore))
        a = ops.select(st.anomaly_count == 0, ops.ones((), ms.float32), ops.ones((), ms.float32) * self.ema)
        new_mean = mean + a * (x - mean)
        new_var = (1 - a) * (var + a * (x - mean) * (x - mean))
        accept = ops.isfinite(x).all() & ops.logical_not(spike)
        new_stats = ops.stack([new_mean[0], new_var[0], new_mean[1], new_var[1]])
        ops.assign(st.anomaly_stats, ops.select(accept, new_stats, stats))
        ops.assign(st.anomaly_count, st.anomaly_count + ops.select(accept, ops.ones((), ms.int32),
                                                               ops.zeros((), ms.int32)))
        return spike

