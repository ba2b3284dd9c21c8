"""Hugging Face ↔ ms_llm conversion, checked against an independent numpy forward pass."""
import json
import os

import numpy as np
import pytest
import mindspore as ms
from safetensors.numpy import save_file

from conftest import ms_llm
from ms_llm.checkpoint import safetensors_io, store
from ms_llm.config import load_config
from model_zoo import build_model

ms.set_device("CPU")  # before any kernel runs: a later in-process training run sets the same device
ms.set_context(mode=ms.GRAPH_MODE)
V, T = 50, 16


def rnd(rng, *shape, scale=0.1):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def gpt2_hf(rng, L=2, C=32, H=4):
    t = {"transformer.wte.weight": rnd(rng, V, C), "transformer.wpe.weight": rnd(rng, T, C),
         "transformer.ln_f.weight": 1 + rnd(rng, C), "transformer.ln_f.bias": rnd(rng, C)}
    for i in range(L):
        p = f"transformer.h.{i}."
        t.update({p + "ln_1.weight": 1 + rnd(rng, C), p + "ln_1.bias": rnd(rng, C),
                  p + "attn.c_attn.weight": rnd(rng, C, 3 * C), p + "attn.c_attn.bias": rnd(rng, 3 * C),
                  p + "attn.c_proj.weight": rnd(rng, C, C), p + "attn.c_proj.bias": rnd(rng, C),
                  p + "ln_2.weight": 1 + rnd(rng, C), p + "ln_2.bias": rnd(rng, C),
                  p + "mlp.c_fc.weight": rnd(rng, C, 4 * C), p + "mlp.c_fc.bias": rnd(rng, 4 * C),
                  p + "mlp.c_proj.weight": rnd(rng, 4 * C, C), p + "mlp.c_proj.bias": rnd(rng, C)})
    cfg = {"model_type": "gpt2", "n_layer": L, "n_embd": C, "n_head": H, "n_positions": T, "vocab_size": V,
           "layer_norm_epsilon": 1e-5}
    return cfg, t


def llama_hf(rng, L=2, C=32, H=4, KV=2, F=48):
    d = C // H
    t = {"model.embed_tokens.weight": rnd(rng, V, C), "model.norm.weight": 1 + rnd(rng, C),
         "lm_head.weight": rnd(rng, V, C)}
    for i in range(L):
        p = f"model.layers.{i}."
        t.update({p + "input_layernorm.weight": 1 + rnd(rng, C), p + "post_attention_layernorm.weight": 1 + rnd(rng, C),
                  p + "self_attn.q_proj.weight": rnd(rng, H * d, C), p + "self_attn.k_proj.weight": rnd(rng, KV * d, C),
                  p + "self_attn.v_proj.weight": rnd(rng, KV * d, C), p + "self_attn.o_proj.weight": rnd(rng, C, H * d),
                  p + "mlp.gate_proj.weight": rnd(rng, F, C), p + "mlp.up_proj.weight": rnd(rng, F, C),
                  p + "mlp.down_proj.weight": rnd(rng, C, F)})
    cfg = {"model_type": "llama", "num_hidden_layers": L, "hidden_size": C, "num_attention_heads": H,
           "num_key_value_heads": KV, "intermediate_size": F, "max_position_embeddings": T, "vocab_size": V,
           "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False}
    return cfg, t


# --- an independent numpy forward pass (float64) over the Hugging Face tensors ---------------------------

def layer_norm(x, w, b, eps):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * w + b


def attention(q, k, v):  # (H, T, d) each, causal
    s = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])
    s = s + np.triu(np.full(s.shape[-2:], -np.inf), 1)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def gpt2_numpy(cfg, t, ids):
    w = {k: v.astype(np.float64) for k, v in t.items()}
    C, H = cfg["n_embd"], cfg["n_head"]
    x = w["transformer.wte.weight"][ids] + w["transformer.wpe.weight"][: len(ids)]
    for i in range(cfg["n_layer"]):
        p = f"transformer.h.{i}."
        h = layer_norm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"], 1e-5)
        q, k, v = np.split(h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"], 3, -1)
        heads = lambda z: z.reshape(len(ids), H, C // H).transpose(1, 0, 2)  # noqa: E731
        y = attention(heads(q), heads(k), heads(v)).transpose(1, 0, 2).reshape(len(ids), C)
        x = x + y @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = layer_norm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"], 1e-5) @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"]
        h = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3)))
        x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    return layer_norm(x, w["transformer.ln_f.weight"], w["transformer.ln_f.bias"], 1e-5) @ w["transformer.wte.weight"].T


def llama_numpy(cfg, t, ids):
    w = {k: v.astype(np.float64) for k, v in t.items()}
    C, H, KV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d, n = C // H, len(ids)
    rms = lambda x, g: x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg["rms_norm_eps"]) * g  # noqa: E731
    inv = 1.0 / (cfg["rope_theta"] ** (np.arange(0, d, 2) / d))
    ang = np.outer(np.arange(n), inv)
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
    rope = lambda z: z * cos + np.concatenate([-z[..., d // 2:], z[..., : d // 2]], -1) * sin  # noqa: E731
    x = w["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(n, H, d).transpose(1, 0, 2)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(n, KV, d).transpose(1, 0, 2)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(n, KV, d).transpose(1, 0, 2)
        k, v = np.repeat(k, H // KV, 0), np.repeat(v, H // KV, 0)
        y = attention(rope(q), rope(k), v).transpose(1, 0, 2).reshape(n, C)
        x = x + y @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        g, u = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ w[p + "mlp.down_proj.weight"].T
    return rms(x, w["model.norm.weight"]) @ w["lm_head.weight"].T


def write_hf(folder, cfg, tensors, bf16=False):
    os.makedirs(folder, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    if bf16:
        safetensors_io.save(str(folder / "model.safetensors"), tensors, {k: "BF16" for k in tensors})
    else:
        save_file(tensors, str(folder / "model.safetensors"))


def our_logits(out_dir, ids):
    cfg = load_config(str(out_dir / "config.yaml"))
    model = build_model(cfg.model)
    params = {k: ms.Parameter(ms.Tensor(v), name=k) for k, v in store.read_tensors(str(out_dir / "model.ckpt")).items()}
    missing, unexpected = ms.load_param_into_net(model, params, strict_load=True)
    assert not missing and not unexpected
    model.set_train(False)
    return model(ms.Tensor(ids[None].astype(np.int32))).asnumpy()[0]


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_hf_to_ours_matches_numpy_reference_and_round_trips(family, tmp_path):
    rng = np.random.default_rng(0)
    cfg, tensors = gpt2_hf(rng) if family == "gpt2" else llama_hf(rng)
    bf16 = family == "llama"
    if bf16:  # bfloat16 like real Llama checkpoints: round the values so the float32 copies are exact
        tensors = {k: (v.view(np.uint32) & 0xFFFF0000).view(np.float32) for k, v in tensors.items()}
    hf = tmp_path / "hf"
    write_hf(hf, cfg, tensors, bf16)
    out = tmp_path / "ours"
    proc = ms_llm("convert", "--from-hf", str(hf), "--output", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]

    ids = rng.integers(0, V, T)
    ref = (gpt2_numpy if family == "gpt2" else llama_numpy)(cfg, tensors, ids)
    np.testing.assert_allclose(our_logits(out, ids), ref, rtol=0, atol=1e-5)

    back = tmp_path / "hf_again"
    proc = ms_llm("convert", "--to-hf", str(out / "model.ckpt"), "--output", str(back))
    assert proc.returncode == 0, proc.stderr[-2000:]
    again, dtypes, _ = safetensors_io.load(str(back / "model.safetensors"))
    assert set(again) == set(tensors)
    assert all(np.array_equal(again[k], tensors[k]) for k in tensors)  # bit-identical values
    if bf16:
        original = safetensors_io.read_header(str(hf / "model.safetensors"))[0]
        written = safetensors_io.read_header(str(back / "model.safetensors"))[0]
        assert all(written[k]["dtype"] == "BF16" for k in tensors)
        raw = lambda p, h, k, start: open(p, "rb").read()[start + h[k]["data_offsets"][0]: start + h[k]["data_offsets"][1]]  # noqa: E731
        s1, s2 = safetensors_io.read_header(str(hf / "model.safetensors"))[1], safetensors_io.read_header(str(back / "model.safetensors"))[1]
        assert all(raw(hf / "model.safetensors", original, k, s1) == raw(back / "model.safetensors", written, k, s2)
                   for k in tensors)


@pytest.mark.slow
def test_mismatched_checkpoints_list_the_offending_tensors(tmp_path):
    rng = np.random.default_rng(1)
    cfg, tensors = gpt2_hf(rng)
    tensors["transformer.h.1.mlp.c_fc.weight"] = rnd(rng, 32, 100)
    del tensors["transformer.h.0.ln_2.bias"]
    tensors["transformer.h.0.extra.weight"] = rnd(rng, 3)
    write_hf(tmp_path / "bad", cfg, tensors)
    proc = ms_llm("convert", "--from-hf", str(tmp_path / "bad"), "--output", str(tmp_path / "o1"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "missing transformer.h.0.ln_2.bias" in proc.stderr and "unexpected transformer.h.0.extra.weight" in proc.stderr
    tensors["transformer.h.0.ln_2.bias"] = rnd(rng, 32)
    del tensors["transformer.h.0.extra.weight"]
    write_hf(tmp_path / "bad2", cfg, tensors)
    proc = ms_llm("convert", "--from-hf", str(tmp_path / "bad2"), "--output", str(tmp_path / "o2"))
    assert proc.returncode == 2 and "layers.1.mlp.up.weight: checkpoint (100, 32), config (128, 32)" in proc.stderr
    (tmp_path / "bad3").mkdir()
    (tmp_path / "bad3" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    proc = ms_llm("convert", "--from-hf", str(tmp_path / "bad3"), "--output", str(tmp_path / "o3"))
    assert proc.returncode == 2 and "families ms_llm converts are 'gpt2', 'llama'" in proc.stderr
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


def test_a_shard_the_index_names_but_the_folder_lacks_is_one_paragraph(tmp_path, capsys):
    """A download that stopped half-way: model.safetensors.index.json names two shards, one is there."""
    from ms_llm.cli import main

    rng = np.random.default_rng(2)
    cfg, tensors = gpt2_hf(rng)
    hf = tmp_path / "hf"
    write_hf(hf, cfg, tensors)
    os.rename(hf / "model.safetensors", hf / "model-00001-of-00002.safetensors")
    names = sorted(tensors)
    weight_map = {n: "model-00001-of-00002.safetensors" if i % 2 else "model-00002-of-00002.safetensors"
                  for i, n in enumerate(names)}
    (hf / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    assert main(["convert", "--from-hf", str(hf), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "model-00002-of-00002.safetensors" in err and "incomplete" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()
    (hf / "model.safetensors.index.json").write_text("{\"weight_map\": ")  # truncated index
    assert main(["convert", "--from-hf", str(hf), "--output", str(tmp_path / "out")]) == 2
    assert "cannot be read as a safetensors index" in capsys.readouterr().err
