import dataclasses

import numpy as np
import pytest
import mindspore as ms
from mindspore.nn.utils import no_init_parameters

from ms_llm.config import load_config
from model_zoo import build_model, count_params

ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")


def model_cfg(*overrides):
    return load_config(None, list(overrides)).model


def hand_count_gpt2(L, h, V, T, bias=True):
    per_layer = 4 * h * h + 2 * 4 * h * h  # qkv + out, up + down
    if bias:
        per_layer += 3 * h + h + 4 * h + h  # their biases
    per_layer += 2 * (2 * h if bias else h)  # two LayerNorms
    return V * h + T * h + L * per_layer + (2 * h if bias else h)


@pytest.mark.parametrize("preset, expected", [("gpt2-124m", 124_439_808), ("llama2-7b", 6_738_415_616)])
def test_parameter_counts_match_published_sizes(preset, expected):
    """The preset's count, from models of one and two of its layers (every layer is alike: building all 32 of a 7B
    model's layers, even without their values, takes seconds)."""
    m = model_cfg(f"model.preset={preset}")
    with no_init_parameters():  # shapes only: a 7B model does not fit this machine's memory
        one, two = (count_params(build_model(dataclasses.replace(m, num_layers=n))) for n in (1, 2))
    assert one + (m.num_layers - 1) * (two - one) == expected


def test_gpt2_count_matches_hand_formula():
    assert hand_count_gpt2(12, 768, 50257, 1024) == 124_439_808
    m = model_cfg("model.num_layers=3", "model.hidden_size=48", "model.num_heads=3", "model.vocab_size=70",
                  "model.seq_length=16", "model.bias=false")
    assert count_params(build_model(m)) == hand_count_gpt2(3, 48, 70, 16, bias=False)


@pytest.mark.parametrize("preset", ["tiny-gpt2", "tiny-llama"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_forward_shapes_and_fp32_logits(preset, dtype):
    model = build_model(model_cfg(f"model.preset={preset}", "model.vocab_size=100"), dtype)
    ids = ms.Tensor(np.random.default_rng(0).integers(0, 100, (2, 32)).astype(np.int32))
    logits = model(ids)
    assert logits.shape == (2, 32, 100) and logits.dtype == ms.float32
    assert np.isfinite(logits.asnumpy()).all()
    assert all(p.dtype == ms.float32 for p in model.trainable_params())  # master weights stay fp32


def test_causality_future_tokens_do_not_change_past_logits():
    model = build_model(model_cfg("model.preset=tiny-llama", "model.vocab_size=50"))
    a = np.random.default_rng(1).integers(0, 50, (1, 32)).astype(np.int32)
    b = a.copy()
    b[0, 20:] = (b[0, 20:] + 7) % 50
    la, lb = model(ms.Tensor(a)).asnumpy(), model(ms.Tensor(b)).asnumpy()
    np.testing.assert_allclose(la[0, :20], lb[0, :20], atol=1e-5)
    assert np.abs(la[0, 20:] - lb[0, 20:]).max() > 1e-3


def test_gqa_and_untied_head_shapes():
    m = model_cfg("model.preset=tiny-llama", "model.vocab_size=50")
    model = build_model(m)
    shapes = {n: p.shape for n, p in model.parameters_and_names()}
    head_dim = m.hidden_size // m.num_heads
    assert shapes["layers.0.attention.qkv.weight"] == ((m.num_heads + 2 * m.num_kv_heads) * head_dim, m.hidden_size)
    assert shapes["lm_head"] == (50, m.hidden_size)
    assert shapes["layers.0.mlp.gate_up.weight"] == (2 * m.ffn_hidden_size, m.hidden_size)


def test_init_follows_gpt2_recipe():
    ms.set_seed(0)
    m = model_cfg("model.num_layers=8", "model.hidden_size=256", "model.num_heads=4", "model.vocab_size=500")
    params = {n: p.asnumpy() for n, p in build_model(m).parameters_and_names()}
    assert params["embedding"].std() == pytest.approx(0.02, rel=0.05)
    assert params["layers.0.attention.qkv.weight"].std() == pytest.approx(0.02, rel=0.05)
    assert params["layers.0.attention.out.weight"].std() == pytest.approx(0.02 / np.sqrt(16), rel=0.05)
    assert params["layers.0.mlp.down.weight"].std() == pytest.approx(0.02 / np.sqrt(16), rel=0.05)
    assert (params["layers.0.attn_norm.weight"] == 1).all()


def test_device_fast_paths_are_chosen_at_construction():
    """Ascend kernels cannot run here; what can be checked is which path each Cell picks (the plan is data)."""
    from ms_llm.nn import CausalSelfAttention, LayerNorm, RMSNorm
    from ms_llm.nn.backend import Backend
    from ms_llm.nn.transformer import DecoderLayer, FrontReusedDecoderLayer, ReusedDecoderLayer, decoder_layer

    asc, cpu = Backend("Ascend"), Backend("CPU")
    assert CausalSelfAttention(256, 4, 2, 64, compute_dtype=ms.bfloat16, backend=asc).flash  # head size 64, bf16
    assert not CausalSelfAttention(256, 4, 2, 64, compute_dtype=ms.float32, backend=asc).flash  # FA: fp16/bf16
    assert not CausalSelfAttention(96, 4, 4, 64, compute_dtype=ms.float16, backend=asc).flash  # head 24 % 16
    assert not CausalSelfAttention(256, 4, 4, 64, dropout=0.1, compute_dtype=ms.float16, backend=asc).flash
    assert RMSNorm(8, backend=asc).ascend and LayerNorm(8, backend=asc).ascend
    assert type(decoder_layer(RMSNorm(8), RMSNorm(8), RMSNorm(8), RMSNorm(8), asc)) is ReusedDecoderLayer
    assert not CausalSelfAttention(256, 4, 2, 64, compute_dtype=ms.float16, backend=cpu).flash
    assert not RMSNorm(8, backend=cpu).ascend
    assert type(decoder_layer(RMSNorm(8), RMSNorm(8), RMSNorm(8), RMSNorm(8), cpu)) is FrontReusedDecoderLayer
    no_reuse = Backend("Ascend", layer_reuse=False)  # the pipeline reuses its micro-batch loss instead
    assert type(decoder_layer(RMSNorm(8), RMSNorm(8), RMSNorm(8), RMSNorm(8), no_reuse)) is DecoderLayer
