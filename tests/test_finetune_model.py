"""Fine-tuning in the model and the step, in-process and fast (PyNative: nothing to compile): packed conversations
do not see each other, the masked loss is the token-weighted mean of the whole step, LoRA starts as the base model,
trains its adapters only and merges back exactly."""
import numpy as np
import pytest
import mindspore as ms

from ms_llm.config import load_config
from model_zoo import build_model, count_params

import masked_loss_check as check


@pytest.fixture(scope="module", autouse=True)
def pynative():
    """Eager execution for this module (the other modules' graph mode is put back after it)."""
    mode = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    yield
    ms.set_context(mode=mode)


def tiny(arch, *more):
    m = load_config(None, [f"model.preset=tiny-{arch}", "model.num_layers=1", "model.hidden_size=32",
                           "model.num_heads=2", "model.vocab_size=40", "model.seq_length=24", *more]).model
    ms.set_seed(0)
    model = build_model(m)
    model.set_train(False)
    return model


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_two_packed_conversations_give_the_logits_each_gives_alone(arch):
    """A sample packing conversations A (9 tokens) and B (15) gives, at every position, the logits A and B give
    each alone (starting at position 0, padded to the same length): attention stays inside a conversation and
    positions restart at B's first token (RoPE for llama, the learned table for gpt2). A is bitwise equal; B differs
    only by float32 rounding (its softmax and P·V sums run over other columns of the same shapes). Without the
    segment ids the same sample gives B other logits: the test can tell."""
    model = tiny(arch)
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 40, 9).astype(np.int32), rng.integers(0, 40, 15).astype(np.int32)
    packed = ms.Tensor(np.concatenate([a, b])[None])
    segments = ms.Tensor(np.array([[1] * 9 + [2] * 15], np.int32))

    pad = (lambda x: np.concatenate([x, np.zeros(24 - len(x), np.int32)]))
    alone = model(ms.Tensor(np.stack([pad(a), pad(b)]))).asnumpy()  # each from position 0, one per row
    together = model(packed, segments).asnumpy()[0]
    assert np.array_equal(together[:9], alone[0, :9])
    np.testing.assert_allclose(together[9:], alone[1, :15], rtol=0, atol=2e-6)
    crossing = model(packed).asnumpy()[0]
    assert np.abs(crossing[9:] - alone[1, :15]).max() > 1e-2


def test_padding_segment_and_a_window_keep_the_rule():
    """Padding is segment 0, a document of its own: a conversation followed by padding gives with its segment ids
    the logits it gives without (plain causal attention, which never looks at the padding after it), here on a
    model with Mistral's sliding window, whose mask the document mask is added to."""
    model = tiny("llama", "model.sliding_window=4")
    rng = np.random.default_rng(1)
    a = rng.integers(0, 40, 10).astype(np.int32)
    sample = np.concatenate([a, np.full(14, 3, np.int32)])[None]
    seg = np.array([[1] * 10 + [0] * 14], np.int32)
    with_docs = model(ms.Tensor(sample), ms.Tensor(seg)).asnumpy()[0, :10]
    np.testing.assert_allclose(with_docs, model(ms.Tensor(sample)).asnumpy()[0, :10], rtol=0, atol=2e-6)


def test_masked_loss_is_the_token_mean_of_the_whole_step():
    """One rank, accumulation 3 with 90%, 0% and 20% of the tokens kept: the step's loss and gradient norm are those
    of the masked mean over all its tokens (numpy), not the mean of the micro-batches' means. (Two ranks under
    msrun: tests/test_finetune_train.py.)"""
    batches = check.micro_batches(3)
    loss, norm = check.step(check.table(), batches, accum=3, dp=1)
    want_loss, want_norm = check.reference(check.table(), batches)
    assert abs(loss - want_loss) < 2e-6 * want_loss and abs(norm - want_norm) < 2e-5 * want_norm
    assert abs(loss - check.mean_of_micro_means(check.table(), batches)) > 0.1


def test_prompt_tokens_do_not_count():
    """With the logits held fixed, changing the target of every token the mask leaves out changes nothing, and the
    loss has no gradient at those positions; the kept positions do have one."""
    from mindspore import nn

    from ms_llm.train.losses import MaskedLoss

    class Fixed(nn.Cell):
        def __init__(self, logits):
            super().__init__()
            self.logits = ms.Parameter(ms.Tensor(logits), name="logits")

        def construct(self, ids, segments=None):
            return self.logits

    rng = np.random.default_rng(3)
    model = Fixed(rng.normal(0, 1, (check.B, check.T, check.V)).astype(np.float32))
    ids, w = check.micro_batches(1, seed=3)[0]
    changed = ids.copy()
    changed[:, 1:] = np.where(w > 0, ids[:, 1:], (ids[:, 1:] + 5) % check.V)
    assert (changed != ids).any()
    fn = MaskedLoss(model, with_documents=False)
    seg, count, one = ms.Tensor(np.ones(ids.shape, np.int32)), ms.Tensor(np.float32(w.sum())), ms.Tensor(1.0)
    prompt = ms.Tensor(np.zeros_like(w))
    grad = ms.value_and_grad(fn, None, model.trainable_params(), has_aux=True)
    (_, loss), (g,) = grad(one, count, ms.Tensor(ids), ms.Tensor(w), seg, prompt)
    (_, loss2), (g2,) = grad(one, count, ms.Tensor(changed), ms.Tensor(w), seg, prompt)
    assert float(loss.asnumpy()) == float(loss2.asnumpy())
    g, g2 = g.asnumpy(), g2.asnumpy()
    assert np.array_equal(g, g2) and (g[w == 0] == 0).all() and (np.abs(g[w > 0]).sum(-1) > 0).all()


def test_target_weights_drop_padding_and_conversation_starts():
    from ms_llm.train.losses.masked import prompt_weights, target_weights

    mask = np.array([[0, 0, 1, 1, 0, 1, 1, 0]])
    seg = np.array([[1, 1, 1, 1, 2, 2, 2, 0]])
    assert target_weights(mask, seg).tolist() == [[0, 1, 1, 0, 1, 1, 0]]
    assert target_weights(mask, seg, use_mask=False).tolist() == [[1, 1, 1, 0, 1, 1, 0]]
    assert prompt_weights(mask, seg).tolist() == [[1, 0, 0, 0, 0, 0, 0]]


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_lora_starts_as_the_base_and_trains_only_its_adapters(arch):
    """Adapters on every projection: the model's logits are unchanged (B = 0), only the adapters train, their count
    is the one `ms-llm plan` computes, and each adapted projection computes x Wᵀ + (alpha/r) x Aᵀ Bᵀ."""
    from ms_llm.nn.lora import apply_lora
    from ms_llm.parallel.lora_memory import layer_lora_params
    from ms_llm.parallel.shapes import ModelShape

    model = tiny(arch)
    ids = ms.Tensor(np.random.default_rng(2).integers(0, 40, (1, 24)).astype(np.int32))
    before = model(ids).asnumpy()
    base_params = count_params(model)
    targets = ["qkv", "out", "gate_up", "down", "up"]
    adapted = apply_lora(model, 4, 8.0, targets=targets)
    assert len(adapted) == 4
    np.testing.assert_array_equal(model(ids).asnumpy(), before)
    trainable = model.trainable_params()
    assert trainable and all(p.name.endswith((".lora_a", ".lora_b")) for p in trainable)
    m = load_config(None, [f"model.preset=tiny-{arch}", "model.num_layers=1", "model.hidden_size=32",
                           "model.num_heads=2", "model.vocab_size=40", "model.seq_length=24"]).model
    n = sum(int(np.prod(p.shape)) for p in trainable)
    assert n == layer_lora_params(ModelShape.from_config(m), 4, targets)
    assert count_params(model) == base_params + n
    layer = model.layers[0].attention.out
    rng = np.random.default_rng(3)
    layer.lora_b.set_data(ms.Tensor(rng.normal(0, 0.5, layer.lora_b.shape).astype(np.float32)))
    x = rng.normal(0, 1, (3, layer.in_features)).astype(np.float32)
    w, a, b = layer.weight.asnumpy(), layer.lora_a.asnumpy(), layer.lora_b.asnumpy()
    np.testing.assert_allclose(layer(ms.Tensor(x)).asnumpy(), x @ w.T + 2.0 * (x @ a.T) @ b.T, rtol=1e-5, atol=1e-5)


def test_merged_weights_give_the_adapted_logits():
    """W + (alpha/r) B A in place of the adapters: the plain model's logits equal the adapted model's (1e-5)."""
    from ms_llm.nn.lora import apply_lora, merge_lora

    model, plain = tiny("llama"), tiny("llama")
    rng = np.random.default_rng(4)
    ids = ms.Tensor(rng.integers(0, 40, (1, 24)).astype(np.int32))
    base = plain(ids).asnumpy()
    apply_lora(model, 4, 16.0)
    for p in model.trainable_params():
        if p.name.endswith("lora_b"):
            p.set_data(ms.Tensor(rng.normal(0, 0.3, p.shape).astype(np.float32)))
    adapted = model(ids).asnumpy()
    merged = merge_lora({p.name: p.asnumpy() for p in model.get_parameters()}, 16.0 / 4)
    for p in plain.get_parameters():
        p.set_data(ms.Tensor(merged[p.name]))
    out = plain(ids).asnumpy()
    assert np.abs(out - adapted).max() < 1e-5
    assert np.abs(adapted - base).max() > 1e-2  # the adapters did change the model
