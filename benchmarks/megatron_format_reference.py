"""The quickstart trained by plain PyTorch (benchmarks/pytorch_reference.py's GPT and recipe), its log printed
in Megatron-LM's training_log format: a log that `ms-llm compare-curves` reads as another framework's, for the
migration check (the loss curves of two frameworks training the same model, side by side).

It is NOT a Megatron-LM run: the model, optimizer and schedule are pytorch_reference.py's (the quickstart's
shape and recipe); only the lines follow Megatron-LM's format (megatron/training/training.py `training_log` and
`evaluate_and_print_results`, arguments.py `_print_args`, at NVIDIA/Megatron-LM d98e8a6), so that the Megatron
reader is what reads it. The loss of each line is the mean over its log interval, as Megatron and ms_llm log it.

  python benchmarks/megatron_format_reference.py --steps 300 --log-interval 50 > /tmp/ref/megatron.log
  ms-llm train --config configs/shakespeare_char.yaml --set train.max_steps=300 --run-dir /tmp/x
  ms-llm compare-curves /tmp/x /tmp/ref/megatron.log

PyTorch is not a dependency of ms_llm: `pip install torch` to run this.
"""
import argparse
import math
import os
import sys
import time
from datetime import datetime

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_reference import GPT, ROOT, lr_at, read_split  # noqa: E402


def print_args(args):
    """The argument dump Megatron prints at the top of its log: '  name ..... value', sorted."""
    print("------------------------ arguments ------------------------", flush=True)
    rows = ["  {} {} {}".format(k, "." * (48 - len(k)), v) for k, v in args.items()]
    for row in sorted(rows, key=str.lower):
        print(row)
    print("-------------------- end of arguments ---------------------", flush=True)


def training_line(iteration, total, consumed, ms, lr, batch, loss, grad_norm):
    return (f" [{datetime.now().strftime('%Y-%m-%d %H:%M:%S.%f')}]"
            + " iteration {:8d}/{:8d} |".format(iteration, total)
            + " consumed samples: {:12d} |".format(consumed)
            + " elapsed time per iteration (ms): {:.1f} |".format(ms)
            + f" learning rate: {lr:.6E} |"
            + f" global batch size: {batch:5d} |"
            + " {}: {:.6E} |".format("lm loss", loss)
            + f" loss scale: {1.0:.1f} |"
            + f" grad norm: {grad_norm:.3f} |"
            + " number of skipped iterations: {:3d} |".format(0)
            + " number of nan iterations: {:3d} |".format(0))


def validation_lines(iteration, value):
    string = f" validation loss at iteration {iteration} on validation set | "
    string += "{} value: {:.6E} | ".format("lm loss", value)
    string += "{} PPL: {:.6E} | ".format("lm loss", math.exp(min(20, value)))
    return ["-" * (len(string) + 1), string, "-" * (len(string) + 1)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset-dir", default=os.path.join(ROOT, "data", "shakespeare_char"))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=12)
    ap.add_argument("--log-interval", type=int, default=50)
    ap.add_argument("--eval-batches", type=int, default=145, help="validation batches at the end (the quickstart's "
                                                                   "whole split: 145 batches of 12)")
    ap.add_argument("--seed", type=int, default=1337)
    args = ap.parse_args()
    torch.manual_seed(args.seed)

    from ms_llm.data.loader import RankStream
    from ms_llm.data.manifest import load_manifest

    manifest = load_manifest(args.dataset_dir)
    seq = manifest["seq_length"]
    train, val = read_split(args.dataset_dir, manifest, "train"), read_split(args.dataset_dir, manifest, "val")
    order = RankStream(len(train), 1, 0, args.seed)  # the packed samples in the order ms_llm reads them
    model = GPT(manifest["vocab_size"], seq)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.99), eps=1e-8)
    print_args({"num_layers": 4, "hidden_size": 128, "num_attention_heads": 4, "ffn_hidden_size": 512,
                "seq_length": seq, "max_position_embeddings": seq, "padded_vocab_size": manifest["vocab_size"],
                "micro_batch_size": args.batch, "global_batch_size": args.batch, "train_iters": args.steps,
                "lr": 1e-3, "min_lr": 1e-4, "lr_decay_style": "cosine", "lr_decay_iters": args.steps,
                "lr_warmup_iters": 100, "weight_decay": 0.1, "adam_beta1": 0.9, "adam_beta2": 0.99,
                "adam_eps": 1e-08, "clip_grad": 1.0, "init_method_std": 0.02, "hidden_dropout": 0.0,
                "bf16": False, "fp16": False, "log_interval": args.log_interval, "eval_interval": args.steps,
                "eval_iters": args.eval_batches, "seed": args.seed, "data_parallel_size": 1, "world_size": 1,
                "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "normalization": "LayerNorm",
                "swiglu": False, "position_embedding_type": "learned_absolute",
                "untie_embeddings_and_output_weights": False})
    print("training ...", flush=True)
    losses, t0 = [], time.perf_counter()
    for step in range(args.steps):
        b = torch.from_numpy(train[order.indices(step * args.batch, (step + 1) * args.batch)])
        lr = lr_at(step, args.steps)
        for g in opt.param_groups:
            g["lr"] = lr
        loss = F.cross_entropy(model(b[:, :-1]).flatten(0, 1), b[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
        opt.step()
        losses.append(loss.item())
        it = step + 1
        if it % args.log_interval == 0:
            ms = 1000 * (time.perf_counter() - t0) / len(losses)
            print(training_line(it, args.steps, it * args.batch, ms, lr, args.batch, float(np.mean(losses)),
                                grad_norm), flush=True)
            losses, t0 = [], time.perf_counter()
    model.eval()
    with torch.no_grad():
        vals = [F.cross_entropy(model(torch.from_numpy(val[i:i + args.batch])[:, :-1]).flatten(0, 1),
                                torch.from_numpy(val[i:i + args.batch])[:, 1:].flatten()).item()
                for i in range(0, min(len(val), args.eval_batches * args.batch), args.batch)]
    for line in validation_lines(args.steps, float(np.mean(vals))):
        print(line)
    print(f"[after training is done] datetime: {datetime.now().strftime('%Y-%m-%d %H:%M:%S')} ", flush=True)


if __name__ == "__main__":
    main()
