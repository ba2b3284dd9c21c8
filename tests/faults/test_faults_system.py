"""Faults the model's statistics, memory and logs show:

    (l) a dead ReLU-style layer          → tensor stats: zero gradients confined to layers.1.mlp, a dead branch
    (m) Adam's moments in float16        → tensor stats: dtype mismatch, the optimizer's state dtype first
    (r) a hook that keeps 4 MiB per step → memory keeps growing: a leak first, with the growth rate
    (s) an Ascend-only operator on CPU   → MindSpore's "Unsupported op" in the worker log: unsupported operator
"""
import traceback

import pytest

from faultkit import NO_EVAL, diagnose, first_cause, sets, tiny_cfg, train

pytestmark = pytest.mark.slow  # every fault here is injected into a training run


def test_l_a_dead_relu_layer_is_a_dead_branch(dataset, tmp_path, monkeypatch):
    import mindspore as ms
    from mindspore import ops

    import model_zoo.gpt2.model as gpt2
    from ms_llm.nn import layers

    original = gpt2.build_gpt2

    def build(m, dtype, backend=None):
        model = original(m, dtype, backend)
        for i, layer in enumerate(model.layers):  # a Parameter: the decoder layers share one compiled graph
            layer.mlp.dead = ms.Parameter(ms.Tensor(1.0 if i == 1 else 0.0, ms.float32), name=f"dead_{i}",
                                          requires_grad=False)
        return model

    def construct(self, x):  # layer 1: ReLU units pushed below zero by a shift, so none ever fires
        h = self.up(x)
        return self.dropout(self.down(self.act(h) * (1.0 - self.dead) + ops.relu(h - 10.0) * self.dead))

    monkeypatch.setattr(gpt2, "build_gpt2", build)
    monkeypatch.setattr(layers.GeluMLP, "construct", construct)
    train(tiny_cfg(dataset, *sets("train.max_steps=15", "monitor.tensor_stats.every=5")), tmp_path / "run")
    f = first_cause(diagnose(tmp_path / "run"), "stats_vanishing", "dead branch in layers.1.mlp", "dead relu",
                    confidence="high")
    assert f.symptom == "dead branch: zero gradients in layers.1.mlp"
    assert any("ms-llm debug dump" in a for a in f.actions)


def test_m_optimizer_state_in_float16_is_a_dtype_mismatch(dataset, tmp_path, monkeypatch):
    import mindspore as ms
    from mindspore import Parameter, ops
    from mindspore.common.initializer import initializer

    from ms_llm.train import optimizer

    init = optimizer.AdamW.__init__

    def half_state(self, params, *a, **k):  # the bug: Adam's moments created in float16
        init(self, params, *a, **k)
        self.exp_avg, self.exp_avg_sq = (ms.ParameterTuple([Parameter(initializer("zeros", p.shape, ms.float16),
                                                                      name=f"{prefix}.{p.name}") for p in params])
                                         for prefix in ("adam_m", "adam_v"))

    def construct(self, grads, lr):  # AdamW written out (the fused kernel wants one dtype)
        step = self.step + 1
        ops.assign(self.step, step)
        t = step.astype(ms.float32)
        bc1, bc2 = 1.0 - ops.pow(self.beta1, t), 1.0 - ops.pow(self.beta2, t)
        done = ()
        for i in range(len(self.params)):
            p, m, v, g = self.params[i], self.exp_avg[i], self.exp_avg_sq[i], grads[i]
            m_new = self.beta1 * m.astype(ms.float32) + (1 - self.beta1) * g
            v_new = self.beta2 * v.astype(ms.float32) + (1 - self.beta2) * g * g
            update = (m_new / bc1) / (ops.sqrt(v_new / bc2) + self.eps)
            if self.decay_flags[i]:
                update = update + self.weight_decay * p
            done = done + (ops.assign(p, p - lr * update),)
            ops.assign(m, m_new.astype(ms.float16))
            ops.assign(v, v_new.astype(ms.float16))
        return done

    monkeypatch.setattr(optimizer.AdamW, "__init__", half_state)
    monkeypatch.setattr(optimizer.AdamW, "construct", construct)
    train(tiny_cfg(dataset, *sets("train.max_steps=10", "monitor.tensor_stats.every=5")), tmp_path / "run")
    f = first_cause(diagnose(tmp_path / "run"), "stats_dtype_mismatch", "optimizer's state", "float32 master",
                    confidence="high")
    assert any("float16" in e.lower() for e in f.evidence), f.evidence


def test_r_a_leaking_hook_shows_as_growing_memory(dataset, tmp_path):
    import numpy as np

    from ms_llm.train.loop.hooks import Hook

    class Leak(Hook):  # the bug: a hook that keeps something of every step
        def __init__(self):
            self.kept = []

        def after_step(self, run, step, out, batches):
            self.kept.append(np.ones(1 << 19))  # 4 MiB: well past 10% of the process (an xdist worker holds GiBs)

    train(tiny_cfg(dataset, *sets("train.max_steps=150", *NO_EVAL)), tmp_path / "run", [Leak()])
    f = first_cause(diagnose(tmp_path / "run"), "memory_growth", "a leak", confidence="high")
    growth = float(f.symptom.split("+")[1].split(" MiB")[0])
    assert 300 < growth < 800, f.symptom  # 4 MiB x the ~130 steps between the first and last steady records
    assert any("MiB per 100 steps" in e for e in f.evidence)


def test_s_an_operator_the_device_lacks_is_named_from_the_worker_log(dataset, tmp_path, monkeypatch):
    from mindspore import ops

    from ms_llm.nn import attention

    def flash(self, q, k, v, documents=None):  # an Ascend-only fused kernel on a CPU run
        return ops.flash_attention_score(q, k, v, self.num_heads, scalar_value=self.scale, input_layout="BNSD")

    monkeypatch.setattr(attention.AttentionCore, "construct", flash)
    run = tmp_path / "run"
    with pytest.raises(Exception) as e:
        train(tiny_cfg(dataset, *sets("train.max_steps=5")), run)
    # what msrun's --log_dir holds for the worker (README: runs/<name>_logs/worker_0.log): its traceback
    logs = tmp_path / "run_logs"
    logs.mkdir()
    (logs / "worker_0.log").write_text("".join(traceback.format_exception(e.value)))
    f = first_cause(diagnose(run), "unsupported_op", "ascend-only operator", "FlashAttentionScore", "CPU",
                    confidence="high")
    assert f.severity == "error" and "FlashAttentionScore" in f.symptom
    assert any("run_logs/worker_0.log" in ev and "Unsupported op [FlashAttentionScore] on CPU" in ev
               for ev in f.evidence), f.evidence
