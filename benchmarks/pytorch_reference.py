"""The quickstart recipe in plain PyTorch (eager, CPU): the yardstick ms_llm's speed and loss are measured against.

Same model (GPT, 4 layers, 4 heads, hidden 128, seq 64, no bias, tied embeddings, tanh-GELU), same
AdamW (betas 0.9/0.99, wd 0.1 on matrices), same clipping (1.0), same LR schedule (warmup 100, cosine
1e-3 → 1e-4 over 2000 steps), batch 12.

  --sampling random   nanoGPT's regime: every batch is 12 random windows of the token stream
  --sampling packed   ms_llm's regime: the packed MindRecord samples of data/shakespeare_char, in the
                      same shuffled order ms_llm reads them

Other shapes: --layers, --hidden, --heads, --ffn, --batch (the context is the dataset's: --dataset-dir). --family llama
is ms_llm's Llama layer in PyTorch: RMSNorm, rotary positions (the two halves of each head rotated, as Hugging Face
and ms_llm do), grouped-query attention (--kv-heads), a SwiGLU MLP whose gate and up projections are one matmul as in
ms_llm, no biases; --untied gives it its own LM head. Initialisation as ms_llm's: normal(0, 0.02), the residual
projections 0.02 / sqrt(2 layers), norms at 1. benchmarks/side_by_side.py derives all of these from an ms_llm config.

The JSON line at the end carries the cores other processes kept busy while it trained (`other_cores`).

PyTorch is not a dependency of ms_llm: `pip install torch==2.13.0` to run this.

  python benchmarks/pytorch_reference.py --steps 2000 --sampling random   # final val loss
  python benchmarks/pytorch_reference.py --steps 300 --eval-every 0       # speed only
"""
import argparse
import json
import math
import os
import resource
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

GELU = os.environ.get("REF_GELU", "tanh")  # "none" = exact erf GELU, as nanoGPT
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def residual_init(model, layers, residual=("proj.weight", "down.weight")):
    """normal(0, 0.02) for every matrix, 0.02 / sqrt(2 layers) for the projections into the residual stream."""
    for name, p in model.named_parameters():
        if p.dim() == 2:
            std = 0.02 / math.sqrt(2 * layers) if name.endswith(residual) else 0.02
            nn.init.normal_(p, 0.0, std)


class Block(nn.Module):
    def __init__(self, h, heads, ffn, eps):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(h, eps, bias=False), nn.LayerNorm(h, eps, bias=False)
        self.qkv, self.proj = nn.Linear(h, 3 * h, bias=False), nn.Linear(h, h, bias=False)
        self.up, self.down = nn.Linear(h, ffn, bias=False), nn.Linear(ffn, h, bias=False)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.down(F.gelu(self.up(self.ln2(x)), approximate=GELU))


class GPT(nn.Module):
    def __init__(self, vocab, seq, h=128, layers=4, heads=4, ffn=None, eps=1e-5):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, h), nn.Embedding(seq, h)
        self.blocks = nn.ModuleList(Block(h, heads, ffn or 4 * h, eps) for _ in range(layers))
        self.ln_f = nn.LayerNorm(h, eps, bias=False)
        residual_init(self, layers)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for blk in self.blocks:
            x = blk(x)
        return self.ln_f(x) @ self.wte.weight.T


def rope_tables(head_dim, seq, theta):
    """cos, sin (seq, head_dim) of the half-rotation layout."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(seq, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], -1)
    return angles.cos().float(), angles.sin().float()


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


class LlamaBlock(nn.Module):
    def __init__(self, h, heads, kv_heads, ffn, eps):
        super().__init__()
        self.heads, self.kv_heads, self.d = heads, kv_heads, h // heads
        self.norm1, self.norm2 = nn.RMSNorm(h, eps=eps), nn.RMSNorm(h, eps=eps)
        self.qkv = nn.Linear(h, (heads + 2 * kv_heads) * self.d, bias=False)
        self.proj = nn.Linear(heads * self.d, h, bias=False)
        self.gate_up, self.down = nn.Linear(h, 2 * ffn, bias=False), nn.Linear(ffn, h, bias=False)

    def forward(self, x, cos, sin):
        b, t, c = x.shape
        qkv = self.qkv(self.norm1(x)).view(b, t, self.heads + 2 * self.kv_heads, self.d).transpose(1, 2)
        q, k, v = qkv.split([self.heads, self.kv_heads, self.kv_heads], dim=1)
        y = F.scaled_dot_product_attention(rotate(q, cos, sin), rotate(k, cos, sin), v, is_causal=True,
                                           enable_gqa=self.kv_heads != self.heads)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class Llama(nn.Module):
    def __init__(self, vocab, seq, h, layers, heads, kv_heads, ffn, tied=True, eps=1e-5, theta=10000.0):
        super().__init__()
        self.wte = nn.Embedding(vocab, h)
        self.blocks = nn.ModuleList(LlamaBlock(h, heads, kv_heads, ffn, eps) for _ in range(layers))
        self.norm = nn.RMSNorm(h, eps=eps)
        self.head = None if tied else nn.Linear(h, vocab, bias=False)
        cos, sin = rope_tables(h // heads, seq, theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        residual_init(self, layers)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.wte(idx)
        for blk in self.blocks:
            x = blk(x, self.cos[:t], self.sin[:t])
        x = self.norm(x)
        return x @ self.wte.weight.T if self.head is None else self.head(x)


def lr_at(step, steps, warmup=100, lr=1e-3, min_lr=1e-4):
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return min_lr + 0.5 * (1 + math.cos(math.pi * min(1.0, progress))) * (lr - min_lr)


READ_SPLIT = """
import sys, numpy as np
from mindspore.mindrecord import FileReader
reader = FileReader(sys.argv[1])
rows = [item["input_ids"] for item in reader.get_next()]
reader.close()
np.save(sys.argv[2], np.stack(rows).astype(np.int64))
"""


def read_split(dataset_dir, manifest, split):
    """The split's samples, read by a child process: MindRecord needs MindSpore, whose import (~360 MiB resident)
    would otherwise count in this process's peak memory, which benchmarks/side_by_side.py compares."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.npy")
        subprocess.run([sys.executable, "-c", READ_SPLIT, os.path.join(dataset_dir, manifest["splits"][split]["file"]),
                        out], check=True, env=dict(os.environ, GLOG_v="3"))
        return np.load(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset-dir", default=os.path.join(ROOT, "data", "shakespeare_char"))
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=12)
    ap.add_argument("--sampling", choices=("random", "packed"), default="random")
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--eval-batches", type=int, default=400)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--vocab-size", type=int, default=0, help="model vocabulary (default: the dataset's); larger "
                                                                 "than the data's to measure the LM head and loss")
    ap.add_argument("--compile", action="store_true", help="the model under torch.compile (inductor; its compile "
                                                           "happens in the first steps, which are not timed)")
    ap.add_argument("--family", choices=("gpt2", "llama"), default="gpt2")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=0, help="llama: key/value heads (default: --heads)")
    ap.add_argument("--ffn", type=int, default=0, help="MLP inner width (default: 4 x hidden for gpt2; llama: "
                                                       "Llama's 8/3 x hidden rounded up to a multiple of 256)")
    ap.add_argument("--untied", action="store_true", help="llama: an LM head of its own")
    ap.add_argument("--norm-eps", type=float, default=1e-5)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    from ms_llm.data.loader import RankStream
    from ms_llm.data.manifest import load_manifest

    manifest = load_manifest(args.dataset_dir)
    seq = manifest["seq_length"]
    train, val = read_split(args.dataset_dir, manifest, "train"), read_split(args.dataset_dir, manifest, "val")
    train_stream = np.concatenate([train[0]] + [r[1:] for r in train])  # undo the one-token overlap
    val_stream = np.concatenate([val[0]] + [r[1:] for r in val])
    rng = np.random.default_rng(args.seed)
    order = RankStream(len(train), 1, 0, args.seed)

    def batch(step):
        if args.sampling == "packed":
            return torch.from_numpy(train[order.indices(step * args.batch, (step + 1) * args.batch)])
        starts = rng.integers(0, len(train_stream) - seq - 1, args.batch)
        return torch.from_numpy(np.stack([train_stream[s:s + seq + 1] for s in starts]))

    def evaluate():
        """Mean loss over eval_batches random windows of the validation split (nanoGPT's estimate_loss)."""
        vr = np.random.default_rng(0)
        model.eval()
        losses = []
        with torch.no_grad():
            for _ in range(args.eval_batches):
                starts = vr.integers(0, len(val_stream) - seq - 1, args.batch)
                b = torch.from_numpy(np.stack([val_stream[s:s + seq + 1] for s in starts]))
                losses.append(F.cross_entropy(model(b[:, :-1]).flatten(0, 1), b[:, 1:].flatten()).item())
        model.train()
        return float(np.mean(losses))

    vocab = max(args.vocab_size, manifest["vocab_size"])
    if args.family == "gpt2":
        model = GPT(vocab, seq, args.hidden, args.layers, args.heads, args.ffn, args.norm_eps)
    else:
        ffn = args.ffn or 256 * -(-int(2 * 4 * args.hidden / 3) // 256)
        model = Llama(vocab, seq, args.hidden, args.layers, args.heads, args.kv_heads or args.heads, ffn,
                      not args.untied, args.norm_eps, args.rope_theta)
    forward = torch.compile(model) if args.compile else model
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.99), eps=1e-8)
    from ms_llm.diagnose.measure import HostMeter

    times = []
    host = HostMeter(own=resource.RUSAGE_SELF)
    with host:  # the cores other processes kept busy while this trained
        train_steps(args, opt, model, forward, batch, evaluate, times)
    steady = sorted(times[min(10, len(times) - 1):])
    ms = 1e3 * float(np.median(steady))
    result = {"framework": f"pytorch {torch.__version__}" + (" compiled" if args.compile else ""),
              "threads": torch.get_num_threads(), "family": args.family,
              "parameters": sum(p.numel() for p in model.parameters()), "tokens_per_step": args.batch * seq,
              "ms_per_step": ms, "tokens_per_s": args.batch * seq / (ms / 1e3), "sampling": args.sampling,
              "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "other_cores": host.other}
    print(json.dumps(result))


def train_steps(args, opt, model, forward, batch, evaluate, times):
    """args.steps steps of the recipe, each one's time (data excluded) appended to `times`."""
    for step in range(args.steps):
        b = batch(step)
        t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps)
        loss = F.cross_entropy(forward(b[:, :-1]).flatten(0, 1), b[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
        if args.eval_every and ((step + 1) % args.eval_every == 0 or step + 1 == args.steps):
            print(f"step {step + 1}: train loss {loss.item():.4f}, val loss {evaluate():.4f}", flush=True)


if __name__ == "__main__":
    main()
