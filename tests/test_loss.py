"""The chunked LM-head cross-entropy (ms_llm.train.loss) against the whole-logits loss it replaces: loss and every
gradient, tied and untied heads, uneven chunks, token weights, float16 compute, accumulation, evaluation."""

import numpy as np
import pytest
import mindspore as ms
from mindspore import Parameter, nn, ops

from conftest import op_by_op
from ms_llm.config import load_config
from ms_llm.errors import UserError
from ms_llm.nn import cpu_kernels
from ms_llm.nn.backend import PORTABLE, Backend
from ms_llm.train.losses.chunked import ChunkedCrossEntropy, ChunkedCrossEntropyLoss, chunk_bounds, mean_denominator

ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
BACKENDS = [pytest.param(PORTABLE, id="ops"),
            pytest.param(Backend("CPU", cpu_kernels=True), id="kernels",
                         marks=pytest.mark.skipif(cpu_kernels.library() is None, reason="no CPU kernels"))]
# float32: the chunked loss sums per chunk, then over chunks, and accumulates the head-weight gradient chunk by
# chunk; the whole path sums once. Measured differences are 1e-7..5e-7 of each tensor's largest entry.
FP32_TOL = 1e-6
VOCAB, HIDDEN, TOKENS = 53, 16, 24


def worst(a, b):
    """max |a - b| / max |b|: differences relative to the tensor's scale (entries near 0 differ by rounding)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


class Tiny(nn.Cell):
    """ids → tanh(E[ids] @ L) → head (E when tied, else H) → loss over the (TOKENS,) targets: the model's
    gradient reaches the head weight both through the loss and, when tied, through the lookup."""

    def __init__(self, chunk, backend=PORTABLE, tied=True, weighted=False, dtype=ms.float32, sharpness=1.0):
        super().__init__()
        self.sharpness = sharpness  # multiplies the hidden states: a larger one peaks the softmax
        rng = np.random.default_rng(0)
        self.emb = Parameter(ms.Tensor(rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32)), name="emb")
        self.lin = Parameter(ms.Tensor(rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32) * 0.3), name="lin")
        self.head = None if tied else Parameter(ms.Tensor(rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32)),
                                                name="head")
        self.tied, self.weighted, self.dtype = tied, weighted, dtype
        self.chunked = chunk > 0
        self.loss = ChunkedCrossEntropy(chunk, dtype, backend) if self.chunked else None

    def construct(self, ids, targets, weights, scale):
        x = (ops.tanh(ops.matmul(ops.gather(self.emb, ids, 0), self.lin)) * self.sharpness).astype(self.dtype)
        w = self.emb if self.tied else self.head
        if self.chunked:
            scaled, loss, _, _ = self.loss(x, w, targets, weights, mean_denominator(weights), scale)
            return scaled, loss
        logits = ops.matmul(x, w.astype(self.dtype).T).astype(ms.float32)
        if self.weighted:  # the masked mean written with the whole logits
            ce = ops.cross_entropy(logits, targets, reduction="none")
            loss = (ce * weights).sum() / weights.sum()
        else:
            loss = ops.cross_entropy(logits, targets)
        return loss * scale, loss


def pynative():
    """Op by op: the same cells, kernels and custom bprop as the compiled step, without compiling a graph per
    variant (~10x faster here; the compiled path is checked by the slow tests below)."""
    return op_by_op()


def run(chunk, backend=PORTABLE, weights=None, scale=8.0, **model_args):
    """(loss, gradients) of Tiny(chunk, backend, **model_args) on a fixed batch."""
    rng = np.random.default_rng(1)
    ids = ms.Tensor(rng.integers(0, VOCAB, TOKENS).astype(np.int32))
    targets = ms.Tensor(rng.integers(0, VOCAB, TOKENS).astype(np.int32))
    weights = ms.Tensor(np.ones(TOKENS, np.float32) if weights is None else weights)
    with pynative():
        model = Tiny(chunk, backend, **model_args)
        fn = ms.value_and_grad(model, None, model.trainable_params(), has_aux=True)
        (_, loss), grads = fn(ids, targets, weights, ms.Tensor(scale, ms.float32))
        return float(loss.asnumpy()), [g.asnumpy() for g in grads]


def test_chunks_cover_the_tokens_once():
    assert chunk_bounds(24, 5) == [(0, 5), (5, 10), (10, 15), (15, 20), (20, 24)]
    assert chunk_bounds(24, 24) == chunk_bounds(24, 100) == [(0, 24)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_chunked_loss_and_gradients_equal_the_whole_logits(backend, tied):
    whole_loss, whole = run(0, tied=tied)
    loss, grads = run(5, backend, tied=tied)  # 24 tokens: chunks of 5, 5, 5, 5 and 4
    assert loss == pytest.approx(whole_loss, rel=FP32_TOL)
    assert len(grads) == len(whole) == (2 if tied else 3)
    for g, ref in zip(grads, whole):
        assert worst(g, ref) < FP32_TOL


@pytest.mark.parametrize("backend", BACKENDS)
def test_token_weights_give_the_weighted_mean_and_its_gradients(backend):
    """Σ w·ce / Σ w: a 0/1 loss mask (fine-tuning) and fractional weights; all-zero weights give 0 and no gradient."""
    rng = np.random.default_rng(3)
    for weights in (rng.integers(0, 2, TOKENS).astype(np.float32), rng.uniform(0, 2, TOKENS).astype(np.float32)):
        whole_loss, whole = run(0, weights=weights, weighted=True)
        loss, grads = run(7, backend, weights=weights, weighted=True)
        assert loss == pytest.approx(whole_loss, rel=FP32_TOL)
        for g, ref in zip(grads, whole):
            assert worst(g, ref) < FP32_TOL
    loss, grads = run(7, backend, weights=np.zeros(TOKENS, np.float32), weighted=True)
    assert loss == 0.0 and all(not np.any(g) for g in grads)


def test_float16_gradients_are_scaled_before_they_are_cast():
    """With float16 compute, the per-token gradients are cast to float16 for the head's backward matmuls. They must
    carry the loss scale by then, as in the whole path's backward: unscaled, the small probabilities of a peaked
    softmax underflow to 0 in float16 and the head weight loses their gradient."""
    results = [run(chunk, scale=4096.0, dtype=ms.float16, sharpness=6.0) for chunk in (0, 5)]
    (whole_loss, whole), (loss, grads) = results
    assert loss == pytest.approx(whole_loss, rel=1e-5)
    for g, ref in zip(grads, whole):
        assert worst(g, ref) < 2e-3  # float16 rounding of each chunk's head-weight gradient (eps 1e-3)
    head, ref = grads[0], whole[0]
    assert np.count_nonzero(head) >= 0.98 * np.count_nonzero(ref) > 0.5 * ref.size


def test_evaluation_loss_equals_the_whole_logits():
    rng = np.random.default_rng(5)
    x = ms.Tensor(rng.standard_normal((TOKENS, HIDDEN)).astype(np.float32))
    w = ms.Tensor(rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32))
    t = ms.Tensor(rng.integers(0, VOCAB, TOKENS).astype(np.int32))
    ones = ms.Tensor(np.ones(TOKENS, np.float32))
    whole = float(ops.cross_entropy(ops.matmul(x, w.T), t).asnumpy())
    for backend in (PORTABLE, Backend("CPU", cpu_kernels=cpu_kernels.library() is not None)):
        with pynative():
            loss = float(ChunkedCrossEntropyLoss(5, ms.float32, backend)(x, w, t, ones).asnumpy())
        assert loss == pytest.approx(whole, rel=FP32_TOL)


def test_loss_fn_of_a_model_with_accumulation_equals_the_whole_logits():
    """Through the run's loss cells on a real (tiny GPT) model, as the step calls them (grad_scale = loss scale /
    accumulation): the scaled loss and its gradients, chunked and whole (op by op: the training tests below run
    both through the compiled step)."""
    from model_zoo import build_model
    from ms_llm.train.losses import ChunkedLoss, TokenLoss

    cfg = load_config(None, ["model.preset=tiny-gpt2", "model.num_layers=1", "model.vocab_size=61",
                             "model.seq_length=8"])
    ids = ms.Tensor(np.random.default_rng(0).integers(0, 61, (3, 9)).astype(np.int32))
    results = []
    for chunk in (0, 5):
        ms.set_seed(0)
        with pynative():
            model = build_model(cfg.model, "float32")
            loss_cell = ChunkedLoss(model, chunk) if chunk else TokenLoss(model)
            fn = ms.value_and_grad(loss_cell, None, model.trainable_params(), has_aux=True)
            (scaled, loss), grads = fn(ms.Tensor(1024.0 / 3, ms.float32), ids)
            results.append((float(scaled.asnumpy()), float(loss.asnumpy()), [g.asnumpy() for g in grads]))
    (s0, l0, g0), (s1, l1, g1) = results
    assert s1 == pytest.approx(s0, rel=FP32_TOL) and s0 == pytest.approx(l0 * 1024 / 3, rel=1e-6)
    assert l1 == pytest.approx(l0, rel=FP32_TOL)
    assert len(g0) == len(g1) and all(worst(a, b) < FP32_TOL for a, b in zip(g1, g0))


def test_a_negative_chunk_is_refused_with_the_field_and_the_fix():
    with pytest.raises(UserError, match=r"train.loss_chunk_tokens = -1 .* 0 for the whole logits"):
        load_config(None, ["train.loss_chunk_tokens=-1"])


# -- training: the chunked loss changes nothing a run reports (slow: each trains) -------------------------

CHUNKED = ["--set", "train.loss_chunk_tokens=100"]  # 256 tokens per micro-batch of 8: chunks of 100, 100, 56
WHOLE = ["--set", "train.loss_chunk_tokens=0"]
VARIANTS = {"accumulation": ["--set", "train.micro_batch_size=4"],  # 2 micro-batches per step
            "float16": ["--set", "precision.compute_dtype=float16"]}


def metrics(run_dir):
    import json
    import os

    records = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    return ({r["step"]: r["loss"] for r in records if "loss" in r},
            {r["step"]: r["val_loss"] for r in records if "val_loss" in r})


@pytest.fixture(scope="module")
def trained(dataset, tmp_path_factory):
    """Each variant trained 30 steps with the chunked and with the whole-logits loss, a checkpoint every 10 steps,
    once per session (conftest.build_once: under xdist, the worker that asks first trains them). Processes, as a user
    runs them: they and the resume below load their compiled steps from the session's compile cache (trained in the
    test's own process they measured dearer on CI, where a graph is compiled again in each run)."""
    import pathlib

    from conftest import build_once, ms_llm, tiny_train_args

    def build(folder):
        runs = {}
        for name, extra in VARIANTS.items():
            for loss, flags in (("chunked", CHUNKED), ("whole", WHOLE)):
                run = folder / f"{name}_{loss}"
                proc = ms_llm(*tiny_train_args(dataset, run, *extra, *flags, "--set", "checkpoint.save_interval=10"))
                assert proc.returncode == 0, proc.stderr[-3000:]
                runs[f"{name}/{loss}"] = str(run)
        return runs

    return {tuple(key.split("/")): pathlib.Path(run)
            for key, run in build_once(tmp_path_factory, "chunked_loss_runs", build).items()}


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
def test_training_with_the_chunked_loss_reports_the_whole_losses(trained, variant):
    """Every logged train loss and every val loss of 30 steps agree to float32 rounding carried through AdamW
    (float16: to its rounding of each chunk's head gradient); a wrong scale, a lost chunk or a lost token would
    move them by 1e-2 or more."""
    (loss_c, val_c), (loss_w, val_w) = metrics(trained[variant, "chunked"]), metrics(trained[variant, "whole"])
    assert sorted(loss_c) == sorted(loss_w) == [10, 20, 30] and sorted(val_c) == sorted(val_w) == [20, 30]
    tol = 1e-4 if variant != "float16" else 2e-3
    for step in loss_w:
        assert abs(loss_c[step] - loss_w[step]) < tol * loss_w[step], (step, loss_c[step], loss_w[step])
    for step in val_w:
        assert abs(val_c[step] - val_w[step]) < tol * val_w[step], (step, val_c[step], val_w[step])


@pytest.mark.slow
def test_a_chunked_run_resumes_bit_for_bit(trained, tmp_path):
    """The accumulation variant's chunked run, cut back to its step-20 checkpoint (a copy) and resumed: steps 21-30
    and the val loss at 30 are the uninterrupted run's, bit for bit."""
    import os
    import shutil

    from conftest import copy_run, ms_llm

    full = trained["accumulation", "chunked"]
    run = copy_run(full, tmp_path / "run")
    ckpts = run / "checkpoints" / "rank_0"
    for f in os.listdir(ckpts):
        if f.startswith("step_") and int(f[5:13]) > 20:
            (shutil.rmtree if (ckpts / f).is_dir() else os.remove)(ckpts / f)
    (ckpts / "latest").write_text("step_00000020")
    resumed = ms_llm("train", "--config", str(run / "config.yaml"), "--run-dir", str(run), "--resume")
    assert resumed.returncode == 0 and "resuming at step 20" in resumed.stdout, resumed.stderr[-3000:]
    assert metrics(run) == metrics(full)


@pytest.mark.slow
@pytest.mark.skipif(__import__("shutil").which("msrun") is None, reason="msrun not installed")
def test_two_data_parallel_ranks_with_the_chunked_loss_match_one_process(dataset, trained, tmp_path):
    """2 msrun ranks × micro-batch 2 × accumulation 2, chunked, against one process with micro-batch 4 × 2, whole:
    each rank's gradients come from the chunked loss's own backward and are all-reduced like any others."""
    from test_distributed import msrun_train

    msrun_train(dataset, tmp_path / "multi", tmp_path / "logs", "--set", "train.micro_batch_size=2",
                "--set", "train.loss_chunk_tokens=50", "--set", "checkpoint.save_interval=10")  # 64 tokens: 50 + 14
    (loss_m, val_m), (loss_w, val_w) = metrics(tmp_path / "multi"), metrics(trained["accumulation", "whole"])
    assert sorted(loss_m) == sorted(loss_w)
    for step in loss_w:
        assert abs(loss_m[step] - loss_w[step]) < 1e-4 * loss_w[step], (step, loss_m[step], loss_w[step])
    for step in val_w:
        assert abs(val_m[step] - val_w[step]) < 1e-4 * val_w[step]
