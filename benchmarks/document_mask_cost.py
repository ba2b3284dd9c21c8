"""What the block-diagonal document mask of packed fine-tuning samples costs (docs/finetuning.md).

    python benchmarks/document_mask_cost.py [--config C] [--seq-lengths 256 1024] [--batch 4] [--rounds 15]

For each sequence length: the model of the config (default: the Qwen2.5-shaped demo model of
benchmarks/finetune_shakespeare.py, 2 layers, hidden 64) compiled twice, forward + backward of the mean token loss,
once with segment ids (the document bias built in the graph, positions per conversation: what a chat run does) and
once without (plain causal attention). The two are called alternately, `rounds` times each after a warm-up, so that
load from other processes falls on both alike; the medians and their ratio are printed. The data: samples packing
conversations of 60-200 tokens, as the demo's chat data does.
"""
import argparse
import os
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def packed_segments(batch, length, rng):
    seg = np.zeros((batch, length), np.int32)
    for b in range(batch):
        pos, k = 0, 1
        while pos < length:
            n = int(rng.integers(60, 200))
            seg[b, pos:pos + n] = k
            pos, k = pos + n, k + 1
    return seg


def measure(cfg_path, length, batch, rounds, warmup=3):
    import mindspore as ms
    from mindspore import ops

    from model_zoo import build_model
    from ms_llm.config import load_config

    cfg = load_config(cfg_path, [f"model.seq_length={length}"])
    model = build_model(cfg.model)
    vocab = cfg.model.vocab_size
    rng = np.random.default_rng(0)
    ids = ms.Tensor(rng.integers(0, vocab, (batch, length + 1)).astype(np.int32))
    seg = ms.Tensor(packed_segments(batch, length, rng))
    params = model.trainable_params()

    def loss_with(ids, seg):
        logits = model(ids[:, :-1], seg)
        return ops.cross_entropy(logits.reshape(-1, vocab), ids[:, 1:].reshape(-1))

    def loss_without(ids):
        logits = model(ids[:, :-1])
        return ops.cross_entropy(logits.reshape(-1, vocab), ids[:, 1:].reshape(-1))

    with_mask = ms.jit(ms.value_and_grad(loss_with, None, params))
    without = ms.jit(ms.value_and_grad(loss_without, None, params))
    calls = {"document mask": lambda: with_mask(ids, seg), "causal only": lambda: without(ids)}
    for f in calls.values():
        for _ in range(warmup):
            f()[0].asnumpy()
    times = {k: [] for k in calls}
    for _ in range(rounds):
        for k, f in calls.items():
            t0 = time.perf_counter()
            f()[0].asnumpy()
            times[k].append(time.perf_counter() - t0)
    return {k: 1e3 * float(np.median(v)) for k, v in times.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="/tmp/ft_demo/base/config.yaml",
                    help="a model config (default: the demo's converted Qwen2.5-shaped model)")
    ap.add_argument("--seq-lengths", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    import mindspore as ms

    ms.set_context(mode=ms.GRAPH_MODE)
    print(f"{'seq':>6} {'batch':>6} {'causal only ms':>15} {'document mask ms':>17} {'ratio':>6}")
    for t in args.seq_lengths:
        r = measure(args.config, t, args.batch, args.rounds)
        print(f"{t:>6} {args.batch:>6} {r['causal only']:>15.1f} {r['document mask']:>17.1f} "
              f"{r['document mask'] / r['causal only']:>6.2f}", flush=True)


if __name__ == "__main__":
    main()
