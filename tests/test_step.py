"""The compiled training step: loss scaling, accumulation, clipping, AdamW, LR schedule."""
import dataclasses
import math

import numpy as np
import pytest
import mindspore as ms

from ms_llm.config import load_config
from ms_llm.train.lr_schedule import lr_at, lr_table
from ms_llm.train.optimizer import AdamW
from ms_llm.train.losses import TokenLoss
from ms_llm.train.pipeline_step import PipelineTrainStep
from ms_llm.train.step import AnomalyGuard, StepSpec, TrainStep
from model_zoo import build_model

ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
VOCAB = 40


# One layer: the step's arithmetic (scaling, accumulation, clipping, AdamW) is the same for any depth, and each
# layer adds ~0.5 CPU s to every compile here.
TINY = ["model.preset=tiny-gpt2", "model.num_layers=1", f"model.vocab_size={VOCAB}", "model.seq_length=16",
        "train.max_steps=100", "train.warmup_steps=0", "train.lr=1e-2"]


def make_step(*overrides, accum=1, seed=0, pipeline_micro=0):
    cfg = load_config(None, [*TINY, *overrides])
    ms.set_seed(seed)
    model = build_model(cfg.model, cfg.precision.compute_dtype)
    t = cfg.train
    opt = AdamW(model.trainable_params(), t.beta1, t.beta2, t.eps, t.weight_decay)
    if pipeline_micro:
        step = PipelineTrainStep(opt, model, StepSpec(cfg.precision, t.clip_grad, lr_table(t)), pipeline_micro)
    else:
        step = TrainStep(opt, TokenLoss(model), StepSpec(cfg.precision, t.clip_grad, lr_table(t), accum=accum))
    model.set_train(True)
    return model, step


def test_a_runs_step_spec_reduces_over_the_ranks_only_where_mindspore_does_not():
    """StepSpec.of_run: data parallelism all-reduces in the step, semi-auto parallel leaves it to MindSpore, the
    pipeline accumulates and reduces itself; the spec is frozen."""
    from types import SimpleNamespace

    cfg = load_config(None, ["model.preset=tiny-gpt2", f"model.vocab_size={VOCAB}", "train.max_steps=10"])
    model = SimpleNamespace()  # no dropout key
    plain = StepSpec.of_run(cfg, SimpleNamespace(pp=1, semi_auto=False, accumulation=3), 4, model, "kernels")
    assert (plain.accum, plain.dp, plain.backend, plain.dropout_key, len(plain.lr_table)) == (3, 4, "kernels", None, 10)
    semi = StepSpec.of_run(cfg, SimpleNamespace(pp=1, semi_auto=True, accumulation=3), 4, model, "kernels")
    assert (semi.accum, semi.dp) == (3, 1)
    piped = StepSpec.of_run(cfg, SimpleNamespace(pp=2, semi_auto=True, accumulation=3), 4, model, "kernels")
    assert (piped.accum, piped.dp) == (1, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plain.dp = 2
    guarded = load_config(None, ["model.preset=tiny-gpt2", "train.max_steps=10", "train.anomaly.zscore=4.5",
                                 "train.anomaly.window=7"])
    spec = StepSpec.of_run(guarded, SimpleNamespace(pp=1, semi_auto=False, accumulation=1), 1, model, "kernels")
    assert plain.anomaly is None and spec.anomaly == AnomalyGuard(zscore=4.5, window=7)


def batch(n, seed=0, seq=16):
    return np.random.default_rng(seed).integers(0, VOCAB, (n, seq + 1)).astype(np.int32)


def params(model):
    return {n: p.asnumpy().copy() for n, p in model.parameters_and_names()}


# The slow tests below share compiled steps where their assertions allow (each TrainStep compiles for ~3-4 CPU s):
# one dynamic-scale step shows both the growth and the skipped overflow, one none/static pair the kept scales, the
# unchanged update and the overfitting of one batch, and one 1x12 / 3x4 / pipelined trio (clipping at 0.01) the
# accumulation, the pipeline and the clip after accumulating.

@pytest.mark.slow  # compiles training steps
def test_dynamic_scale_grows_after_its_window_and_an_injected_overflow_skips_the_update_and_halves_it():
    model, step = make_step("precision.loss_scale=dynamic", "precision.init_scale=8", "precision.scale_window=3")
    scales = [float(step(ms.Tensor(batch(4, s)))[3].asnumpy()) for s in range(7)]
    assert scales == [8, 8, 16, 16, 16, 32, 32]
    assert int(step.optimizer.step.asnumpy()) == 7  # seven applied updates
    before = params(model)
    step.state.loss_scale.set_data(ms.Tensor(3e38, ms.float32))  # scaled gradients overflow to inf
    loss, norm, code, scale = step(ms.Tensor(batch(4)))
    assert int(code.asnumpy()) == 1 and float(scale.asnumpy()) == pytest.approx(1.5e38)  # 1: skipped, non-finite
    after = params(model)
    assert all(np.array_equal(before[k], after[k]) for k in before)  # update skipped
    assert int(step.optimizer.step.asnumpy()) == 7  # Adam's bias-correction clock did not move
    step.state.loss_scale.set_data(ms.Tensor(1024.0, ms.float32))
    _, _, code, scale = step(ms.Tensor(batch(4)))
    assert int(code.asnumpy()) == 0 and float(scale.asnumpy()) == 1024.0  # 0: applied (1 clean step < window 3)
    assert any(not np.array_equal(before[k], v) for k, v in params(model).items())


@pytest.mark.slow  # compiles training steps
def test_static_and_no_scaling_keep_the_scale_do_not_change_the_update_and_overfit_one_batch():
    """One batch of 8, with no loss scaling and with a static scale of 1024: the scales stay, the two runs' weights
    are the same after 3 steps (the scale is taken out before the update), and over 40 steps the tiny model
    overfits the batch (the unscaled run's loss falls below 0.2x its start, from step 23 on at this LR)."""
    m1, s1 = make_step("precision.loss_scale=none", "precision.init_scale=128", "train.lr=3e-3",
                       "train.weight_decay=0")  # none ignores init_scale
    m2, s2 = make_step("precision.loss_scale=static", "precision.init_scale=1024", "train.lr=3e-3",
                       "train.weight_decay=0")
    b = ms.Tensor(batch(8))
    losses, scales1, scales2 = [], [], []
    for i in range(40):
        loss, _, _, scale = s1(b)
        losses.append(float(loss.asnumpy()))
        scales1.append(float(scale.asnumpy()))
        if i < 3:
            scales2.append(float(s2(b)[3].asnumpy()))
        if i == 2:
            p1, p2 = params(m1), params(m2)
            for k in p1:
                np.testing.assert_allclose(p1[k], p2[k], rtol=1e-4, atol=1e-6)
    assert scales1 == [1.0] * 40 and scales2 == [1024.0] * 3
    assert losses[0] == pytest.approx(math.log(VOCAB), rel=0.05)
    assert losses[-1] < 0.2 * losses[0]


def first_moment_norm(step):
    return math.sqrt(sum(float((m.asnumpy().astype(np.float64) ** 2).sum()) for m in step.optimizer.exp_avg))


@pytest.mark.slow  # compiles training steps
def test_accumulation_and_the_pipeline_step_equal_one_big_batch_and_clip_the_accumulated_gradient():
    """1x12 == accumulation 3x4 == the pipelined step of 3 micro-batches on one device, clipping to 0.01 (every
    step clips: the gradient norm is far above it). The pipelined step is TrainStep minus MindSpore's stage split:
    its micro-batch slicing, loss normalisation and the loss scale fed as sens must give the accumulated update
    (dynamic scale 2^16 on all three)."""
    clip = ("train.clip_grad=0.01", "train.global_batch_size=12")
    m1, s1 = make_step(*clip, "train.micro_batch_size=12")
    m2, s2 = make_step(*clip, "train.micro_batch_size=4", accum=3)
    m3, s3 = make_step(*clip, "train.micro_batch_size=4", pipeline_micro=3)
    for s in range(3):
        b = batch(12, s)
        l1, n1, c1, sc1 = s1(ms.Tensor(b))
        for i in range(3):
            s2.accumulate(ms.Tensor(b[4 * i:4 * i + 4]))
        l2, n2, c2, sc2 = s2()  # the update, from the accumulated buffers
        if s == 0:  # a batch handed to the update would be left out: refused
            with pytest.raises(ValueError, match="takes no batch"):
                s2(ms.Tensor(b[8:]))
        l3, n3, c3, sc3 = s3(ms.Tensor(b))
        assert float(l1.asnumpy()) == pytest.approx(float(l2.asnumpy()), rel=1e-5)
        assert float(l3.asnumpy()) == pytest.approx(float(l2.asnumpy()), rel=1e-5)
        assert float(n1.asnumpy()) == pytest.approx(float(n2.asnumpy()), rel=1e-4)
        assert float(n3.asnumpy()) == pytest.approx(float(n2.asnumpy()), rel=1e-4)
        assert int(c1.asnumpy()) == int(c2.asnumpy()) == int(c3.asnumpy()) == 0
        assert float(sc1.asnumpy()) == float(sc2.asnumpy()) == float(sc3.asnumpy())
        if s == 0:  # after one step Adam's first moment is 0.1 * the (clipped) gradient: the same gradient
            for a, b_ in zip(s1.optimizer.exp_avg, s2.optimizer.exp_avg):
                np.testing.assert_allclose(a.asnumpy(), b_.asnumpy(), rtol=1e-4, atol=1e-8)
            assert float(n2.asnumpy()) > 0.1  # the reported norm is the one before clipping
            # (1 - beta1) * the gradient it was given: its norm shows the clip, applied once to the accumulated
            # gradient (not to each micro-batch's), by the accumulating and the pipelined step alike
            assert first_moment_norm(s2) / (1 - 0.9) == pytest.approx(0.01, rel=1e-3)
            assert first_moment_norm(s3) / (1 - 0.9) == pytest.approx(0.01, rel=1e-3)
    # Adam turns float-rounding differences of near-zero gradients into sign flips of size ~lr (1e-2)
    p1, p2, p3 = params(m1), params(m2), params(m3)
    for k in p1:
        np.testing.assert_allclose(p1[k], p2[k], rtol=0, atol=1e-4)
        np.testing.assert_allclose(p3[k], p2[k], rtol=0, atol=1e-4)


def test_weight_decay_only_on_matrices():
    m, s = make_step("train.weight_decay=0.5", "train.lr=0.1")
    opt = s.optimizer
    flags = dict(zip([p.name for p in opt.params], opt.decay_flags))
    assert flags["embedding"] and flags["layers.0.attention.qkv.weight"]
    assert not flags["layers.0.attention.qkv.bias"] and not flags["layers.0.attn_norm.weight"]


def test_adamw_matches_reference_formula():
    """Two steps of our AdamW (fused kernel with folded bias correction) against PyTorch's AdamW maths."""
    w0 = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
    p = ms.Parameter(ms.Tensor(w0), name="w")
    opt = AdamW([p], beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.1)
    w, m, v = w0.astype(np.float64), 0.0, 0.0
    for t, lr in ((1, 1e-2), (2, 5e-3)):
        g = np.random.default_rng(t).normal(size=(3, 4)).astype(np.float32)
        opt((ms.Tensor(g),), ms.Tensor(lr, ms.float32))
        m = 0.9 * m + 0.1 * g
        v = 0.99 * v + 0.01 * g * g
        w = w * (1 - lr * 0.1) - lr * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.99 ** t)) + 1e-8)
    np.testing.assert_allclose(p.asnumpy(), w, rtol=1e-5, atol=1e-6)


def test_lr_schedule_warmup_cosine_linear_constant():
    t = load_config(None, ["train.max_steps=1000", "train.warmup_steps=100", "train.lr=1e-3",
                           "train.min_lr=1e-4"]).train
    assert lr_at(0, t) == pytest.approx(1e-5) and lr_at(99, t) == pytest.approx(1e-3)
    assert lr_at(550, t) == pytest.approx(1e-4 + 0.5 * 0.9e-3)
    assert lr_at(999, t) == pytest.approx(1e-4, rel=1e-3)
    t = dataclasses.replace(t, lr_schedule="linear")
    assert lr_at(550, t) == pytest.approx(1e-4 + 0.5 * 0.9e-3)
    assert lr_at(325, t) == pytest.approx(1e-4 + 0.75 * 0.9e-3)
    t = dataclasses.replace(t, lr_schedule="constant")
    assert lr_at(700, t) == 1e-3


@pytest.mark.parametrize("schedule,decay", [("cosine", None), ("linear", None), ("cosine", 600), ("constant", None)])
def test_the_lr_table_the_step_reads_is_the_schedule_written_out(schedule, decay):
    """The table compiled into the step, against the schedule's formula written here independently of lr_at:
    linear warmup to lr over `warmup` steps, then a decay to min_lr at `decay` (max_steps if null), flat after."""
    n, warmup, lr, min_lr = 1000, 100, 1e-3, 1e-4
    t = load_config(None, [f"train.max_steps={n}", f"train.warmup_steps={warmup}", f"train.lr={lr}",
                           f"train.min_lr={min_lr}", f"train.lr_schedule={schedule}",
                           f"train.decay_steps={decay or 'null'}"]).train
    step = np.arange(n, dtype=np.float64)
    end = decay or n
    progress = np.clip((step - warmup) / (end - warmup), 0.0, 1.0)
    shape = {"cosine": (1 + np.cos(np.pi * progress)) / 2, "linear": 1 - progress, "constant": np.ones(n)}[schedule]
    expected = np.where(step < warmup, lr * (step + 1) / warmup, min_lr + shape * (lr - min_lr))
    if schedule != "constant":
        expected[step >= end] = min_lr
    table = lr_table(t)
    assert table.dtype == np.float32 and table.shape == (n,)
    np.testing.assert_allclose(table, expected, rtol=1e-6)


@pytest.mark.slow  # compiles training steps
def test_anomaly_guard_skips_a_spiking_update_without_touching_the_weights():
    cfg = load_config(None, TINY)
    ms.set_seed(0)
    model = build_model(cfg.model)
    t = cfg.train
    opt = AdamW(model.trainable_params(), t.beta1, t.beta2, t.eps, t.weight_decay)
    step = TrainStep(opt, TokenLoss(model), StepSpec(cfg.precision, t.clip_grad, lr_table(t),
                                                        AnomalyGuard(zscore=3.0, window=5)))
    model.set_train(True)
    constant = np.zeros((8, 17), np.int32)  # an easy batch: the loss and gradients settle quickly
    codes = [int(step(ms.Tensor(constant))[2].asnumpy()) for _ in range(20)]
    assert codes == [0] * 20
    before = params(model)
    loss, _, code, _ = step(ms.Tensor(batch(8, seed=3)))  # unseen random tokens: a loss far above the history
    assert int(code.asnumpy()) == 2
    assert all(np.array_equal(before[k], v) for k, v in params(model).items())
    assert int(step(ms.Tensor(constant))[2].asnumpy()) == 0  # the next ordinary step goes through


@pytest.mark.slow  # two steps op by op, and the data pipeline: 2-3 s
def test_a_plain_gpt2_step_runs_in_at_most_nine_of_the_packages_files(dataset, pynative):
    """A reader follows a step through few files (the model in transformer.py, attention.py and layers.py; the step,
    its optimizer, its loss): counted as the files whose Python runs during one step after the first, in PyNative,
    where the graph's Python runs as Python."""
    import os
    import sys

    import ms_llm
    from ms_llm.train.session import open_session
    from ms_llm.train.step_runner import StepRunner

    cfg = load_config(os.path.join(os.path.dirname(__file__), "..", "configs", "shakespeare_char.yaml"),
                      [f"data.dataset_dir={dataset}", "data.source=null", "context.mode=pynative",
                       "model.num_layers=1", "model.hidden_size=16", "model.num_heads=2", "model.seq_length=32",
                       "train.global_batch_size=2", "train.micro_batch_size=2"])
    s = open_session(cfg, echo=lambda *a: None)
    runner = StepRunner(s, use_compile_cache=False)
    runner.step()
    package = os.path.dirname(os.path.dirname(ms_llm.__file__))
    files = set()

    def seen(frame, event, arg):
        name = frame.f_code.co_filename
        if name.startswith(package) and ("ms_llm" in name or "model_zoo" in name):
            files.add(os.path.relpath(name, package))

    batches = s.next_batches()  # the data, read before the step (the trainer's loop reads it apart too)
    sys.setprofile(seen)
    try:
        out = runner.step(batches)
    finally:
        sys.setprofile(None)
    assert np.isfinite(float(out.loss.asnumpy()))
    assert "ms_llm/nn/transformer.py" in files and "ms_llm/train/step.py" in files, files  # the trace saw the step
    assert len(files) <= 9, sorted(files)
