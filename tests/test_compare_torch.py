"""`ms-llm debug compare-torch` and ms_llm.interop.torch_dump: tiny random transformers models (2 layers, hidden
64, vocab 128, built offline with save_pretrained) compared module by module, forward, backward and through one
AdamW step; a planted 1% defect named exactly; name maps; and every bad input refused with exit 2."""
import contextlib
import io
import json
import os
import subprocess
import sys

import mindspore  # noqa: F401 (imported at collection, so that no fast test pays for it)
import numpy as np
import pytest

from conftest import ROOT
from ms_llm.cli import main
from ms_llm.interop.hf_modules import module_pairs
from ms_llm.interop.torch_dump import apply_name_map, batch_sha256, random_batch, read_dump, write_dump
from test_convert import gpt2_hf, write_hf

FAMILIES = ("gpt2", "llama")
LAYERS, VOCAB, T = 2, 128, 32
# The float32 comparison of Llama runs the training step compiled (graph mode, the default; Llama's the family with
# more kinds of ops: RoPE, grouped-query attention, RMSNorm, SwiGLU); every other comparison, GPT-2's and float16's
# included, runs it in PyNative, which skips two compiles (a graph-mode comparison costs ~7-11 CPU s, a PyNative one
# 2-4). On CPU the two modes agree to rounding: identical rows for GPT-2, gradients about 1e-9 apart for Llama (the
# module outputs come from PyNative hooks either way).
PYNATIVE = ("--set", "context.mode=pynative")


def run(*args):
    """(exit code, stdout, stderr) of `ms-llm debug compare-torch ARGS`, in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["debug", "compare-torch", *map(str, args)])
    return code, out.getvalue(), err.getvalue()


def verdict(out):
    """The closing line: 'first module over tolerance: ...' or 'all modules within tolerance'."""
    return next(line for line in out.splitlines() if line.startswith(("first module over tolerance", "all modules")))


def run_json(*args):
    code, out, err = run(*args, "--json")
    assert code in (0, 1), err[-3000:]
    return code, out, json.loads(out.strip().splitlines()[-1])


# --- tiny transformers models --------------------------------------------------------------------------------

def build(family):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if family == "gpt2":
        return GPT2LMHeadModel(GPT2Config(n_layer=LAYERS, n_embd=64, n_head=4, n_positions=64, vocab_size=VOCAB,
                                          bos_token_id=0, eos_token_id=0))
    return LlamaForCausalLM(LlamaConfig(num_hidden_layers=LAYERS, hidden_size=64, num_attention_heads=4,
                                        num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64,
                                        vocab_size=VOCAB, bos_token_id=0, eos_token_id=0))


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """{family: folder} of the tiny models, saved with save_pretrained."""
    out = {}
    for family in FAMILIES:
        out[family] = str(tmp_path_factory.mktemp(family))
        build(family).save_pretrained(out[family])
    return out


@pytest.fixture(scope="module")
def fp32(hf, tmp_path_factory):
    """{family: (exit code, printed table, JSON)} of the float32 comparison."""
    return {f: run_json("--hf", hf[f], "--output-dir", tmp_path_factory.mktemp(f"{f}32") / "o",
                        *(() if f == "llama" else PYNATIVE)) for f in FAMILIES}


@pytest.fixture(scope="module")
def fp16(hf, tmp_path_factory):
    return {f: run_json("--hf", hf[f], "--compute-dtype", "float16", "--output-dir",
                        tmp_path_factory.mktemp(f"{f}16") / "o", *PYNATIVE) for f in FAMILIES}


def forward_names():
    per_layer = ("attn_norm", "attention", "mlp_norm", "mlp")
    return (["embed_dropout"] + [n for i in range(LAYERS) for n in [f"layers.{i}.{m}" for m in per_layer]
                                 + [f"layers.{i}"]] + ["final_norm", "logits"])


# --- float32: every module within tolerance ------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_float32_every_module_within_tolerance(fp32, family):
    code, out, r = fp32[family]
    rows = r["rows"]
    assert code == 0 and verdict(out) == "all modules within tolerance", out[-3000:]
    assert [x["ours"] for x in rows if x["kind"] == "forward"] == forward_names()
    params = [x["ours"] for x in rows if x["kind"] == "weight"]  # parameter order
    assert [x["ours"] for x in rows if x["kind"] == "gradient"] == params[::-1]  # backward: reverse order
    assert len(params) == (4 + 12 * LAYERS if family == "gpt2" else 3 + 6 * LAYERS) and "embedding" in params
    assert [x["kind"] for x in rows].count("loss") == 1
    assert all(x["max_rel"] <= x["tol"] and not x["over"] and x["cosine"] > 0.999999 for x in rows)
    worst = max(rows, key=lambda x: x["max_rel"])
    assert r["largest_relative_error"] == {"kind": worst["kind"], "ours": worst["ours"], "max_rel": worst["max_rel"]}
    assert f"largest relative error: {worst['max_rel']:.3g} ({worst['kind']} {worst['ours']})" in out
    assert 0 < worst["max_rel"] < 1e-4  # float32 on both sides: far from any real difference
    theirs = {x["ours"]: x["theirs"] for x in rows}
    if family == "gpt2":
        assert theirs["layers.1.mlp"] == "transformer.h.1.mlp"
        assert theirs["layers.0.attention.qkv.weight"] == "transformer.h.0.attn.c_attn.weight"
    else:
        assert theirs["layers.1.attention"] == "model.layers.1.self_attn"
        assert theirs["layers.0.attention.qkv.weight"] == "model.layers.0.self_attn.{q_proj,k_proj,v_proj}.weight"


@pytest.mark.slow
def test_float32_json_file_and_page_say_the_same(fp32):
    code, out, r = fp32["llama"]
    with open(os.path.join(r["output_dir"], "compare.json"), encoding="utf-8") as f:
        saved = json.load(f)
    assert saved["rows"] == r["rows"] and saved["exit_code"] == code == 0
    assert np.array_equal(np.load(os.path.join(r["output_dir"], "batch.npy")), random_batch(VOCAB, 2, T, seed=0))
    with open(r["html"], encoding="utf-8") as f:
        page = f.read()
    payload = json.loads(page.split('id="report-data">')[1].split("</script>")[0])
    panels = {p["id"]: p for p in payload["panels"]}
    assert set(panels) == {"forward", "backward", "weights"}
    mlp = next(s for s in panels["forward"]["series"] if s["label"] == "mlp")
    assert mlp["x"] == [0, 1]  # one point per layer
    errs = {x["ours"]: x["max_rel"] for x in r["rows"] if x["kind"] == "forward"}
    assert mlp["y"] == pytest.approx([max(errs["layers.0.mlp"], 1e-12), max(errs["layers.1.mlp"], 1e-12)], rel=1e-6)
    assert panels["backward"]["hlines"] == [r["tolerances"]["gradient"]]


# --- float16: where precision is lost --------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_float16_table_shows_where_precision_is_lost(fp16, family):
    code, out, r = fp16[family]
    rows = r["rows"]
    assert code == 0 and "all modules within tolerance" in out, out[-3000:]
    forward = [x for x in rows if x["kind"] == "forward"]
    band = r["float32_band"]["forward"]
    # the first cast to float16 is the embedding's: its error is float16's rounding of it, and every module
    # after it carries more than the float32 band
    first = r["first_over_float32_band"]
    assert first["ours"] == forward[0]["ours"] == "embed_dropout"
    assert f"first module over the float32 band (~): embed_dropout ({first['theirs']})" in out
    assert 0 < forward[0]["max_rel"] <= 2.0 ** -11
    assert all(x["max_rel"] > band and x["max_rel"] <= x["tol"] for x in forward)
    assert all(line.startswith("~ ") for line in out.splitlines() if line[2:].startswith(tuple(forward_names())))
    # AdamW updates float32 master weights, given the same gradients on both sides: the float32 band holds
    assert all(x["max_rel"] <= r["float32_band"]["weight"] for x in rows if x["kind"] == "weight")


# --- Llama's relatives: one entry of the module table each -------------------------------------------------------

RELATIVES = {"qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}, "layers.0.attention.qkv.bias"),
             "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}, "layers.0.attention.k_norm.weight"),
             "mistral": ("MistralConfig", "MistralForCausalLM", {}, "layers.0.attention.qkv.weight")}


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(RELATIVES))
def test_llamas_relatives_compare_through_the_llama_entry(family, tmp_path):
    """qwen2 (q/k/v biases), qwen3 (q/k norms) and mistral share Llama's transformers module names: the module table
    gives them Llama's entry, and they compare once the converter reads their checkpoints (ms_llm.interop.huggingface
    lists the model_types it reads in FAMILIES; a checkout whose converter does not know the family skips)."""
    import transformers

    from ms_llm.interop import huggingface

    if family not in getattr(huggingface, "FAMILIES", ()):
        pytest.skip(f"the converter of this checkout does not read model_type {family} yet")
    config, model, extra, param = RELATIVES[family]
    import torch

    torch.manual_seed(0)
    cfg = getattr(transformers, config)(num_hidden_layers=LAYERS, hidden_size=64, num_attention_heads=4,
                                        num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64,
                                        vocab_size=VOCAB, bos_token_id=0, eos_token_id=0, **extra)
    getattr(transformers, model)(cfg).save_pretrained(tmp_path / "hf")
    code, out, r = run_json("--hf", tmp_path / "hf", "--output-dir", tmp_path / "o", *PYNATIVE)
    assert code == 0 and "all modules within tolerance" in out, out[-3000:]
    assert [x["ours"] for x in r["rows"] if x["kind"] == "forward"] == forward_names()
    theirs = {x["ours"]: x["theirs"] for x in r["rows"]}
    assert theirs["layers.1.attention"] == "model.layers.1.self_attn"
    assert param in theirs and theirs[param].startswith("model.layers.0.self_attn.")


# --- a planted defect, dumped with dump_module, is named first ------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("family,weight,named", [
    ("gpt2", "transformer.h.1.mlp.c_fc.weight", "layers.1.mlp (transformer.h.1.mlp)"),
    ("llama", "model.layers.0.self_attn.o_proj.weight", "layers.0.attention (model.layers.0.self_attn)")])
def test_a_weight_perturbed_by_one_percent_is_named_first(hf, tmp_path, family, weight, named):
    import torch
    import transformers

    from ms_llm.interop.torch_dump import dump_module

    model = transformers.AutoModelForCausalLM.from_pretrained(hf[family])
    with torch.no_grad():
        dict(model.named_parameters())[weight].mul_(1.01)
    dump_module(model, random_batch(VOCAB, 2, T, seed=0), tmp_path / "dump")
    code, out, r = run_json("--hf", hf[family], "--reference-dump", tmp_path / "dump", "--output-dir", tmp_path / "o",
                            *PYNATIVE)
    assert code == 1 and verdict(out) == f"first module over tolerance: {named}", out[-3000:]
    assert "weights after the step are not compared" in out and not any(x["kind"] == "weight" for x in r["rows"])


# --- name maps ------------------------------------------------------------------------------------------------

LLAMA_MAP = """
net.embed_tokens: embed_dropout
net.layers.{i}.input_layernorm: layers.{i}.attn_norm
net.layers.{i}.self_attn: layers.{i}.attention
net.layers.{i}.post_attention_layernorm: layers.{i}.mlp_norm
net.layers.{i}.mlp: layers.{i}.mlp
net.layers.{i}: layers.{i}
net.norm: final_norm
net.embed_tokens.weight: embedding
net.layers.{i}.input_layernorm.weight: layers.{i}.attn_norm.weight
net.layers.{i}.self_attn.q_proj.weight: layers.{i}.attention.qkv.weight
net.layers.{i}.self_attn.k_proj.weight: layers.{i}.attention.qkv.weight
net.layers.{i}.self_attn.v_proj.weight: layers.{i}.attention.qkv.weight
net.layers.{i}.self_attn.o_proj.weight: layers.{i}.attention.out.weight
net.layers.{i}.post_attention_layernorm.weight: layers.{i}.mlp_norm.weight
net.layers.{i}.mlp.gate_proj.weight: layers.{i}.mlp.gate_up.weight
net.layers.{i}.mlp.up_proj.weight: layers.{i}.mlp.gate_up.weight
net.layers.{i}.mlp.down_proj.weight: layers.{i}.mlp.down.weight
net.norm.weight: final_norm.weight
head.weight: lm_head
"""


def own_llama(hf_dir):
    """'Your own PyTorch model': transformers' Llama parts under other names (net.*, head)."""
    import torch
    import transformers

    class MyLlama(torch.nn.Module):
        def __init__(self, base):
            super().__init__()
            self.net, self.head = base.model, base.lm_head

        def forward(self, ids):
            return self.head(self.net(input_ids=ids).last_hidden_state)

    return MyLlama(transformers.AutoModelForCausalLM.from_pretrained(hf_dir))


@pytest.mark.slow
def test_a_name_map_matches_your_own_model_and_needs_no_torch(hf, fp32, tmp_path, monkeypatch):
    import yaml

    from ms_llm.interop.torch_dump import dump_module

    (tmp_path / "map.yaml").write_text(LLAMA_MAP)
    model = own_llama(hf["llama"])
    ids = random_batch(VOCAB, 2, T, seed=0)
    dump_module(model, ids, tmp_path / "own")
    # the same map applied at dump time: ms_llm's names, q/k/v and gate/up concatenated as ms_llm fuses them
    mapped = dump_module(model, ids, tmp_path / "mapped", name_map=yaml.safe_load(LLAMA_MAP))
    assert mapped["names"] == "ms_llm" and "layers.1.attention.qkv.weight" in mapped["parameters"]
    _, _, grads = read_dump(tmp_path / "mapped")
    _, _, own = read_dump(tmp_path / "own")
    q, k, v = (own[f"net.layers.1.self_attn.{x}_proj.weight"] for x in "qkv")
    assert np.array_equal(grads["layers.1.attention.qkv.weight"], np.concatenate([q, k, v]))
    # comparing a dump needs neither torch nor transformers
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setitem(sys.modules, "transformers", None)
    code, out, r = run_json("--hf", hf["llama"], "--reference-dump", tmp_path / "own", "--name-map",
                            tmp_path / "map.yaml", "--output-dir", tmp_path / "o", *PYNATIVE)
    assert code == 0 and "all modules within tolerance" in out, out[-3000:]
    # every module output and the loss as in the comparison under transformers' own names: the same numbers
    same = lambda rows: [(x["ours"], x["max_abs"]) for x in rows if x["kind"] in ("forward", "loss")]  # noqa: E731
    assert same(r["rows"]) == same(fp32["llama"][2]["rows"])
    theirs = {x["ours"]: x["theirs"] for x in r["rows"]}
    assert theirs["layers.0.attention"] == "net.layers.0.self_attn"
    assert theirs["layers.0.mlp.gate_up.weight"] == "net.layers.0.mlp.{gate_proj,up_proj}.weight"
    assert [x["ours"] for x in r["rows"] if x["kind"] == "forward"] == forward_names()
    assert len([x for x in r["rows"] if x["kind"] == "gradient"]) == 3 + 6 * LAYERS
    # the dump written in ms_llm's names needs no map, and compares the same
    code, _, again = run_json("--hf", hf["llama"], "--reference-dump", tmp_path / "mapped", "--output-dir",
                              tmp_path / "o2", *PYNATIVE)
    rows = lambda r: [(x["ours"], x["theirs"], x["max_abs"]) for x in r["rows"]]  # noqa: E731
    assert code == 0 and rows(again) == rows(r)


def test_name_map_patterns_rename_and_concatenate_in_map_order():
    entries = {"blocks.0.wv": np.full((1, 2), 3.0), "blocks.0.wq": np.full((2, 2), 1.0),
               "blocks.0.wk": np.full((1, 2), 2.0), "blocks.1.wq": np.zeros((2, 2)), "other": np.zeros(1)}
    name_map = {"blocks.{i}.wq": "layers.{i}.qkv", "blocks.{i}.wk": "layers.{i}.qkv", "blocks.{i}.wv": "layers.{i}.qkv"}
    out, sources = apply_name_map(entries, name_map)
    assert set(out) == {"layers.0.qkv", "layers.1.qkv"}  # "other" matched nothing: left out
    assert out["layers.0.qkv"][:, 0].tolist() == [1, 1, 2, 3]  # q, k, v: the map's order, not the dump's
    assert sources["layers.0.qkv"] == ["blocks.0.wq", "blocks.0.wk", "blocks.0.wv"]


# --- the batch and the one dump format -----------------------------------------------------------------------

def test_random_batch_is_the_same_anywhere_and_hashed_as_int32():
    import hashlib

    a = random_batch(VOCAB, 3, 5, seed=7)
    assert a.shape == (3, 6) and a.dtype == np.int32 and a.min() >= 0 and a.max() < VOCAB
    assert np.array_equal(a, random_batch(VOCAB, 3, 5, seed=7)) and not np.array_equal(a, random_batch(VOCAB, 3, 5, 8))
    digest = hashlib.sha256(b"ms_llm.random_batch/7/0").digest()  # the documented recipe, not numpy's generator
    assert a.ravel()[0] == int.from_bytes(digest[:4], "little") % VOCAB
    assert batch_sha256(a.astype(np.int64)) == hashlib.sha256(a.tobytes()).hexdigest()


def test_ms_llm_compare_reads_a_pytorch_dump(tmp_path, capsys):
    ids = random_batch(VOCAB, 2, 4)
    x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)
    write_dump(tmp_path / "a", {"layers.0": x, "logits": x}, {"embedding": x}, ids,
               {"framework": "mindspore 2.10.0", "step": 5, "run_dir": "runs/x", "loss": 1.0,
                "compute_dtype": "float32", "device": "CPU"})
    write_dump(tmp_path / "b", {"layers.0": x, "logits": x * 1.1}, {"embedding": x}, ids,
               {"framework": "torch 2.13.0", "model": "MyGPT", "loss": 1.0, "compute_dtype": "float32",
                "device": "cpu"})
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "B: MyGPT torch 2.13.0 float32 on cpu" in out and "first divergence: forward logits" in out


# --- bad input: one paragraph, exit 2 -------------------------------------------------------------------------

@pytest.fixture
def numpy_gpt2(tmp_path):
    """A Hugging Face GPT-2 folder written with numpy (no torch): (folder, config, tensors)."""
    cfg, tensors = gpt2_hf(np.random.default_rng(0))
    write_hf(tmp_path / "hf", cfg, tensors)
    return str(tmp_path / "hf"), cfg, tensors


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path, monkeypatch):
    """Each test runs in its own folder, where the default output folder (compare_torch/...) would appear."""
    monkeypatch.chdir(tmp_path)


def refused(*args):
    """stderr of a refused comparison; nothing may have been written (--output-dir or the default folder)."""
    before = set(os.listdir("."))
    code, out, err = run(*args)
    assert code == 2 and "Traceback" not in err and err.startswith("error: "), (code, out, err)
    assert set(os.listdir(".")) == before
    return err


def test_an_unsupported_architecture_lists_the_supported_ones(tmp_path):
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    err = refused("--hf", tmp_path / "bert")
    assert "model_type 'bert'" in err and "Supported model_types: gpt2, llama, mistral, qwen2, qwen3" in err


def test_torch_missing_names_the_extra(numpy_gpt2, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torch", None)
    err = refused("--hf", numpy_gpt2[0], "--output-dir", tmp_path / "o")
    assert 'pip install -e ".[torch]"' in err and "--reference-dump" in err
    assert not (tmp_path / "o").exists()


def test_bfloat16_is_refused_on_cpu(numpy_gpt2, tmp_path):
    err = refused("--hf", numpy_gpt2[0], "--compute-dtype", "bfloat16", "--reference-dump", fake_dump(
        tmp_path, numpy_gpt2, random_batch(50, 2, 16)), "--seq-length", 16, "--output-dir", tmp_path / "o")
    assert "bfloat16 cannot run on CPU" in err and "--compute-dtype float16" in err


def fake_dump(tmp_path, numpy_gpt2, batch, forward_names=None, grads=None):
    """A dump in transformers' names for the numpy GPT-2 (zeros: these tests stop before comparing)."""
    _, cfg, tensors = numpy_gpt2
    names = forward_names or [t for _, t in module_pairs("gpt2", cfg["n_layer"])]
    forward = {n: np.zeros((2, batch.shape[1] - 1, cfg["n_embd"]), np.float32) for n in names}
    grads = grads if grads is not None else {n: np.zeros_like(a) for n, a in tensors.items()}
    write_dump(tmp_path / "dump", forward, grads, batch, {"framework": "torch", "loss": 1.0, "names": "own"})
    return tmp_path / "dump"


def test_a_dump_of_another_batch_is_refused(numpy_gpt2, tmp_path):
    dump = fake_dump(tmp_path, numpy_gpt2, random_batch(50, 2, 16, seed=1))
    err = refused("--hf", numpy_gpt2[0], "--reference-dump", dump, "--seq-length", 16, "--seed", 0)
    assert "was made on another token batch" in err and "random_batch(50, 2, 16, seed=0)" in err


def test_a_name_map_that_leaves_modules_unmatched_lists_them(numpy_gpt2, tmp_path):
    names = ["drop"] + [f"blocks.{i}.{m}" for i in range(2) for m in ("ln1", "attn", "ln2", "mlp")]
    dump = fake_dump(tmp_path, numpy_gpt2, random_batch(50, 2, 16), names, grads={"wte": np.zeros((50, 32))})
    (tmp_path / "map.yaml").write_text("drop: embed_dropout\nblocks.{i}.attn: layers.{i}.attention\n"
                                       "blocks.{i}.mlp: layers.{i}.mlp\nwte: embedding\n")
    err = refused("--hf", numpy_gpt2[0], "--reference-dump", dump, "--name-map", tmp_path / "map.yaml",
                  "--seq-length", 16)
    assert "leaves" in err and "unmatched: layers.0.attn_norm, layers.1.attn_norm" in err
    assert "layers.0.attention.qkv.weight" in err and "blocks.0.ln1" in err  # ours unmatched, and theirs unused
    assert "layers.0.attention," not in err.split("unmatched:")[1].split("Map each")[0]


def test_a_dump_in_other_names_asks_for_a_name_map(numpy_gpt2, tmp_path):
    dump = fake_dump(tmp_path, numpy_gpt2, random_batch(50, 2, 16), ["drop", "blocks.0.attn"])
    err = refused("--hf", numpy_gpt2[0], "--reference-dump", dump, "--seq-length", 16)
    assert "layers.0.attention (transformer.h.0.attn)" in err and "--name-map" in err and "drop" in err


def test_a_shape_mismatch_names_the_parameter_and_both_shapes(numpy_gpt2, tmp_path):
    _, _, tensors = numpy_gpt2
    grads = {n: np.zeros_like(a) for n, a in tensors.items()}
    grads["transformer.h.1.attn.c_attn.weight"] = np.zeros((96, 32), np.float32)  # a Linear's (out, in)
    dump = fake_dump(tmp_path, numpy_gpt2, random_batch(50, 2, 16), grads=grads)
    err = refused("--hf", numpy_gpt2[0], "--reference-dump", dump, "--seq-length", 16)
    assert "transformer.h.1.attn.c_attn.weight: reference dump (96, 32), checkpoint (32, 96)" in err
    # and a checkpoint that does not match its own config.json, through the converter's check
    hf_dir, cfg, tensors = numpy_gpt2
    tensors = dict(tensors, **{"transformer.h.1.mlp.c_fc.weight": np.zeros((32, 100), np.float32)})
    write_hf(tmp_path / "bad", cfg, tensors)
    err = refused("--hf", tmp_path / "bad", "--reference-dump", dump, "--seq-length", 16)
    assert "layers.1.mlp.up.weight: checkpoint (100, 32), config (128, 32)" in err


def test_other_refusals(numpy_gpt2, tmp_path):
    assert "needs --reference-dump" in refused("--hf", numpy_gpt2[0], "--name-map", tmp_path / "m.yaml")
    dump = fake_dump(tmp_path, numpy_gpt2, random_batch(50, 2, 16))
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "compare.json").write_text("{}")
    assert "already holds a comparison" in refused("--hf", numpy_gpt2[0], "--output-dir", tmp_path / "o",
                                                    "--reference-dump", dump)
    assert (tmp_path / "o" / "compare.json").read_text() == "{}"  # nothing on disk was touched
    assert "longer than the model's 16 positions" in refused("--hf", numpy_gpt2[0], "--seq-length", 17,
                                                             "--reference-dump", dump)
    assert "is not a dump" in refused("--hf", numpy_gpt2[0], "--reference-dump", tmp_path)


# --- torch_dump runs without MindSpore; --data takes a real batch ----------------------------------------------

@pytest.mark.slow
def test_torch_dump_runs_without_mindspore(tmp_path):
    script = f"""
import sys
sys.modules["mindspore"] = None  # any import of MindSpore fails
from ms_llm.interop.torch_dump import dump_module, random_batch
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Linear(16, 50))
index = dump_module(model, random_batch(50, 2, 8), {str(tmp_path / 'd')!r})
print(sorted(index["modules"]), sorted(index["parameters"]), round(index["loss"], 3))
print(sorted(m for m in sys.modules if m.startswith("ms_llm")))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=ROOT), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("['0', '1', 'logits'] ['0.weight', '1.bias', '1.weight']")
    # the package's own start (ms_llm/lean_import.py: the standard library alone) and the dump, nothing else
    assert lines[1] == "['ms_llm', 'ms_llm.interop', 'ms_llm.interop.torch_dump', 'ms_llm.lean_import']"
    index, forward, grads = read_dump(tmp_path / "d")
    assert index["format"] == "ms_llm.dump/2" and index["batch_sha256"] == batch_sha256(random_batch(50, 2, 8))
    assert forward["1"].shape == (2, 8, 50) and np.array_equal(forward["1"], forward["logits"])
    assert grads["0.weight"].shape == (50, 16) and np.abs(grads["1.weight"]).sum() > 0


@pytest.mark.slow
def test_a_dataset_batch(hf, dataset, tmp_path):
    code, out, r = run_json("--hf", hf["gpt2"], "--data", dataset, "--batch-size", 3, "--output-dir", tmp_path / "o",
                            *PYNATIVE, "--set", "train.weight_decay=0.01", "--set", "train.lr=3e-4")
    assert code == 0 and "all modules within tolerance" in out, out[-3000:]
    assert (r["optimizer"]["weight_decay"], r["optimizer"]["lr"]) == (0.01, 3e-4)  # the step took --set's values
    assert "AdamW lr 0.0003 betas (0.9, 0.99) eps 1e-08, weight decay 0.01 on matrices" in out
    from ms_llm.data.loader import eval_batches
    from ms_llm.data.manifest import load_manifest

    first = eval_batches(dataset, load_manifest(dataset), 3, 1, seq_length=32)[0].asnumpy()
    assert r["batch"]["sha256"] == batch_sha256(first) and dataset in r["batch"]["source"]
    assert np.array_equal(np.load(tmp_path / "o" / "batch.npy"), first)
