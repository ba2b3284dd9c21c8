"""Generation with the KV cache (ms_llm/nn/kv_cache.py, ms_llm/generate/) against the full-window generation it
replaced: every new token predicted from a forward of the whole (right-padded) window, the last `seq_length` tokens
once the sequence is longer. Greedy tokens must be identical, within the context (the cache) and past it (the
window slides), for rows of different lengths in one batch. Against transformers' generate: test_eval_parity.py."""
import numpy as np
import pytest

from conftest import op_by_op
from ms_llm.config import load_config

SEQ = 24


def random_model(*sets):
    """A tiny model whose weights are redrawn large enough that its logits are spread (no near-ties for argmax)."""
    import mindspore as ms

    from model_zoo import build_model
    from ms_llm.nn.backend import for_device

    cfg = load_config(None, ["model.vocab_size=50", "model.num_layers=2", "model.hidden_size=32", "model.num_heads=4",
                             f"model.seq_length={SEQ}", *sets])
    model = build_model(cfg.model, "float32", for_device(ms.get_context("device_target"), True))
    rng = np.random.default_rng(0)
    for p in model.get_parameters():
        if "norm" not in p.name:
            p.set_data(ms.Tensor(rng.normal(0, 0.3, p.shape).astype(np.float32)))
    model.set_train(False)
    return model


def full_window(model, ids, n):
    """The generation this replaced: a forward of the (1, SEQ) window per token, the logits of its last real token."""
    import mindspore as ms

    ids, window = list(ids), np.zeros((1, SEQ), np.int32)
    for _ in range(n):
        ctx = ids[-SEQ:]
        window[:] = 0
        window[0, :len(ctx)] = ctx
        ids.append(int(np.argmax(model(ms.Tensor(window)).asnumpy()[0, len(ctx) - 1])))
    return ids[-n:]


def greedy(model, prompts, n, batch_size, fused=True, generator=None):
    """Greedy tokens both ways: the argmax in the decode graph (the default) and on the host from the logits (the
    path sampling takes); they must agree. `fused`: decoding with the fused CPU kernel (where the model has the CPU
    kernels), else with the composition every other backend runs. `generator`: one built earlier for this model,
    batch size and `fused` (its graphs are compiled already)."""
    from ms_llm.generate import Generator, next_token

    generator = generator or Generator(model, SEQ, batch_size, fused_decode=fused)
    assert generator.step.fused == (fused and model.layers[0].attention.fused_heads)
    in_graph = generator.generate(prompts, n)
    on_host = generator.generate(prompts, n, lambda _, logits: next_token(logits))
    assert in_graph == on_host
    return in_graph


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "composed"])
def test_kv_cache_greedy_tokens_are_the_full_window_ones_op_by_op(fused):
    """The cache's arithmetic, op by op (no compile): a GPT-2 (learned positions) within its context, decoding with
    the fused kernel and with the composition."""
    with op_by_op():
        model = random_model()
        assert model.layers[0].attention.fused_heads  # the CPU kernels, so that `fused` picks the path
        assert greedy(model, [[3, 1, 4]], 4, 1, fused)[0] == full_window(model, [3, 1, 4], 4)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_kv_cache_greedy_tokens_are_the_full_window_ones(family):
    """Graph mode, as `ms-llm sample` and lm-eval's generate_until run it: a batch of 4 rows (one of them padding)
    of prompts of 3, 10 and 20 tokens, 40 new tokens each: decode steps against the cache until the longest row
    passes the context of 24, then the window slides; and a prompt longer than the context alone. Llama with
    grouped-query attention, q/k norms, q/k/v biases and a sliding window of 6."""
    llama = ["model.arch=llama", "model.num_kv_heads=2", "model.qk_norm=true", "model.qkv_bias=true",
             "model.sliding_window=6"]
    import mindspore as ms

    from ms_llm.generate import Generator

    mode = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)  # not the mode a test before this one left behind (PyNative: ~4x the time)
    try:
        model = random_model(*(llama if family == "llama" else []))
        generator = Generator(model, SEQ, 4)  # compiled once, for both batches
        rng = np.random.default_rng(1)
        prompts = [rng.integers(0, 50, n).tolist() for n in (3, 10, 20)]
        for prompt, tokens in zip(prompts, greedy(model, prompts, 40, 4, generator=generator)):
            assert tokens == full_window(model, prompt, 40), f"prompt of {len(prompt)} tokens"
        long = rng.integers(0, 50, 30).tolist()
        assert greedy(model, [long], 10, 4, generator=generator)[0] == full_window(model, long, 10), \
            "a prompt longer than the context"
    finally:
        ms.set_context(mode=mode)


def attention_reference(q, keys, values, pos, window, scale):
    """float64 softmax((q·scale) kᵀ) v of one query per head over positions 0..pos[b] (the last `window` of them);
    q (B, H, D), keys and values (B, KV, S, D), query head h reading key/value head h // (H / KV)."""
    b, h, d = q.shape
    groups = h // keys.shape[1]
    out = np.zeros((b, h, d))
    for bi in range(b):
        lo = max(0, pos[bi] - window + 1) if window else 0
        for hi in range(h):
            k, v = keys[bi, hi // groups, lo:pos[bi] + 1], values[bi, hi // groups, lo:pos[bi] + 1]
            s = k.astype(np.float64) @ (q[bi, hi].astype(np.float64) * scale)
            p = np.exp(s - s.max())
            out[bi, hi] = (p / p.sum()) @ v
    return out


@pytest.mark.parametrize("window", [0, 3])
def test_the_decode_kernel_writes_the_cache_in_place_and_attends_over_the_tokens_so_far(window):
    """DecodeAttention against float64: 3 rows at different positions (0, a middle one, the last slot), 8 query
    heads on 2 key/value heads; the new key and value land at each row's position and nowhere else."""
    import mindspore as ms
    from mindspore import Parameter, nn

    from ms_llm.nn import cpu_kernels

    if cpu_kernels.library() is None:
        pytest.skip(f"no kernels: {cpu_kernels.build_error()}")
    b, h, kv, s, d = 3, 8, 2, 16, 8
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for shape in ((b, h, 1, d), (b, kv, 1, d), (b, kv, 1, d)))
    keys, values = (rng.standard_normal((b, kv, s, d)).astype(np.float32) for _ in range(2))
    pos = np.array([0, 9, s - 1], np.int32)

    class Step(nn.Cell):
        def __init__(self):
            super().__init__()
            self.attend = cpu_kernels.op("decode_attention")
            self.keys, self.values = Parameter(ms.Tensor(keys), "k"), Parameter(ms.Tensor(values), "v")

        def construct(self, q, k, v, pos, window, scale):
            return self.attend(q, k, v, self.keys, self.values, pos, window, scale)

    step = Step()
    y = step(*map(ms.Tensor, (q, k, v, pos)), ms.Tensor([window], ms.int32), ms.Tensor([0.5], ms.float32)).asnumpy()
    want_keys, want_values = keys.copy(), values.copy()
    want_keys[np.arange(b), :, pos], want_values[np.arange(b), :, pos] = k[:, :, 0], v[:, :, 0]
    np.testing.assert_array_equal(step.keys.asnumpy(), want_keys)
    np.testing.assert_array_equal(step.values.asnumpy(), want_values)
    np.testing.assert_allclose(y[:, :, 0], attention_reference(q[:, :, 0], want_keys, want_values, pos, window, 0.5),
                               rtol=1e-5, atol=1e-6)


def test_the_decode_rotation_and_rms_norm_kernels_are_the_model_s_own():
    """DecodeRope against the model's RotaryEmbedding at each row's position (a Llama 3 scaled table, 3 rows at
    positions 0, 5 and the last), and RmsNormFwd against RMSNorm, both op by op."""
    import mindspore as ms

    from ms_llm.nn import cpu_kernels
    from ms_llm.nn.layers import RMSNorm
    from ms_llm.nn.rope import RotaryEmbedding

    if cpu_kernels.library() is None:
        pytest.skip(f"no kernels: {cpu_kernels.build_error()}")
    from ms_llm.config.schema import RopeScalingConfig

    rng = np.random.default_rng(6)
    with op_by_op():
        rope = RotaryEmbedding(16, 12, 500000.0, RopeScalingConfig(type="llama3", factor=8.0, low_freq_factor=1.0,
                                                               high_freq_factor=4.0, original_max_position_embeddings=8))
        q, k = rng.standard_normal((3, 4, 1, 16)).astype(np.float32), rng.standard_normal((3, 2, 1, 16)).astype(np.float32)
        pos = np.array([0, 5, 11], np.int32)
        got = cpu_kernels.op("decode_rope")(ms.Tensor(q), ms.Tensor(k), rope.cos, rope.sin, ms.Tensor(pos))
        positions = ms.Tensor(pos.reshape(3, 1))
        for x, y in zip((q, k), got):
            np.testing.assert_allclose(y.asnumpy(), rope(ms.Tensor(x), positions).asnumpy(), rtol=1e-6, atol=1e-6)
        norm = RMSNorm(24, 0.5)  # an epsilon that shows beside mean(x²) ~ 9
        norm.weight.set_data(ms.Tensor(rng.uniform(0.5, 1.5, 24).astype(np.float32)))
        x = (rng.standard_normal((5, 24)) * 3).astype(np.float32)
        y = cpu_kernels.op("rms_norm")(ms.Tensor(x), norm.weight, ms.Tensor([0.5], ms.float32))
        np.testing.assert_allclose(y.asnumpy(), norm(ms.Tensor(x)).asnumpy(), rtol=1e-5, atol=1e-6)
