"""Feed-forward blocks: GELU MLP (GPT-2) and SwiGLU (Llama)."""
import mindspore as ms
from mindspore import nn, ops

from ms_llm.nn.activations import GeluTanh, silu
from ms_llm.nn.backend import PORTABLE
from ms_llm.nn.linear import Linear
from ms_llm.nn.dropout import dropout_site


class GeluDown(nn.Cell):
    """down(gelu(u)) without keeping gelu(u): the backward recomputes it from u (selective recompute with the
    fused CPU kernels; float32). Inputs: u (rows, ffn), the down projection's weight (hidden, ffn)."""

    def __init__(self, backend):
        super().__init__()
        self.gelu = backend.kernel("gelu_tanh")
        self.gelu_grad = backend.kernel("gelu_tanh_grad")
        self.matmul = ops.MatMul(transpose_b=True)
        self.grad_x = ops.MatMul()
        self.grad_w = ops.MatMul(transpose_a=True)

    def construct(self, u, weight):
        return self.matmul(self.gelu(u), weight)

    def bprop(self, u, weight, out, dout):
        u = ops.depend(u, dout)  # recompute in the backward, not as soon as u exists (see ProbsRecomputedCore)
        return self.gelu_grad(u, self.grad_x(dout, weight)), self.grad_w(dout, self.gelu(u))


class GeluMLP(nn.Cell):
    def __init__(self, hidden, ffn, bias, init_std, out_std, dropout=0.0, compute_dtype=ms.float32,
                 backend=PORTABLE):
        super().__init__()
        self.up = Linear(hidden, ffn, bias, init_std, compute_dtype)
        self.down = Linear(ffn, hidden, bias, out_std, compute_dtype)
        self.act = GeluTanh(compute_dtype, backend)
        self.act_down = GeluDown(backend) if self.act.fused else None
        self.dropout = dropout_site(dropout)

    def construct(self, x):
        if self.act.recompute_output:  # selective recompute: GELU's output is rebuilt in the backward
            u = self.up(x)
            y = self.act_down(u.reshape(-1, u.shape[-1]), self.down.weight)
            if self.down.has_bias:
                y = y + self.down.bias
            return self.dropout(y.reshape(x.shape[:-1] + (y.shape[-1],)))
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
        self.dropout = dropout_site(dropout)

    def construct(self, x):
        return self.dropout(self.down(self.act(self.gate_up(x))))
