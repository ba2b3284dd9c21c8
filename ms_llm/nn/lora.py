"""LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models"), applied to a built model from
outside, the way parallel strategies are: the model code knows nothing of it.

    y = x Wᵀ + b + (alpha / r) · dropout(x) Aᵀ Bᵀ        A (r, in), B (out, r); W, b frozen

A starts uniform in ±1/sqrt(in) (PEFT's kaiming_uniform with a = sqrt(5)) and B at zero, so the adapted model
starts exactly as the base model. Only A and B train: the optimizer holds moments for them alone, which is the
memory LoRA saves (`ms-llm plan` and `ms-llm benchmark` show it).

`apply_lora` turns each targeted `Linear` into a `LoRALinear` in place (its class is swapped and two parameters
are added) instead of wrapping it in a new cell: MindSpore fixes a parameter's name when its cell is attached, so
a wrapper would rename the base weights ("layers.0.attention.qkv.weight" would lose its prefix) and no checkpoint
would load. In place, the base weights keep their names and the adapters are named beside them
("layers.0.attention.qkv.lora_a", "... .lora_b").

Targets are the projections by their attribute names: `qkv` and `out` (attention; ms_llm's q, k and v are one
fused projection, so its adapter has one A shared by q, k and v and one B whose rows are theirs: rank r for the
three together, where PEFT's q_proj/k_proj/v_proj adapters would be three of rank r), `gate_up` and `down`
(Llama's MLP, gate and up fused likewise), `up` and `down` (GPT-2's MLP).
"""
import hashlib

import numpy as np
import mindspore as ms
from mindspore import Parameter, nn, ops

from ms_llm.config.schema import LORA_TARGETS as TARGETS  # noqa: F401 (the config's names for the projections)
from ms_llm.nn.layers import Linear
from ms_llm.nn.dropout import bind_dropout, dropout_site
ADAPTER_SUFFIXES = (".lora_a", ".lora_b")


def is_adapter(name):
    return name.endswith(ADAPTER_SUFFIXES)


class LoRALinear(Linear):
    """A Linear with a low-rank adapter (see the module docstring); made by `apply_lora`, never built directly."""

    def construct(self, x):
        y = super().construct(x)
        # dropout before flattening: its mask is keyed on the samples of the batch (ms_llm/nn/dropout.py)
        flat = self.lora_dropout(x.astype(self.dtype)).reshape(-1, self.in_features)
        low = self.lora_matmul(flat, self.lora_a.astype(self.dtype))  # (N, r)
        delta = self.lora_matmul(low, self.lora_b.astype(self.dtype)) * self.lora_scaling
        return y + delta.reshape(y.shape)


def init_a(name, rank, fan_in, seed):
    """A's initial values: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), drawn from (seed, parameter name), so a given
    adapter starts the same whatever else the model has."""
    key = int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little")
    bound = 1.0 / np.sqrt(fan_in)
    return np.random.default_rng(key).uniform(-bound, bound, (rank, fan_in)).astype(np.float32)


def lora_targets(model, targets):
    """[(path, Linear)] of the model's projections named in `targets`."""
    wanted = set(targets)
    return [(path, cell) for path, cell in model.cells_and_names()
            if type(cell) is Linear and path.rsplit(".", 1)[-1] in wanted]


def apply_lora(model, rank, alpha, dropout=0.0, targets=TARGETS, seed=0):
    """Add adapters to the targeted projections and freeze every other parameter. Returns the adapted paths."""
    adapted = []
    for path, cell in lora_targets(model, targets):
        cell.__class__ = LoRALinear
        cell.lora_a = Parameter(ms.Tensor(init_a(path + ".lora_a", rank, cell.in_features, seed)),
                                name=path + ".lora_a")
        cell.lora_b = Parameter(ms.Tensor(np.zeros((cell.out_features, rank), np.float32)), name=path + ".lora_b")
        cell.lora_scaling = float(alpha) / rank
        cell.lora_dropout = dropout_site(dropout)
        cell.lora_matmul = ops.MatMul(transpose_b=True)
        adapted.append(path)
    bind_dropout(model)  # the adapters' dropout sites share the model's key
    for p in model.get_parameters():
        p.requires_grad = is_adapter(p.name)
    return adapted


def merge_lora(arrays, scaling):
    """{name: array} of a model with adapters → the same model with each adapter folded into its weight,
    W + scaling · B A (float32), and the adapters removed. `scaling` = alpha / rank."""
    out = {k: v for k, v in arrays.items() if not is_adapter(k)}
    for name in arrays:
        if name.endswith(".lora_a"):
            base = name[: -len(".lora_a")]
            a = np.asarray(arrays[name], np.float32)
            b = np.asarray(arrays[base + ".lora_b"], np.float32)
            w = base + ".weight"
            out[w] = (np.asarray(out[w], np.float32) + scaling * (b @ a)).astype(np.float32)
    return out
