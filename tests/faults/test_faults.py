"""The fault suite: each classic training bug is injected, and the toolkit must name it, with the right cause
first. This file holds the first eight (the toolkit's instruments: NaN hunter, overfit check, tensor statistics,
layer comparison, diagnose); test_faults_progress.py, test_faults_config.py and test_faults_system.py hold the
rest, and test_clean_runs.py the clean runs that must raise no alarm.

    (a) fp16 attention overflow          → NaN hunter names the attention scores of the first layer
    (b) learning rate 100x too high      → diagnose: divergence, learning rate first
    (c) targets not shifted / twice      → overfit check fails on labels; diagnose points to labels
    (d) a layer's output multiplied by 0 → tensor stats flag zero gradients in that layer: a dead branch
    (e) accumulation without dividing    → gradient norm x accumulation flagged, the undivided loss first
    (f) slow data pipeline               → diagnose flags data wait
    (g) a corrupt token id in a batch    → caught before the forward, with the sample index
    (h) fp32 vs fp16 run                 → compare names the first divergent layer
Faults are injected by patching code in-process (so the compile cache is off: a cached graph of the unpatched
code would hide them) or through config values.
"""
import json

import pytest

from conftest import tiny_train_args
from faultkit import NO_EVAL, diagnose, first_cause, sets, tiny_cfg, train
from ms_llm.cli import main
from ms_llm.train.losses.base import cross_entropy

pytestmark = pytest.mark.slow  # every fault here is injected into a training run


@pytest.fixture
def patched_loss(monkeypatch):
    """Replace the loss the training step differentiates (the fault), leaving evaluation correct: the tiny config's
    loss is the chunked one (train.loss_chunk_tokens), evaluated in its own graph."""
    from ms_llm.train.losses.composed import ComposedLoss

    def install(construct):
        real = ComposedLoss.construct

        def construct_or_evaluate(self, grad_scale, ids):
            return construct(self, grad_scale, ids) if self.training else real(self, grad_scale, ids)

        monkeypatch.setattr(ComposedLoss, "construct", construct_or_evaluate)

    return install


def test_a_fp16_attention_overflow_is_traced_to_the_attention_scores(dataset, tmp_path, capsys):
    # the CLI's commands in this process (what they print is the point, not the process: a subprocess would import
    # MindSpore again); 3 steps: the overflow is in the first
    assert main(tiny_train_args(dataset, tmp_path / "run", "--set", "precision.compute_dtype=float16",
                                "--set", "model.init_std=30", "--set", "monitor.nan_check=true",
                                "--set", "train.max_steps=3", "--set", "context.compile_cache=false")) == 0
    out = capsys.readouterr().out
    assert "culprit: layers.0.attention.core (attention scores QK^T)" in out, out[-3000:]
    assert "attention scores overflow float16" in out
    saved = tmp_path / "run" / "nan" / "step_1" / "rank_0"
    assert (saved / "batch.npy").is_file() and (saved / "state.ckpt").is_file()
    # the same answer from the saved step
    assert main(["debug", "nan", "--run-dir", str(tmp_path / "run")]) == 0
    assert "layers.0.attention.core (attention scores QK^T)" in capsys.readouterr().out


def test_b_learning_rate_too_high_is_diagnosed_as_divergence(dataset, tmp_path):
    # the quickstart's size (at the tiny size a 100x LR does not always diverge: test_faults_settings.py (ab)); the
    # loss is above ln V by step 10, the end of the warmup (5.1 > 4.2), so 30 steps logged every 5 show it
    quickstart_size = ["--set", "model.num_layers=4", "--set", "model.hidden_size=128", "--set", "model.num_heads=4"]
    train(tiny_cfg(dataset, *quickstart_size, "--set", "train.lr=0.1", "--set", "train.max_steps=30",
                   "--set", "train.warmup_steps=10", "--set", "train.log_interval=5", *sets(*NO_EVAL)),
          tmp_path / "run")
    f = first_cause(diagnose(tmp_path / "run"), "divergence", "learning rate", "too high")
    assert any("--set train.lr=" in a for a in f.actions), f.actions


def test_c_targets_not_shifted_fail_the_overfit_check_and_diagnose_points_to_labels(dataset, tmp_path, patched_loss):
    from ms_llm.debug.overfit import overfit

    def identity(self, grad_scale, ids):  # the bug: predicts the input token itself
        loss = cross_entropy(self.model(ids[:, :-1]), ids[:, :-1])
        return loss * grad_scale, loss

    patched_loss(identity)
    r = overfit(tiny_cfg(dataset, "--set", "train.lr=3e-3"), samples=16, steps=60, echo=lambda *a: None)
    assert not r["passed"] and any("not shifted" in s for s in r["suspects"]), r
    train(tiny_cfg(dataset, "--set", "train.max_steps=60", "--set", "train.eval_interval=20"), tmp_path / "run")
    first_cause(diagnose(tmp_path / "run"), "labels", "targets", "not shifted", confidence="high")


def test_c_targets_shifted_twice_fail_the_overfit_check(dataset, patched_loss):
    from ms_llm.debug.overfit import overfit

    def twice(self, grad_scale, ids):
        loss = cross_entropy(self.model(ids[:, :-2]), ids[:, 2:])
        return loss * grad_scale, loss

    patched_loss(twice)
    r = overfit(tiny_cfg(dataset, "--set", "train.lr=3e-3"), samples=16, steps=100, echo=lambda *a: None)
    assert not r["passed"] and any("labels" in s for s in r["suspects"]), r


def test_d_a_layer_multiplied_by_zero_is_flagged_vanishing(dataset, tmp_path, monkeypatch):
    from ms_llm.nn import layers
    import model_zoo.gpt2.model as gpt2

    original = gpt2.build_gpt2

    def build(m, dtype, backend=None):
        import mindspore as ms

        model = original(m, dtype, backend)
        for i, layer in enumerate(model.layers):  # a Parameter, not a Python attribute: the decoder layers share
            layer.mlp.fault_scale = ms.Parameter(ms.Tensor(0.0 if i == 1 else 1.0, ms.float32),  # one compiled
                                                 name=f"fault_scale_{i}", requires_grad=False)  # graph (lazy_inline)
        return model

    def construct(self, x):
        return self.dropout(self.down(self.act(self.up(x)))) * self.fault_scale

    monkeypatch.setattr(gpt2, "build_gpt2", build)
    monkeypatch.setattr(layers.GeluMLP, "construct", construct)
    train(tiny_cfg(dataset, "--set", "train.max_steps=15", "--set", "monitor.tensor_stats.every=5", *sets(*NO_EVAL)),
          tmp_path / "run")
    flags = [json.loads(l) for l in open(tmp_path / "run" / "stats.jsonl") if '"flag"' in l]
    vanishing = {f["name"] for f in flags if f["flag"] == "vanishing"}
    assert vanishing and all(n.startswith("layers.1.mlp") for n in vanishing), flags
    assert "layers.1.mlp.up.weight" in vanishing
    f = first_cause(diagnose(tmp_path / "run"), "stats_vanishing", "dead branch in layers.1.mlp",
                    "multiplied by zero", confidence="high")
    assert "layers.1.mlp" in f.symptom


def test_e_accumulation_without_dividing_the_loss_is_flagged(dataset, tmp_path, patched_loss):
    cfg = tiny_cfg(dataset, "--set", "train.max_steps=5", "--set", "train.micro_batch_size=2",
                   "--set", "monitor.tensor_stats.every=5", *sets(*NO_EVAL))
    accum = cfg.train.global_batch_size // cfg.train.micro_batch_size  # one rank

    def undivided(self, grad_scale, ids):  # the step passes grad_scale = loss scale / accumulation steps
        loss = cross_entropy(self.model(ids[:, :-1]), ids[:, 1:])
        return loss * grad_scale * accum, loss  # the bug: the accumulation's division undone

    patched_loss(undivided)
    train(cfg, tmp_path / "run")
    flags = [json.loads(l) for l in open(tmp_path / "run" / "stats.jsonl") if '"grad_scale_mismatch"' in l]
    assert accum == 4 and flags and "accumulation steps (4)" in flags[0]["detail"], flags
    first_cause(diagnose(tmp_path / "run"), "stats_grad_scale_mismatch", "not divided by the accumulation steps",
                confidence="high")


def test_f_slow_data_pipeline_is_diagnosed(dataset, tmp_path, monkeypatch):
    import time
    from ms_llm.data import loader

    original = loader.TrainBatches.__next__

    def slow(self):
        time.sleep(0.03)  # e.g. on-the-fly tokenization or a remote filesystem
        return original(self)

    monkeypatch.setattr(loader.TrainBatches, "__next__", slow)
    train(tiny_cfg(dataset, "--set", "train.max_steps=60", *sets(*NO_EVAL)), tmp_path / "run")
    f = first_cause(diagnose(tmp_path / "run"), "data_wait", "reader threads")
    assert "waiting for data" in f.symptom and any("data.num_workers" in a for a in f.actions)


def test_g_a_corrupt_token_in_a_batch_is_caught_before_the_forward(dataset, tmp_path, monkeypatch):
    import mindspore as ms
    from ms_llm.data import loader
    from ms_llm.errors import UserError

    original = loader.TrainBatches.__next__
    calls = {"n": 0}

    def corrupt(self):
        batch = original(self)
        if self.shuffle:  # the training stream (validation batches are read unshuffled)
            calls["n"] += 1
        if calls["n"] == 3 and self.shuffle:  # the third step: sample 5 carries an id no vocabulary has
            a = batch.asnumpy().copy()
            a[5, 7] = 10_000
            return ms.Tensor(a)
        return batch

    monkeypatch.setattr(loader.TrainBatches, "__next__", corrupt)
    with pytest.raises(UserError) as e:
        train(tiny_cfg(dataset, "--set", "train.max_steps=10"), tmp_path / "run")
    assert "step 3" in str(e.value) and "sample 5, position 7" in str(e.value) and "10000" in str(e.value)


def test_h_fp32_vs_fp16_comparison_names_the_first_divergent_layer(dataset, tmp_path, capsys):
    from ms_llm.checkpoint import store

    run = tmp_path / "run"  # trained, dumped and compared in this process (the commands' output is the point)
    train(tiny_cfg(dataset, "--set", "train.max_steps=10"), run)
    directory = store.rank_dir(str(run), 0)
    step, manifest = store.newest_valid(directory)
    arrays = store.read_tensors(store.checkpoint_path(directory, manifest))
    arrays["layers.1.attention.qkv.weight"] = arrays["layers.1.attention.qkv.weight"] * 2000  # fp16 scores overflow
    store.save(directory, step + 1, arrays, {k: manifest[k] for k in ("consumed_samples", "epoch", "config")})
    for name, dtype in (("fp32", "float32"), ("fp16", "float16")):
        assert main(["debug", "dump", "--run-dir", str(run), "--output", str(run / "dumps" / name),
                     "--set", f"precision.compute_dtype={dtype}"]) == 0
    capsys.readouterr()
    assert main(["compare", str(run / "dumps" / "fp32"), str(run / "dumps" / "fp16")]) == 0
    out = capsys.readouterr().out
    first = [l for l in out.splitlines() if l.startswith("first divergence")][0]
    assert "layers.1.attention" in first, out
    assert not any(l.startswith("! layers.0") for l in out.splitlines())  # layer 0 agrees within tolerance
    main(["compare", str(run / "dumps" / "fp32"), str(run / "dumps" / "fp32")])
    assert "no divergence" in capsys.readouterr().out
