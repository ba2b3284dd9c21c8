"""AdamW (decoupled weight decay, bias-corrected, PyTorch semantics) on float32 master weights.

Weight decay applies to matrices only (ndim >= 2): not to biases and norm gains.

The update runs through MindSpore's fused AdamWeightDecay kernel, which has no bias correction. The
correction is folded into its scalar inputs, which is exact:
    lr_t  = lr * sqrt(1 - b2^t) / (1 - b1^t)
    eps_t = eps * sqrt(1 - b2^t)
    wd_t  = wd * lr / lr_t
gives  w -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * w)  with m_hat, v_hat the bias-corrected moments.
"""
import mindspore as ms
from mindspore import Parameter, nn, ops
from mindspore.common.initializer import initializer


def decays(param):
    return len(param.shape) >= 2


class AdamW(nn.Cell):
    def __init__(self, params, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0):
        super().__init__(auto_prefix=False)
        self.params = ms.ParameterTuple(params)
        self.exp_avg = self.params.clone(prefix="adam_m", init="zeros")
        self.exp_avg_sq = self.params.clone(prefix="adam_v", init="zeros")
        self.step = Parameter(initializer(0, (), ms.int32), name="adam_step")
        self.beta1, self.beta2, self.eps = beta1, beta2, eps
        self.decay_flags = tuple(decays(p) for p in params)
        self.weight_decay = weight_decay
        self.kernel = ops.AdamWeightDecay()
        self.hyper_map = ops.HyperMap()

    def construct(self, grads, lr):
        step = self.step + 1
        ops.assign(self.step, step)
        t = step.astype(ms.float32)
        bc1 = 1.0 - ops.pow(self.beta1, t)
        bc2_sqrt = ops.sqrt(1.0 - ops.pow(self.beta2, t))
        lr_t = lr * bc2_sqrt / bc1
        eps_t = self.eps * bc2_sqrt
        wd_t = self.weight_decay * lr / lr_t
        zero = ops.zeros((), ms.float32)
        success = ()
        for i in range(len(self.params)):
            decay = wd_t if self.decay_flags[i] else zero
            out = self.kernel(self.params[i], self.exp_avg[i], self.exp_avg_sq[i], lr_t, self.beta1, self.beta2,
                              eps_t, decay, grads[i])
            success = success + (out[0],)
        return success
