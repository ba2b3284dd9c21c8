"""One loss of parts (ms_llm/train/losses): the objective (whole or chunked token loss, with the loss mask or
without; the preference pairs') and any terms (the router's) chosen compositionally; the chunked parts equal the
whole ones with a mask and with the router term; the losses know nothing of parallelism; a new objective is one new
module and one line where objectives are chosen, which the step trains and validation evaluates."""
import os
import sys

import pytest

from conftest import ROOT, tiny_train_args

TEST_LOSS = '''
"""An objective for this test only: twice the token cross-entropy (whole logits)."""
from ms_llm.train.losses.base import cross_entropy
from ms_llm.train.losses.part import Objective


class DoubledTokens(Objective):
    def train(self, logits, targets, grad_scale, share, columns):
        loss = 2.0 * cross_entropy(logits, targets)
        return loss, loss, ()

    def evaluate(self, logits, targets, columns):
        loss = 2.0 * cross_entropy(logits, targets)
        return loss, loss
'''
CHAT = {"columns": ["input_ids", "loss_mask", "segment_ids"]}  # a chat dataset's manifest (unpacked)
PAIRS = dict(CHAT, format="preference")
SMALL = ["model.num_layers=1", "model.hidden_size=32", "model.num_heads=2", "model.vocab_size=64",
         "model.seq_length=16", "model.ffn_hidden_size=48"]
MOE = ["model.arch=llama", "model.moe={num_experts: 4, top_k: 2, aux_loss_coef: 0.5, z_loss_coef: 0.05}"]


def test_the_loss_is_composed_of_its_parts_whatever_else_the_run_has():
    """(whole | chunked) × (loss mask | none), or the pair objective, plus the router term of a mixture of experts:
    the chunked objective whenever train.loss_chunk_tokens is set, chat data and MoE models included."""
    from model_zoo import build_model
    from ms_llm.config import load_config
    from ms_llm.nn.backend import PORTABLE
    from ms_llm.train import losses

    def parts(overrides, manifest):
        cfg = load_config(None, SMALL + overrides)
        loss = losses.choose(cfg, manifest, build_model(cfg.model), PORTABLE)
        o = loss.objective
        return type(o).__name__, getattr(o, "masked", None), [type(t).__name__ for t in loss.terms], loss.sums_tokens

    whole = ["train.loss_chunk_tokens=0"]
    assert parts([], {}) == ("ChunkedTokens", False, [], False)
    assert parts(whole, {}) == ("WholeTokens", False, [], False)
    assert parts([], CHAT) == ("ChunkedTokens", True, [], True)
    assert parts(whole, CHAT) == ("WholeTokens", True, [], True)
    assert parts(MOE, {}) == ("ChunkedTokens", False, ["RouterTerm"], False)
    assert parts(MOE, CHAT) == ("ChunkedTokens", True, ["RouterTerm"], True)
    assert parts(MOE + whole, CHAT) == ("WholeTokens", True, ["RouterTerm"], True)
    assert parts([], PAIRS) == ("PairObjective", None, [], False)
    assert parts(MOE, PAIRS) == ("PairObjective", None, ["RouterTerm"], False)


def test_semi_auto_parallel_resolves_the_chunked_loss_away_with_a_note():
    """The layout's decision, made where the config is resolved: the strategies shard the LM head's matmul, which
    the chunked loss computes itself, so the config as run takes the whole logits and says why."""
    from ms_llm.config import load_config
    from ms_llm.train.setup.resolve import resolve

    sharded = load_config(None, ["model.preset=tiny-gpt2", "parallel_config.model_parallel=2",
                                 "train.global_batch_size=8", "train.micro_batch_size=8"])
    r = resolve(sharded, 2, "Ascend")
    assert r.parallel.semi_auto and r.cfg.train.loss_chunk_tokens == 0 and sharded.train.loss_chunk_tokens == 1024
    assert len(r.notes) == 1 and "train.loss_chunk_tokens = 1024 is not used under semi-auto parallel" in r.notes[0]
    plain = resolve(load_config(None, ["model.preset=tiny-gpt2"]), 1, "CPU")
    assert plain.cfg.train.loss_chunk_tokens == 1024 and plain.notes == ()


def test_the_losses_know_nothing_of_parallelism():
    """No loss module reduces over ranks or reads a layout: the step gives a loss summed over tokens its share
    (ms_llm/train/step.py), evaluation adds the ranks' sums (train/loop/evaluate.py), the resolved config says
    whether the loss is chunked, and the pipelined step has its own loss."""
    import ast
    import inspect

    from ms_llm.train import losses

    folder = os.path.join(ROOT, "ms_llm", "train", "losses")
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | \
            {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} | \
            {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments) for a in n.args}
        modules = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not names & {"AllReduce", "world_size", "dp", "semi_auto", "pp", "parallel", "accum"}, name
        assert not any(m.startswith(("ms_llm.parallel", "mindspore.communication")) for m in modules), name
    assert list(inspect.signature(losses.choose).parameters) == ["cfg", "manifest", "model", "backend"]


@pytest.mark.slow
def test_a_new_objective_is_one_file_and_one_line(dataset, tmp_path, monkeypatch):
    """The test's own objective module, returned where objectives are chosen (the one line): the session trains it
    and evaluates it, with nothing else changed; its first loss and its validation loss are exactly twice the plain
    whole-logits loss's on the same weights and batches."""
    from ms_llm.config import load_config
    from ms_llm.train import losses
    from ms_llm.train.loop.evaluate import evaluate
    from ms_llm.train.session import open_session
    from ms_llm.train.step_runner import StepRunner

    (tmp_path / "doubled_loss.py").write_text(TEST_LOSS)
    monkeypatch.syspath_prepend(str(tmp_path))
    import doubled_loss

    args = tiny_train_args(dataset, "unused", "--set", "train.loss_chunk_tokens=0", "--set", "context.compile_cache=false")
    cfg = load_config(os.path.join(ROOT, "configs", "shakespeare_char.yaml"),
                      [args[i + 1] for i, a in enumerate(args) if a == "--set"])

    def first_step_and_val():
        s = open_session(cfg, echo=lambda *a: None)
        val = evaluate(s.loss, s.val[:2], s.rt)["val_loss"]  # the weights as initialised
        out = StepRunner(s, use_compile_cache=False).step()
        return type(s.loss.objective).__name__, float(out.loss.asnumpy()), val

    plain = first_step_and_val()
    monkeypatch.setattr(losses, "objective", lambda *run: doubled_loss.DoubledTokens())  # the one line
    doubled = first_step_and_val()
    assert plain[0] == "WholeTokens" and doubled[0] == "DoubledTokens"
    assert doubled[1] == pytest.approx(2 * plain[1], rel=1e-6) and doubled[2] == pytest.approx(2 * plain[2], rel=1e-6)
    sys.modules.pop("doubled_loss", None)


# --- the chunked parts equal the whole ones: with the loss mask, with the router term -------------------------------
# Op by op (the conftest's `pynative`): the same cells, kernels and custom backward as the compiled step, without a
# graph compile per model; the loss's value and gradients are the point here, and tests/test_loss.py trains the
# chunked loss through the compiled step (chunked and whole runs log the same losses).

FP32_TOL = 1e-6  # the chunked sums are ordered differently (tests/test_loss.py): float32 rounding, relative


def worst(a, b):
    """max |a - b| / max |b| (tests/test_loss.py)."""
    import numpy as np

    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def chat_micro_batches(seed=0, n=2, b=2, t=16):
    """n chat micro-batches whose loss masks keep very different shares of the tokens (about 80% and 20%), two
    packed conversations per row, padding at the end of one row."""
    import mindspore as ms
    import numpy as np

    from ms_llm.data.loader import Batch

    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        ids = rng.integers(0, 64, (b, t + 1)).astype(np.int32)
        mask = (rng.random((b, t + 1)) < [0.8, 0.2][k % 2]).astype(np.int32)
        seg = np.ones((b, t + 1), np.int32)
        seg[:, 9:] = 2
        seg[1, 14:] = 0
        out.append(Batch(ms.Tensor(ids), ms.Tensor(mask), ms.Tensor(seg)))
    return out


def chat_micro_batches_weights(batches):
    from ms_llm.train.losses.masked import target_weights

    return [target_weights(b.loss_mask.asnumpy(), b.segments.asnumpy()) for b in batches]


def whole_and_chunked(overrides, manifest, batches, backend):
    """For chunk 0 and 5 (16 tokens per row: chunks of 5, 5, 5, 5, 5, 5, 2): (scaled, logged, aux, gradients) of the
    run's loss on the first micro-batch, differentiated as the step does (grad_scale = 1024 / 2), and its
    evaluation outputs. The micro-batch's count is the step's (both micro-batches), so the loss divides by the step's
    share of the masked-in tokens, not by its own."""
    import mindspore as ms

    from model_zoo import build_model
    from ms_llm.config import load_config
    from ms_llm.train import losses

    results = []
    for chunk in (0, 5):
        cfg = load_config(None, SMALL + overrides + [f"train.loss_chunk_tokens={chunk}"])
        ms.set_seed(0)
        model = build_model(cfg.model, "float32", backend)
        loss = losses.choose(cfg, manifest, model, backend)
        inputs = loss.inputs(batches)[0]
        fn = ms.value_and_grad(loss, None, model.trainable_params(), has_aux=True)
        out, grads = fn(ms.Tensor(1024.0 / 2, ms.float32), *inputs)
        loss.set_train(False)
        evaluated = loss(ms.Tensor(1.0, ms.float32), *loss.inputs(batches, count=False)[0])
        loss.set_train(True)
        results.append(([o.asnumpy() for o in out], [g.asnumpy() for g in grads],
                        [e.asnumpy() for e in evaluated], loss.eval_sums([evaluated])))
    return results


def assert_equal_within_rounding(whole, chunked):
    (out0, grads0, eval0, sums0), (out1, grads1, eval1, sums1) = whole, chunked
    assert len(out0) == len(out1) and all(worst(a, b) < FP32_TOL for a, b in zip(out1, out0))
    assert len(grads0) == len(grads1) and all(worst(a, b) < FP32_TOL for a, b in zip(grads1, grads0))
    assert worst(sums1, sums0) < FP32_TOL


@pytest.mark.slow  # builds the tiny model and differentiates its loss twice per backend (op by op: see below)
@pytest.mark.parametrize("kernels", [False, True], ids=["ops", "kernels"])
def test_the_chunked_masked_loss_equals_the_whole_masked_loss(kernels, pynative):
    """Chat data at chunk 5 and chunk 0: the differentiated and the logged loss (Σ w·ce ÷ the step's share), every
    gradient and the evaluation sums (Σ w·ce, Σ w, the same over the prompts) agree to float32 rounding."""
    from ms_llm.nn import cpu_kernels
    from ms_llm.nn.backend import PORTABLE, Backend

    if kernels and cpu_kernels.library() is None:
        pytest.skip("no CPU kernels")
    backend = Backend("CPU", cpu_kernels=True) if kernels else PORTABLE
    batches = chat_micro_batches()
    whole, chunked = whole_and_chunked([], CHAT, batches, backend)
    assert_equal_within_rounding(whole, chunked)
    (_, logged), _, (_, _, wce, w, _, prompts), _ = whole
    step_count = sum(float(b.sum()) for b in chat_micro_batches_weights(batches))
    assert 0 < w < step_count and prompts > 0  # the step's share is not the micro-batch's own count
    assert float(logged) == pytest.approx(float(wce) / step_count, rel=1e-6)


@pytest.mark.slow  # differentiates an MoE model's loss twice (op by op: see below)
@pytest.mark.parametrize("manifest", [{}, CHAT], ids=["text", "chat"])
def test_the_chunked_loss_with_the_router_term_equals_the_whole_one(manifest, pynative):
    """A mixture of experts at chunk 5 and chunk 0, on plain text and on chat data: (objective + router term) ·
    grad_scale, the logged objective, the router statistics, every gradient (the router's included) and the
    evaluation agree to float32 rounding; the router term is in what is differentiated."""
    from ms_llm.nn.backend import PORTABLE

    batches = chat_micro_batches(seed=1)
    if not manifest:
        batches = [b.ids for b in batches]
    whole, chunked = whole_and_chunked(MOE, manifest, batches, PORTABLE)
    assert_equal_within_rounding(whole, chunked)
    (scaled, logged, stats), _, _, _ = chunked
    assert stats.shape == (1, 4 + 5)
    assert float(scaled) > float(logged) * 512 * (1 + 1e-3)  # + the router term, × grad_scale
