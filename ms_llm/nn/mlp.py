"""Feed-forward blocks: GELU MLP (GPT-2) and SwiGLU (Llama)."""
import mindspore as ms
from mindspore import nn

from ms_llm.nn.activations import GeluTanh, silu
from ms_llm.nn.backend import PORTABLE
from ms_llm.nn.linear import Linear


class GeluMLP(nn.Cell):
    def __init__(self, hidden, ffn, bias, init_std, out_std, dropout=0.0, compute_dtype=ms.float32,
                 backend=PORTABLE):
        super().__init__()
        self.up = Linear(hidden, ffn, bias, init_std, compute_dtype)
        self.down = Linear(ffn, hidden, bias, out_std, compute_dtype)
        self.act = GeluTanh(compute_dtype, backend)
        self.dropout = nn.Dropout(p=dropout) if dropout > 0 else nn.Identity()

    def construct(self, x):
        return self.dropout(self.down(self.act(self.up(x))))


class SiluGate(nn.Cell):
    """silu(gate) * up from the fused gate|up projection: the activation selective recompute recomputes."""

    def __init__(self, ffn):
        super().__init__()
        self.ffn = ffn

    def construct(self, gate_up):
        return silu(gate_up[..., : self.ffn]) * gate_up[..., self.ffn:]


class SwiGLU(nn.Cell):
    """down(silu(gate(x)) * up(x)); gate and up are one fused matmul."""

    def __init__(self, hidden, ffn, init_std, out_std, dropout=0.0, compute_dtype=ms.float32):
        super().__init__()
        self.gate_up = Linear(hidden, 2 * ffn, False, init_std, compute_dtype)
        self.act = SiluGate(ffn)
        self.down = Linear(ffn, hidden, False, out_std, compute_dtype)
        self.dropout = nn.Dropout(p=dropout) if dropout > 0 else nn.Identity()

    def construct(self, x):
        return self.dropout(self.down(self.act(self.gate_up(x))))
