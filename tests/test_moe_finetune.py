"""Fine-tuning a mixture of experts (ms_llm/train/losses/composed.py): the loss a run gets is its objective (the
masked token loss of chat data, the preference pair loss) plus the router term (load balancing, z-loss), each part
evaluated apart here; then SFT of a converted Mixtral and DPO of a converted Qwen3-MoE through `ms-llm train`."""
import contextlib
import io
import json
import os
from types import SimpleNamespace

import numpy as np
import pytest

import mindspore as ms


ms.set_device("CPU")
ms.set_context(mode=ms.GRAPH_MODE)

TINY = ["model.arch=llama", "model.num_layers=2", "model.hidden_size=32", "model.num_heads=2", "model.seq_length=16",
        "model.vocab_size=64", "model.ffn_hidden_size=48"]
# each test builds MoE models: the loss tests evaluate them op by op (the conftest's `pynative`: a loss's value and
# gradients are the point, and a graph compile per model would cost seconds each); the CLI test trains them
pytestmark = pytest.mark.slow
MASKED = {"columns": ["input_ids", "loss_mask", "segment_ids"]}  # a chat dataset's manifest (unpacked)
PAIRS = {"columns": ["input_ids", "loss_mask", "segment_ids"], "format": "preference"}


def moe_model(aux_loss_coef=0.5, z_loss_coef=0.05, seed=3):
    from model_zoo import build_model
    from ms_llm.config import load_config

    cfg = load_config(None, TINY + [f"model.moe={{num_experts: 4, top_k: 2, aux_loss_coef: {aux_loss_coef}, "
                                    f"z_loss_coef: {z_loss_coef}}}"])
    ms.set_seed(seed)
    return cfg, build_model(cfg.model)


def chosen_loss(cfg, model, manifest):
    """The loss a run of `cfg` on the dataset of `manifest` gets (ms_llm.train.losses.choose)."""
    from ms_llm.nn.backend import PORTABLE
    from ms_llm.train import losses

    return losses.choose(cfg, manifest, model, PORTABLE)


def chat_batch(seed=0, b=2, t=16):
    """ids (b, t+1) and a loss mask that keeps about half the tokens, one conversation per row."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 64, (b, t + 1)).astype(np.int32)
    mask = (rng.random((b, t + 1)) < 0.5).astype(np.int32)
    segments = np.ones((b, t + 1), np.int32)
    return SimpleNamespace(ids=ms.Tensor(ids), loss_mask=ms.Tensor(mask), segments=ms.Tensor(segments))


def log_softmax(logits):
    x = logits.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def router_term(model, ids, moe):
    """The router term from the MoE layers' own statistics rows (ms_llm.nn.moe.STAT_NAMES: lb_loss, z_loss):
    aux_loss_coef · lb + z_loss_coef · z, averaged over the MoE layers."""
    from ms_llm.nn.moe import STAT_NAMES

    _, _, stats = model.forward_layers(ids[:, :-1])
    rows = np.stack([s.asnumpy() for s in stats]).astype(np.float64)[:, -len(STAT_NAMES):]
    return float(np.mean(moe.aux_loss_coef * rows[:, 0] + moe.z_loss_coef * rows[:, 1]))


def test_the_moe_masked_loss_is_the_dense_masked_loss_plus_the_router_term(pynative):
    """A chat dataset on an MoE model: the differentiated loss is (Σ w·ce ÷ Σ w + router term) · grad_scale, the
    masked mean over the target tokens from numpy on the model's logits and the router term from the MoE layers'
    statistics; the logged loss is the masked mean alone; the router statistics are the aux output; and the
    router's gradient carries the router term (it differs from the gradient with the coefficients at 0)."""
    from ms_llm.train.losses.masked import target_weights

    cfg, model = moe_model()
    loss = chosen_loss(cfg, model, MASKED)
    batch = chat_batch()
    inputs = loss.inputs([batch])[0]
    assert [name for name, _ in loss.aux_shapes] == ["router_stats"]
    grad_scale = 8.0 / 4
    grad = ms.value_and_grad(loss, None, model.trainable_params(), has_aux=True)
    out, grads = grad(ms.Tensor(grad_scale, ms.float32), *inputs)
    scaled, logged, stats = (o.asnumpy() for o in out)

    ids = batch.ids.asnumpy()
    w = target_weights(batch.loss_mask.asnumpy(), batch.segments.asnumpy()).astype(np.float64)
    assert 0 < w.sum() < w.size  # some targets are left out: ÷ Σ w is not ÷ all tokens
    logp = log_softmax(model(batch.ids[:, :-1]).asnumpy())
    ce = -np.take_along_axis(logp, ids[:, 1:, None].astype(np.int64), -1)[..., 0]
    masked_mean = (ce * w).sum() / w.sum()
    router = router_term(model, batch.ids, cfg.model.moe)
    assert router > 0.1  # large enough that leaving it out is seen
    assert float(logged) == pytest.approx(masked_mean, rel=1e-5)
    assert float(scaled) == pytest.approx((masked_mean + router) * grad_scale, rel=1e-5)
    assert stats.shape == (model.num_moe_layers, 4 + 5)

    # the router term is differentiated: the router's gradient is not the masked loss's alone
    router_grads = {p.name: g.asnumpy() for p, g in zip(model.trainable_params(), grads) if "router" in p.name}
    cfg, plain = moe_model(0.0, 0.0)
    plain_loss = chosen_loss(cfg, plain, MASKED)
    _, plain_grads = ms.value_and_grad(plain_loss, None, plain.trainable_params(), has_aux=True)(
        ms.Tensor(grad_scale, ms.float32), *plain_loss.inputs([batch])[0])
    plain_router = {p.name: g.asnumpy() for p, g in zip(plain.trainable_params(), plain_grads) if "router" in p.name}
    assert router_grads and all(np.abs(router_grads[k] - plain_router[k]).max() > 1e-5 for k in router_grads)


def test_the_moe_pair_loss_is_the_dense_pair_loss_plus_the_router_term(pynative):
    """A preference dataset on an MoE model: the pair objective evaluated alone (the same model and inputs, no
    router term) plus the router term is what is differentiated; both aux buffers come back, in aux_shapes' order."""
    from ms_llm.train.losses import PreferenceLoss

    cfg, model = moe_model()
    loss = chosen_loss(cfg, model, PAIRS)
    assert [name for name, _ in loss.aux_shapes] == ["preference_stats", "router_stats"]
    rng = np.random.default_rng(4)
    ids = ms.Tensor(rng.integers(0, 64, (2, 17)).astype(np.int32))
    seg = np.ones((2, 17), np.int32)
    seg[:, 9:] = 2  # prompt + chosen, then prompt + rejected
    wc = (seg[:, 1:] == 1).astype(np.float32)
    wc[:, :3] = 0
    wr = (seg[:, 1:] == 2).astype(np.float32)
    wr[:, 8:11] = 0
    reference = ms.Tensor(rng.normal(-30, 1, (2, 2)).astype(np.float32))
    columns = (ms.Tensor(seg), ms.Tensor(wc), ms.Tensor(wr), reference)
    scaled, logged, pair_stats, router_stats = loss(ms.Tensor(2.0, ms.float32), ids, *columns)
    dense = PreferenceLoss(model)(ms.Tensor(1.0, ms.float32), ids, *columns)
    _, router_aux, _ = model.forward_layers(ids[:, :-1], columns[0][:, :-1])
    assert float(logged.asnumpy()) == float(dense[1].asnumpy())
    assert float(router_aux.asnumpy()) > 0.1
    assert float(scaled.asnumpy()) == pytest.approx(2.0 * (float(dense[1].asnumpy())
                                                           + float(router_aux.asnumpy())), rel=1e-6)
    assert np.array_equal(pair_stats.asnumpy(), dense[2].asnumpy()) and router_stats.shape == (2, 9)


# --- through the CLI ------------------------------------------------------------------------------------------------

def cli(*args):
    from ms_llm.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


HF_MOE = {  # the two MoE families `ms-llm convert --from-hf` reads, tiny (transformers config class, options)
    "mixtral": ("MixtralConfig", {"num_local_experts": 4}),
    "qwen3_moe": ("Qwen3MoeConfig", {"num_experts": 4, "moe_intermediate_size": 64, "head_dim": 16}),
}
# no evaluation: no assertion reads a validation loss, and its graph would be compiled for each run
RUN = ["model.seq_length=128", "train.global_batch_size=4", "train.micro_batch_size=2", "train.lr=3e-3",
       "train.warmup_steps=2", "train.log_interval=1", "train.eval_interval=0", "train.eval_steps=0",
       "train.weight_decay=0.0", "monitor.progress_bar=false", "monitor.summary=false", "monitor.report=false",
       "monitor.telemetry_interval_s=null", "context.compile_cache=false"]


def converted_moe(family, folder):
    """A random tiny transformers MoE model of `family` (the chat tokenizer's 512 tokens), saved and converted with
    `ms-llm convert --from-hf` into FOLDER/ours: the folder."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cls, options = HF_MOE[family]
    # one layer: an MoE layer as any other (its router logs moe/0/...), and each run compiles half the graph of two
    config = getattr(transformers, cls)(vocab_size=512, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                        num_experts_per_tok=2, router_aux_loss_coef=0.01, **options)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).float().save_pretrained(str(folder / "hf"))
    code, _, err = cli("convert", "--from-hf", folder / "hf", "--output", folder / "ours")
    assert code == 0, err
    return folder / "ours"


def fine_tune(base, data, run, *settings):
    """`ms-llm train` from the converted weights on `data`: the records of metrics.jsonl that carry a loss."""
    args = [f"data.dataset_dir={data}", f"checkpoint.load_weights={base / 'model.ckpt'}", *RUN, *settings]
    code, out, err = cli("train", "--config", base / "config.yaml", "--run-dir", run,
                         *[a for s in args for a in ("--set", s)])
    assert code == 0, err + out[-3000:]
    return [r for r in map(json.loads, open(os.path.join(run, "metrics.jsonl"))) if "loss" in r]


def test_sft_of_a_converted_mixtral_and_dpo_of_a_converted_qwen3_moe(tmp_path):
    """`ms-llm train` on the MoE models the project converts: a Mixtral fine-tuned on chat data (loss mask) and a
    Qwen3-MoE trained with DPO on preference pairs. Both train (the loss falls), both log the router's health and its
    aux loss; the SFT loss counts the responses only, and DPO starts at log 2 (the policy is its reference)."""
    from finetune_fixtures import assets, demo, write_jsonl

    a = assets()
    code, _, err = cli("preprocess", "--format", "chat", "--input", a["chat"], "--tokenizer", a["tok"],
                       "--seq-length", 128, "--output-dir", tmp_path / "chat", "--workers", "1")
    assert code == 0, err
    sft = fine_tune(converted_moe("mixtral", tmp_path / "mixtral"), tmp_path / "chat", tmp_path / "sft",
                    "train.max_steps=16")
    assert sft[-1]["loss"] < sft[0]["loss"] - 0.5
    assert all(0 < r["loss_tokens_frac"] < 1 and r["aux_loss"] > 0 and "moe/0/lb_loss" in r for r in sft)

    recs = demo.conversations(4, 1, 40, seed=5)  # one global batch: every step trains on the same 4 pairs
    pairs = [{"prompt": r["messages"][0]["content"], "chosen": r["messages"][1]["content"],
              "rejected": recs[(i + 1) % len(recs)]["messages"][1]["content"]} for i, r in enumerate(recs)]
    code, _, err = cli("preprocess", "--format", "preference", "--input", write_jsonl(tmp_path / "p.jsonl", pairs),
                       "--tokenizer", a["tok"], "--seq-length", 256, "--output-dir", tmp_path / "pairs",
                       "--workers", "1", "--val-fraction", "0")
    assert code == 0, err
    # the 4 pairs in one micro-batch: one step graph to compile (the SFT run above accumulates 2 micro-batches, and
    # tests/test_preference.py the pair loss's)
    dpo = fine_tune(converted_moe("qwen3_moe", tmp_path / "qwen3_moe"), tmp_path / "pairs", tmp_path / "dpo",
                    "model.seq_length=256", "train.max_steps=8", "train.lr=1e-3",
                    "data.shuffle=false", "finetune.preference.loss=dpo", "train.micro_batch_size=4")
    assert dpo[0]["loss"] == pytest.approx(np.log(2), abs=1e-3)  # the policy starts as its reference
    assert dpo[-1]["loss"] < dpo[0]["loss"] - 0.1 and dpo[-1]["rewards/margins"] > 0
    assert all(r["aux_loss"] > 0 and "moe/0/lb_loss" in r and "rewards/margins" in r for r in dpo)
