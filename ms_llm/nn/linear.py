"""Linear layer: fp32 master weight, matmul in the compute dtype."""
import mindspore as ms
from mindspore import nn, ops

from ms_llm.nn.init import normal, zeros


class Linear(nn.Cell):
    """y = x @ W^T + b with W stored (out, in) in float32 and cast to `compute_dtype` for the matmul.

    The transpose is folded into MatMul(transpose_b=True) instead of a separate Transpose kernel.
    """

    def __init__(self, in_features, out_features, bias=False, init_std=0.02, compute_dtype=ms.float32):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = normal((out_features, in_features), init_std, "weight")
        self.bias = zeros((out_features,), "bias") if bias else None
        self.has_bias = bias
        self.dtype = compute_dtype
        self.matmul = ops.MatMul(transpose_b=True)

    def construct(self, x):
        shape = x.shape
        y = self.matmul(x.reshape(-1, self.in_features).astype(self.dtype), self.weight.astype(self.dtype))
        if self.has_bias:
            y = y + self.bias.astype(self.dtype)
        return y.reshape(shape[:-1] + (self.out_features,))
