"""Score a nanoGPT shakespeare_char checkpoint the way ms_llm scores its quickstart: mean loss over the whole
validation split, in non-overlapping windows of `block_size`. nanoGPT's own printout averages only
`eval_iters` random batches (20 in its README's CPU command); this also prints that estimate, for a few
seeds, to show how far it can wander.

nanoGPT is not part of ms_llm. To reproduce the comparison in docs/performance.md:

  git clone https://github.com/karpathy/nanoGPT /tmp/nanogpt && cd /tmp/nanogpt
  cp <ms_llm>/data/tinyshakespeare.txt data/shakespeare_char/input.txt
  python data/shakespeare_char/prepare.py
  python train.py config/train_shakespeare_char.py --device=cpu --compile=False --eval_iters=20 \
      --log_interval=1 --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 \
      --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0           # its README's CPU recipe
  python <ms_llm>/benchmarks/nanogpt_full_val.py --nanogpt /tmp/nanogpt --ckpt out-shakespeare-char/ckpt.pt
"""
import argparse
import os
import sys

import numpy as np
import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nanogpt", required=True, help="nanoGPT checkout (its model.py and data/ are used)")
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--random-batches", type=int, nargs="*", default=[20, 400])
    args = ap.parse_args()
    sys.path.insert(0, args.nanogpt)
    from model import GPT, GPTConfig  # nanoGPT's

    ck = torch.load(args.ckpt, map_location="cpu")
    model = GPT(GPTConfig(**ck["model_args"]))
    model.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in ck["model"].items()})
    model.eval()
    block = ck["model_args"]["block_size"]
    val = np.memmap(os.path.join(args.nanogpt, "data", "shakespeare_char", "val.bin"), dtype=np.uint16, mode="r")

    def loss_at(starts):
        x = torch.stack([torch.from_numpy(val[i:i + block].astype(np.int64)) for i in starts])
        y = torch.stack([torch.from_numpy(val[i + 1:i + 1 + block].astype(np.int64)) for i in starts])
        return model(x, y)[1].item()

    with torch.no_grad():
        starts = np.arange(0, len(val) - block - 1, block)
        chunks = [starts[i:i + 64] for i in range(0, len(starts), 64)]
        full = sum(loss_at(c) * len(c) for c in chunks) / len(starts)
        print(f"whole validation split ({len(starts)} windows of {block}): {full:.4f}")
        for n in args.random_batches:
            estimates = []
            for seed in range(5):
                g = torch.Generator().manual_seed(seed)
                estimates.append(np.mean([loss_at(torch.randint(len(val) - block, (12,), generator=g))
                                          for _ in range(n)]))
            print(f"{n} random batches of 12, 5 draws: " + " ".join(f"{e:.4f}" for e in estimates))


if __name__ == "__main__":
    main()
