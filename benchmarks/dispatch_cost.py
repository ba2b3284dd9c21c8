"""Per-kernel cost of MindSpore's CPU runtime: one jitted chain of 20 element-wise kernels against one of 220;
the difference divided by 200 is what each extra kernel costs, at three tensor sizes.

  python benchmarks/dispatch_cost.py
"""
import time

import mindspore as ms
import numpy as np

ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")


def chain(n):
    @ms.jit
    def f(x):
        for _ in range(n):
            x = x * 1.0001 + 0.5
        return x

    return f


def seconds_per_call(f, x, calls=50):
    f(x).asnumpy()  # compile
    t = time.perf_counter()
    for _ in range(calls):
        y = f(x)
    y.asnumpy()
    return (time.perf_counter() - t) / calls


def main():
    for shape in [(1,), (768, 128), (768, 512)]:
        x = ms.Tensor(np.ones(shape, np.float32))
        short, long = seconds_per_call(chain(10), x), seconds_per_call(chain(110), x)
        print(f"{str(shape):>12}: {(long - short) / 200 * 1e6:6.1f} us per kernel")


if __name__ == "__main__":
    main()
