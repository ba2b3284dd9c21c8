"""MindFormers users moving in: configs, Llama checkpoints (all name variants and dtypes), sharded merges."""
import os

import numpy as np
import pytest
import yaml

from conftest import ROOT, ms_llm, op_by_op
from ms_llm.errors import UserError

FIXTURES = os.path.join(ROOT, "tests", "fixtures", "mindformers")
LLAMA2_7B_PARAMS = 6_738_415_616


def fixture(name):
    return os.path.join(FIXTURES, name + ".yaml")


# --- config import ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, global_batch, micro, max_steps", [
    ("pretrain_llama2_7b", 64, 1, 2 * (100_000 // 64)),  # 1 per device × dp 8 × accumulation 8
    ("finetune_llama2_7b", 16, 4, 3 * (100_000 // 16)),  # 2 × interleave 2 per device × dp 4 × accumulation 1
    ("pretrain_llama2_7b_auto_parallel", 32, 2, 1 * (100_000 // 32)),  # 2 × dp 2 × micro_batch_num 8 (pipeline)
])
def test_mindformers_configs_convert_with_every_key_accounted_for(name, global_batch, micro, max_steps, tmp_path):
    from ms_llm.config import load_config
    from ms_llm.interop.mindformers.config import convert_config
    from ms_llm.interop.mindformers.table import UNKNOWN, flatten
    from ms_llm.parallel.layout import build_plan
    from ms_llm.parallel.shapes import ModelShape

    out = tmp_path / "ours.yaml"
    lines = []
    _, rows = convert_config(fixture(name), str(out), samples=100_000, log=lines.append)
    with open(fixture(name), encoding="utf-8") as f:
        source_keys = set(flatten(yaml.safe_load(f)))
    assert source_keys <= {r.key for r in rows}  # every key of the file has its row ...
    assert not [r.key for r in rows if r.status == UNKNOWN]  # ... and every row says what became of it
    cfg = load_config(str(out))  # the written file is a valid ms_llm config
    assert ModelShape.from_config(cfg.model).total_params() == LLAMA2_7B_PARAMS
    assert f"{LLAMA2_7B_PARAMS:,} parameters" in "\n".join(lines)
    t, pc = cfg.train, cfg.parallel_config
    assert (t.global_batch_size, t.micro_batch_size, t.max_steps) == (global_batch, micro, max_steps)
    plan = build_plan(cfg, pc.data_parallel * pc.model_parallel * pc.pipeline_stage)  # the layout passes our checks
    batch_row = next(r for r in rows if r.key == "runner_config.batch_size")
    assert f"= {global_batch}" in batch_row.note and "per device" in batch_row.note
    assert not cfg.model.tie_embeddings and cfg.model.ffn_hidden_size == 11008
    if name == "pretrain_llama2_7b":
        assert (t.lr, t.min_lr, t.warmup_steps, t.beta2, t.weight_decay) == (5e-5, 0.0, int(max_steps * 0.03), 0.95, 0.1)
        assert (cfg.precision.loss_scale, cfg.precision.init_scale, cfg.precision.compute_dtype) == \
               ("dynamic", 65536.0, "float16")
        assert (cfg.checkpoint.save_interval, cfg.checkpoint.keep_last, t.eval_interval) == (100, 5, 0)
    if name == "finetune_llama2_7b":
        assert (cfg.precision.loss_scale, cfg.precision.compute_dtype, pc.model_parallel) == ("none", "bfloat16", 2)
        assert (cfg.monitor.profile.start_step, cfg.monitor.profile.stop_step) == (5, 15)
        assert cfg.checkpoint.remote_dir == "obs://my-bucket/llama2_7b_ft" and cfg.data.dataset_dir == "/data/alpaca"
        labels = next(r for r in rows if r.key == "train_dataset.input_columns")
        assert labels.status == "NOT SUPPORTED" and "labels" in labels.note
        assert next(r for r in rows if r.key == "load_checkpoint").status == "ACTION"
    if name == "pretrain_llama2_7b_auto_parallel":
        assert (plan.pp, plan.micro_batch_num, cfg.recompute_config.recompute) == (2, 8, [4, 0])
        assert next(r for r in rows if r.key == "parallel.parallel_mode").status == "NOT SUPPORTED"
        assert "ignores it under pipeline" in next(r for r in rows
                                                   if r.key == "runner_config.gradient_accumulation_steps").note


def test_epochs_need_the_dataset_size_and_bad_models_are_refused(tmp_path):
    from ms_llm.interop.mindformers.config import import_config

    with open(fixture("pretrain_llama2_7b"), encoding="utf-8") as f:
        raw = yaml.safe_load(f)
    ours, rows, _ = import_config(raw)  # no --samples and no readable dataset
    assert "max_steps" not in ours["train"] and "warmup_steps" not in ours["train"]
    assert {r.key: r.status for r in rows}["runner_config.epochs"] == "ACTION"
    from mindspore.mindrecord import FileWriter

    from ms_llm.interop.mindformers.config import convert_config

    os.makedirs(tmp_path / "wiki")  # a readable dataset is counted: 3 shards as MindFormers' --file_partition 3
    writer = FileWriter(str(tmp_path / "wiki" / "wiki.mindrecord"), shard_num=3)
    writer.add_schema({"input_ids": {"type": "int32", "shape": [-1]}}, "lm")
    writer.write_raw_data([{"input_ids": np.arange(9, dtype=np.int32)} for _ in range(1000)])
    writer.commit()
    raw["train_dataset"]["data_loader"]["dataset_dir"] = str(tmp_path / "wiki" / "wiki.mindrecord0")
    (tmp_path / "mf.yaml").write_text(yaml.safe_dump(raw))
    cfg, _ = convert_config(str(tmp_path / "mf.yaml"), str(tmp_path / "ours.yaml"), log=lambda *_: None)
    assert cfg.train.max_steps == 2 * (1000 // 64) and cfg.data.dataset_dir == str(tmp_path / "wiki")
    for key, value, message in [("type", "GPT2Config", "only Llama models"), ("extend_method", "NTK", "RoPE extension"),
                                ("attn_proj_has_bias", True, "no bias on the attention output")]:
        bad = yaml.safe_load(yaml.safe_dump(raw))
        bad["model"]["model_config"][key] = value
        with pytest.raises(UserError, match=message):
            import_config(bad)
    moe = yaml.safe_load(yaml.safe_dump(raw))  # a mixture of experts is imported as model.moe (tests/test_moe.py)
    moe["moe_config"] = {"expert_num": 8}
    assert import_config(moe)[0]["model"]["moe"]["num_experts"] == 8


def cli(*args):
    """`ms-llm ARGS` in this process (MindSpore is imported once per test session): (exit code, stdout, stderr)."""
    import contextlib
    import io

    from ms_llm.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


@pytest.mark.slow
def test_cli_converts_a_config_plans_it_and_train_names_a_mindformers_file(tmp_path):
    out = tmp_path / "llama2_7b.yaml"
    proc = ms_llm("convert", "--from-mindformers-config", fixture("pretrain_llama2_7b_auto_parallel"), "--output",
                  str(out), "--samples", "100000")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "MindFormers key = value" in proc.stdout and "6,738,415,616 parameters" in proc.stdout
    assert "global 32 = micro 2 × data-parallel 2 × pipeline micro-batches 8" in proc.stdout
    again = ms_llm("convert", "--from-mindformers-config", fixture("pretrain_llama2_7b"), "--output", str(out))
    assert again.returncode == 2 and "already exists" in again.stderr and "Traceback" not in again.stderr
    plan = ms_llm("plan", "--config", str(out))
    assert plan.returncode == 0, plan.stderr[-2000:]
    assert "6,738,415,616" in plan.stdout or "6.74" in plan.stdout
    code, _, err = cli("train", "--config", fixture("pretrain_llama2_7b"), "--dry-run")
    assert code == 2 and "is a MindFormers config" in err and "--from-mindformers-config" in err
    assert len(err.strip().splitlines()) == 1


def write_mindformers_mindrecord(folder, samples, seq_length, vocab):
    """Rows as MindFormers' llama_preprocess.py writes them with --file_partition 2: one int32 input_ids
    column of seq_length + 1 tokens, in name.mindrecord0 / name.mindrecord1 (+ .db)."""
    from mindspore.mindrecord import FileWriter

    os.makedirs(folder)
    writer = FileWriter(os.path.join(folder, "wiki4096.mindrecord"), shard_num=2)
    writer.add_schema({"input_ids": {"type": "int32", "shape": [-1]}}, "lm-schema")
    pattern = np.random.default_rng(0).integers(0, vocab, 64)  # a repeating sequence: learnable
    writer.write_raw_data([{"input_ids": np.roll(pattern, -i)[:seq_length + 1].astype(np.int32)}
                           for i in range(samples)])
    writer.commit()


@pytest.mark.slow
def test_converted_config_trains_20_steps_on_an_adopted_mindformers_mindrecord(tmp_path):
    """The whole move: MindFormers YAML → our config; MindFormers-layout MindRecord → `ms-llm data adopt`; 20
    steps with the converted settings (schedule, loss scale, clipping). A CPU can only take a small model of
    the family on one rank, so the shape, layout and batch are overridden and nothing else."""
    from ms_llm.interop.mindformers.config import convert_config

    data = str(tmp_path / "wiki4096")
    write_mindformers_mindrecord(data, 200, 32, 256)
    code, _, err = cli("data", "adopt", data, "--tokenizer", "byte", "--seq-length", "32", "--val-fraction", "0.1")
    assert code == 0, err
    out = str(tmp_path / "ours.yaml")
    convert_config(fixture("pretrain_llama2_7b"), out, samples=180, log=lambda *_: None)
    shrink = ["parallel_config.optimizer_shard=false", "parallel_config.data_parallel=1", f"data.dataset_dir={data}",
              "model.num_layers=1", "model.hidden_size=32", "model.num_heads=4", "model.ffn_hidden_size=64",
              "model.seq_length=32", "model.vocab_size=null", "train.global_batch_size=4",
              "train.micro_batch_size=4", "train.max_steps=20", "train.warmup_steps=2", "train.lr=3e-3",
              "train.eval_steps=0", "train.log_interval=1", "precision.compute_dtype=float32", "context.compile_cache=false",
              "monitor.progress_bar=false", "monitor.summary=false"]
    code, stdout, err = cli("train", "--config", out, "--run-dir", str(tmp_path / "run"),
                            *[a for o in shrink for a in ("--set", o)])
    assert code == 0, err + stdout
    losses = [float(line.split("| loss ")[1].split()[0]) for line in stdout.splitlines() if "| loss " in line]
    assert len(losses) == 20  # every step logged
    # it learns: the fitted line falls by more than three times the scatter around it
    slope, intercept = np.polyfit(np.arange(20), losses, 1)
    scatter = np.std(np.array(losses) - (slope * np.arange(20) + intercept))
    assert slope < 0 and -slope * 19 > 3 * scatter, (losses, slope, scatter)
    assert "done: 20 steps" in stdout and "scale 65536" in stdout  # the converted dynamic loss scale


# --- checkpoints ------------------------------------------------------------------------------------------

V, C, H, KV, F, L, T = 50, 32, 4, 2, 48, 2, 16
D = C // H
TINY = {"model": {"arch": "llama", "num_layers": L, "hidden_size": C, "num_heads": H, "num_kv_heads": KV,
                  "ffn_hidden_size": F, "seq_length": T, "vocab_size": V, "norm_eps": 1e-6, "rope_theta": 10000.0,
                  "tie_embeddings": False, "dropout": 0.0}}


def rounded(a, dtype):
    """Values exactly representable in `dtype`, kept as float32."""
    if dtype == "bfloat16":
        return (a.astype(np.float32).view(np.uint32) & 0xFFFF0000).view(np.float32)
    return a.astype(np.float16).astype(np.float32) if dtype == "float16" else a.astype(np.float32)


def plain_weights(rng, dtype):
    """A tiny Llama in MindFormers' plain names."""
    w = lambda *s, base=0.0: rounded(base + rng.standard_normal(s) * 0.1, dtype)  # noqa: E731
    t = {"model.tok_embeddings.embedding_weight": w(V, C), "model.norm_out.weight": w(C, base=1.0),
         "lm_head.weight": w(V, C)}
    for i in range(L):
        p = f"model.layers.{i}."
        t.update({p + "attention_norm.weight": w(C, base=1.0), p + "ffn_norm.weight": w(C, base=1.0),
                  p + "attention.wq.weight": w(H * D, C), p + "attention.wk.weight": w(KV * D, C),
                  p + "attention.wv.weight": w(KV * D, C), p + "attention.wo.weight": w(C, H * D),
                  p + "feed_forward.w1.weight": w(F, C), p + "feed_forward.w3.weight": w(F, C),
                  p + "feed_forward.w2.weight": w(C, F)})
    return t


def variant(plain, kind):
    """The same weights under another MindFormers naming: `._layer.` wrappers, or fused w_qkv / w_gate_hidden
    in MindFormers 1.4+'s grouped rows (written row by row, independently of ms_llm's reshapes) or 1.3's
    concatenated rows."""
    if kind == "plain":
        return dict(plain)
    if kind == "layer":
        linear = (".wq.", ".wk.", ".wv.", ".wo.", ".w1.", ".w2.", ".w3.")
        return {(k.replace(".weight", "._layer.weight") if any(s in k for s in linear) else k): v
                for k, v in plain.items()}
    out = {k: v for k, v in plain.items() if not any(s in k for s in (".wq.", ".wk.", ".wv.", ".w1.", ".w3."))}
    for i in range(L):
        p = f"model.layers.{i}."
        q, k, v = (plain[p + f"attention.{n}.weight"] for n in ("wq", "wk", "wv"))
        gate, up = plain[p + "feed_forward.w1.weight"], plain[p + "feed_forward.w3.weight"]
        if kind == "concatenated":
            qkv, gate_up = np.concatenate([q, k, v]), np.concatenate([gate, up])
        else:
            rows = []
            for g in range(KV):  # each key/value head follows the query heads that share it
                rows += [q[(g * (H // KV) + j) * D + r] for j in range(H // KV) for r in range(D)]
                rows += [k[g * D + r] for r in range(D)] + [v[g * D + r] for r in range(D)]
            qkv = np.stack(rows)
            gate_up = np.stack([row for j in range(F) for row in (gate[j], up[j])])
        out[p + "attention.w_qkv.weight"], out[p + "feed_forward.w_gate_hidden.weight"] = qkv, gate_up
    return out


def save_mindformers(path, tensors, dtype, extra_state=True):
    import mindspore as ms

    msd = {"float32": ms.float32, "float16": ms.float16, "bfloat16": ms.bfloat16}[dtype]
    items = [{"name": k, "data": ms.Tensor(v, msd)} for k, v in tensors.items()]
    if extra_state:  # what a MindFormers training checkpoint carries besides the weights
        items += [{"name": "adam_m." + k, "data": ms.Tensor(np.zeros_like(v))} for k, v in list(tensors.items())[:2]]
        items += [{"name": "global_step", "data": ms.Tensor(np.array([7], np.int32))},
                  {"name": "scale_sense", "data": ms.Tensor(np.array(1024.0, np.float32))}]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    ms.save_checkpoint(items, path)


def llama_numpy(t, ids):
    """An independent float64 forward pass over MindFormers' plain tensors (rotate-half RoPE, as MindFormers)."""
    w = {k: v.astype(np.float64) for k, v in t.items()}
    n = len(ids)
    rms = lambda x, g: x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * g  # noqa: E731
    ang = np.outer(np.arange(n), 1.0 / (10000.0 ** (np.arange(0, D, 2) / D)))
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
    rope = lambda z: z * cos + np.concatenate([-z[..., D // 2:], z[..., :D // 2]], -1) * sin  # noqa: E731
    x = w["model.tok_embeddings.embedding_weight"][ids]
    for i in range(L):
        p = f"model.layers.{i}."
        h = rms(x, w[p + "attention_norm.weight"])
        q, k, v = ((h @ w[p + f"attention.{n_}.weight"].T).reshape(n, -1, D).transpose(1, 0, 2)
                   for n_ in ("wq", "wk", "wv"))
        k, v = np.repeat(k, H // KV, 0), np.repeat(v, H // KV, 0)
        s = rope(q) @ rope(k).transpose(0, 2, 1) / np.sqrt(D) + np.triu(np.full((n, n), -np.inf), 1)
        pr = np.exp(s - s.max(-1, keepdims=True))
        y = ((pr / pr.sum(-1, keepdims=True)) @ v).transpose(1, 0, 2).reshape(n, C)
        x = x + y @ w[p + "attention.wo.weight"].T
        h = rms(x, w[p + "ffn_norm.weight"])
        g, u = h @ w[p + "feed_forward.w1.weight"].T, h @ w[p + "feed_forward.w3.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ w[p + "feed_forward.w2.weight"].T
    return rms(x, w["model.norm_out.weight"]) @ w["lm_head.weight"].T


def our_logits(folder, ids):
    import mindspore as ms

    from ms_llm.checkpoint import store
    from ms_llm.config import load_config
    from model_zoo import build_model

    model = build_model(load_config(str(folder / "config.yaml")).model)
    params = {k: ms.Parameter(ms.Tensor(v), name=k) for k, v in store.read_tensors(str(folder / "model.ckpt")).items()}
    missing, unexpected = ms.load_param_into_net(model, params, strict_load=True)
    assert not missing and not unexpected
    model.set_train(False)
    with op_by_op():
        return model(ms.Tensor(ids[None].astype(np.int32))).asnumpy()[0]


def raw_tensors(path):
    """{name: (dtype, raw bytes)} of a MindSpore checkpoint: what 'bit for bit' compares."""
    import mindspore as ms

    out = {}
    for k, p in ms.load_checkpoint(path).items():
        a = p.asnumpy()
        out[k] = (str(p.dtype), a.shape, a.tobytes())
    return out


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory):
    path = tmp_path_factory.mktemp("cfg") / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    return str(path)


@pytest.mark.parametrize("kind, dtype, layout", [("plain", "float16", None), ("layer", "bfloat16", None),
                                                 ("grouped", "bfloat16", "grouped"),
                                                 ("concatenated", "float16", "concatenated")])
def test_mindformers_checkpoint_matches_numpy_and_round_trips_bit_for_bit(kind, dtype, layout, tiny_config, tmp_path):
    from ms_llm.interop.mindformers import ckpt as mf

    rng = np.random.default_rng(3)
    plain = plain_weights(rng, dtype)
    src = str(tmp_path / "mf" / "llama_tiny.ckpt")
    save_mindformers(src, variant(plain, kind), dtype)
    lines = []
    mf.from_mindformers(src, tiny_config, str(tmp_path / "ours"), fused_layout=layout, log=lines.append)
    assert "4 optimizer/training-state tensors not converted" in lines[-1]

    ids = rng.integers(0, V, T)
    diff = np.abs(our_logits(tmp_path / "ours", ids) - llama_numpy(plain, ids)).max()
    assert diff < 1e-5, diff

    back = mf.to_mindformers(str(tmp_path / "ours" / "model.ckpt"), None, str(tmp_path / "back"), log=lines.append)
    original = {k: v for k, v in raw_tensors(src).items() if not mf.names.is_training_state(k)}
    again = raw_tensors(back)
    assert list(again) == list(original)  # same names, same order
    bad = [k for k in original if again[k] != original[k]]
    assert not bad, bad


@pytest.mark.slow
def test_cli_round_trip_and_every_mismatch_listed(tiny_config, tmp_path):
    rng = np.random.default_rng(4)
    plain = plain_weights(rng, "bfloat16")
    src = str(tmp_path / "mf" / "fused.ckpt")
    save_mindformers(src, variant(plain, "grouped"), "bfloat16", extra_state=False)
    code, _, err = cli("convert", "--from-mindformers", src, "--config", tiny_config, "--output", str(tmp_path / "x"))
    assert code == 2 and "--fused-layout grouped" in err and not (tmp_path / "x").exists()
    code, _, err = cli("convert", "--from-mindformers", src, "--config", tiny_config, "--fused-layout", "grouped",
                       "--output", str(tmp_path / "ours"))
    assert code == 0, err
    proc = ms_llm("convert", "--to-mindformers", str(tmp_path / "ours" / "model.ckpt"), "--output",
                  str(tmp_path / "back"))  # once as its own process, the way a user runs it
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert raw_tensors(str(tmp_path / "back" / "rank_0" / "model.ckpt")) == raw_tensors(src)

    from ms_llm.interop.mindformers import ckpt as mf

    broken = variant(plain, "plain")
    del broken["model.layers.1.ffn_norm.weight"], broken["model.norm_out.weight"]
    broken["model.layers.0.attention.wk.weight"] = broken["model.layers.0.attention.wk.weight"][:8]
    broken["model.layers.1.feed_forward.w2.weight"] = broken["model.layers.1.feed_forward.w2.weight"].T.copy()
    broken["model.layers.0.attention.extra.weight"] = np.zeros(3, np.float32)
    bad = str(tmp_path / "mf" / "broken.ckpt")
    save_mindformers(bad, broken, "float32", extra_state=False)
    with pytest.raises(UserError) as e:
        mf.from_mindformers(bad, tiny_config, str(tmp_path / "never"), log=lambda *_: None)
    msg = str(e.value)
    for expected in ("missing model.norm_out.weight, model.layers.1.ffn_norm.weight",
                     "unexpected model.layers.0.attention.extra.weight",
                     "model.layers.0.attention.wk.weight: checkpoint (8, 32), config (16, 32)",
                     "model.layers.1.feed_forward.w2.weight: checkpoint (48, 32), config (32, 48)"):
        assert expected in msg, msg
    assert not (tmp_path / "never").exists()


def write_strategy(path, layouts, stage=0):
    """A MindSpore strategy file (node_strategy.proto): {param: (device matrix, tensor map)}; what semi-auto
    parallel saves, written by hand because a CPU cannot compile a sharded graph."""
    from mindspore.train import node_strategy_pb2 as pb

    sm = pb.ParallelStrategyMap()
    sm.current_stage = stage
    op = sm.parallel_strategy_item.add()  # one operator's entry: it carries the pipeline stage of the file
    op.node_name, op.parallel_strategys.stage = f"MatMul-op{stage}", stage
    op.parallel_strategys.parallel_strategy.add().dim.extend([1, 1])
    for name, (dev, tmap) in layouts.items():
        item = sm.parallel_layout_item.add()
        item.param_name = name
        lay = item.parallel_layouts
        lay.dev_matrix.add().dim.extend(dev)
        lay.tensor_map.add().dim.extend(tmap)
        lay.param_split_shape.add()
        lay.indices_offset.add()
        lay.field, lay.opt_weight_shard_step, lay.opt_weight_shard_size = 0, 0, 0
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(sm.SerializeToString())


def test_rank_sharded_checkpoint_is_merged_by_mindspore(tiny_config, tmp_path):
    from ms_llm.checkpoint import store
    from ms_llm.interop.mindformers import ckpt as mf

    rng = np.random.default_rng(5)
    full = plain_weights(rng, "float16")
    save_mindformers(str(tmp_path / "full" / "full.ckpt"), full, "float16", extra_state=False)
    column = (".wq.", ".wk.", ".wv.", ".w1.", ".w3.")  # model parallel 2: output rows split, wo/w2 input columns
    layouts = {k: ([2], [0, -1] if any(s in k for s in column) else [-1, 0] if (".wo." in k or ".w2." in k)
                   else [-1] * v.ndim) for k, v in full.items()}
    for r in range(2):
        shard = {}
        for k, v in full.items():
            tmap = layouts[k][1]
            axis = 0 if tmap[0] == 0 else 1 if len(tmap) > 1 and tmap[1] == 0 else None
            shard[k] = v if axis is None else np.split(v, 2, axis=axis)[r]
        save_mindformers(str(tmp_path / "shards" / f"rank_{r}" / f"llama_rank_{r}-10_1.ckpt"), shard, "float16",
                         extra_state=False)
    write_strategy(str(tmp_path / "strategy" / "ckpt_strategy_rank_0.ckpt"), layouts)
    log = []
    mf.from_mindformers(str(tmp_path / "shards"), tiny_config, str(tmp_path / "merged"),
                        strategy=str(tmp_path / "strategy" / "ckpt_strategy_rank_0.ckpt"), log=log.append)
    mf.from_mindformers(str(tmp_path / "full" / "full.ckpt"), tiny_config, str(tmp_path / "direct"), log=log.append)
    a, b = (store.read_tensors(str(tmp_path / d / "model.ckpt")) for d in ("merged", "direct"))
    assert set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a)
    assert any("transform_checkpoints" in line for line in log)
    with pytest.raises(UserError, match="--strategy"):
        mf.from_mindformers(str(tmp_path / "shards"), tiny_config, str(tmp_path / "x"), log=log.append)


def test_pipeline_shards_merge_with_their_per_stage_strategy_files(tiny_config, tmp_path):
    from ms_llm.checkpoint import store
    from ms_llm.interop.mindformers import ckpt as mf

    full = plain_weights(np.random.default_rng(6), "bfloat16")
    save_mindformers(str(tmp_path / "full.ckpt"), full, "bfloat16", extra_state=False)
    stage_of = lambda k: 1 if k.startswith(("model.layers.1.", "model.norm_out", "lm_head")) else 0  # noqa: E731
    for stage in (0, 1):  # pipeline 2: each stage's rank holds its own layers, whole
        mine = {k: v for k, v in full.items() if stage_of(k) == stage}
        save_mindformers(str(tmp_path / "shards" / f"rank_{stage}" / "llama.ckpt"), mine, "bfloat16", extra_state=False)
        write_strategy(str(tmp_path / "strategy" / f"ckpt_strategy_rank_{stage}.ckpt"),
                       {k: ([1], [-1] * v.ndim) for k, v in mine.items()}, stage)
    mf.from_mindformers(str(tmp_path / "shards"), tiny_config, str(tmp_path / "merged"),
                        strategy=str(tmp_path / "strategy"), log=lambda *_: None)
    mf.from_mindformers(str(tmp_path / "full.ckpt"), tiny_config, str(tmp_path / "direct"), log=lambda *_: None)
    a, b = (store.read_tensors(str(tmp_path / d / "model.ckpt")) for d in ("merged", "direct"))
    assert set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a)


def test_a_run_fine_tuned_from_a_converted_checkpoint_goes_back_in_the_original_names_and_dtypes(tmp_path):
    from ms_llm.checkpoint import store
    from ms_llm.interop.mindformers import ckpt as mf

    plain = plain_weights(np.random.default_rng(7), "bfloat16")
    src = str(tmp_path / "mf" / "layer.ckpt")
    save_mindformers(src, variant(plain, "layer"), "bfloat16", extra_state=False)
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    mf.from_mindformers(src, str(tmp_path / "tiny.yaml"), str(tmp_path / "conv"), log=lambda *_: None)
    # a run's checkpoint: its own folder, optimizer state alongside, the converted weights named in its config
    run = tmp_path / "run"
    weights = store.read_tensors(str(tmp_path / "conv" / "model.ckpt"))
    step = dict(weights, **{"adam_m." + k: np.zeros_like(v) for k, v in weights.items()})
    os.makedirs(run / "checkpoints" / "rank_0")
    store.write_tensors(str(run / "checkpoints" / "rank_0" / "step_00000002.ckpt"), step, "ckpt")
    (run / "config.yaml").write_text(yaml.safe_dump(dict(TINY, checkpoint={
        "load_weights": str(tmp_path / "conv" / "model.ckpt")})))
    lines = []
    back = mf.to_mindformers(str(run / "checkpoints" / "rank_0" / "step_00000002.ckpt"), str(run / "config.yaml"),
                             str(tmp_path / "back"), log=lines.append)
    assert "names, order and dtypes from" in lines[0]
    assert raw_tensors(back) == raw_tensors(src)
