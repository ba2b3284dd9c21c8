"""MindSpore's Cell.recompute() on the CPU backend: memory of a training step with an inner cell recomputed, and the
workaround ms_llm uses (a custom bprop that recomputes once the backward reaches it).

  python benchmarks/cpu_recompute_memory.py            # all three variants, each in a fresh process

A stack of L blocks; each block's inner cell is attention's core: p = softmax(q kᵀ); y = p v, with q, k, v
from one projection. Without recompute the backward keeps every block's p, (B, H, T, T). With
`inner.recompute()` MindSpore should keep only q, k, v and rebuild p in the backward. On CPU (MindSpore 2.10)
the step's peak grows instead. The workaround is a Cell whose `bprop` recomputes p and whose first op
depends on the incoming gradient (ops.depend(q, dout)); without that dependency the runtime runs the
recomputation as soon as q and k exist, in the forward pass, and keeps it as long as the p it replaces.

Printed: the step's growth of the resident set over the compiled state (MiB), from VmHWM (Linux).
"""
import ctypes
import os
import subprocess
import sys

import numpy as np

B, H, T, D, L = 8, 4, 256, 32, int(os.environ.get("BLOCKS", 4))


def measure(variant):
    import mindspore as ms
    from mindspore import Parameter, nn, ops

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")

    mask = ms.Tensor(np.triu(np.full((T, T), -1e9, np.float32), 1))

    class Core(nn.Cell):
        def __init__(self):
            super().__init__()
            self.qk, self.pv, self.softmax = ops.BatchMatMul(transpose_b=True), ops.BatchMatMul(), ops.Softmax(-1)

        def construct(self, q, k, v):
            return self.pv(self.softmax(self.qk(q, k) + mask), v)

    class CoreRecomputedInBprop(Core):
        def bprop(self, q, k, v, out, dout):
            if variant == "custom bprop":
                q = ops.depend(q, dout)  # the workaround: recompute when the backward arrives here
            p = self.softmax(self.qk(q, k) + mask)
            dp = ops.BatchMatMul(transpose_b=True)(dout, v)
            ds = p * (dp - (dp * p).sum(-1, keepdims=True))
            return self.pv(ds, k), ops.BatchMatMul(transpose_a=True)(ds, q), ops.BatchMatMul(transpose_a=True)(p, dout)

    class Block(nn.Cell):
        def __init__(self, i):
            super().__init__()
            self.w = Parameter(ms.Tensor(np.random.default_rng(i).standard_normal((3 * D, D)).astype(np.float32) * 0.1),
                               name=f"w{i}")
            self.core = CoreRecomputedInBprop() if variant.startswith("custom bprop") else Core()
            if variant == "Cell.recompute()":
                self.core.recompute()

        def construct(self, x):  # x (B, H, T, D)
            qkv = ops.matmul(x, self.w.T)
            return x + self.core(qkv[..., :D], qkv[..., D:2 * D], qkv[..., 2 * D:])

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.blocks = nn.CellList([Block(i) for i in range(L)])

        def construct(self, x):
            for b in self.blocks:
                x = b(x)
            return (x * x).mean()

    class Step(nn.Cell):
        def __init__(self):
            super().__init__()
            self.net = Net()
            self.grad = ms.value_and_grad(self.net, None, self.net.trainable_params())

        def construct(self, x):
            return self.grad(x)

    step = Step()
    x = ms.Tensor(np.random.default_rng(9).standard_normal((B, H, T, D)).astype(np.float32))
    step.compile(x)
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    rss = status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM
    for _ in range(3):
        loss, grads = step(x)
        loss.asnumpy()
    return (status("VmHWM") - rss) / 2 ** 20, float(loss.asnumpy()), [g.asnumpy() for g in grads]


def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))


def main():
    if len(sys.argv) > 1:
        mib, loss, grads = measure(sys.argv[1])
        print(f"{mib:.1f} {loss:.6f} {sum(float(np.abs(g).sum()) for g in grads):.6f}")
        return
    p = B * H * T * T * 4 / 2 ** 20
    print(f"{L} blocks, softmax probabilities {p:.0f} MiB each; peak of 3 steps over the compiled state:")
    for variant in ("no recompute", "Cell.recompute()", "custom bprop, no depend", "custom bprop"):
        out = subprocess.run([sys.executable, __file__, variant], capture_output=True, text=True,
                             env=dict(os.environ, GLOG_v="3")).stdout.split()
        print(f"  {variant:<24} {float(out[0]):7.1f} MiB   loss {out[1]}   sum |grad| {out[2]}")


if __name__ == "__main__":
    main()
