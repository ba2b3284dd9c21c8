"""Greedy generation: ms_llm's KV cache (ms_llm.generate) against transformers' `generate` on the same model,
alternating rounds in one process on the same machine: tokens/s of each and whether their tokens are identical.

  python benchmarks/generate_speed.py                       # a ~30M-parameter Qwen2 layout, 256 tokens after 32
  python benchmarks/generate_speed.py --family gpt2 --hidden 128 --layers 4 --heads 4 --vocab 66 --context 64 \\
         --prompt 8 --new 56                                # the quickstart's shape
  python benchmarks/generate_speed.py --composed            # also ms_llm decoding with the composition

The model is a random transformers model (weights redrawn so that its greedy path is no near-tie), saved with
save_pretrained and converted in memory the way `ms-llm eval --hf` converts it. Both sides generate --batch
sequences (different prompts of the same length) greedily for --new tokens; transformers with its own KV cache
(use_cache, the default), ms_llm with its cache and the argmax in the decode graph. Each side is warmed up once
(ms_llm compiles its prefill and decode graphs there); then --rounds alternating timed runs, and the ratio of the
medians. Both use every core (torch's and MindSpore's default threads; `--threads N` sets both). Each round prints the cores other processes
kept busy meanwhile (the host's busy time less this process's own): a ratio measured beside other work is not a
quiet machine's. ms_llm's time per token is split into the prefill, the decode graphs and the host's work
between them. `--composed` adds a third side to every round: ms_llm decoding with the composition of MindSpore ops
(what runs on every backend but CPU) in place of the fused CPU decode kernel, its greedy tokens checked too. Needs
torch and transformers.
"""
import argparse
import inspect
import os
import resource
import statistics
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def build(args, folder):
    import torch
    import transformers

    if args.family == "gpt2":
        config = transformers.GPT2Config(n_embd=args.hidden, n_layer=args.layers, n_head=args.heads,
                                         vocab_size=args.vocab, n_positions=args.context, eos_token_id=None,
                                         bos_token_id=None)
    else:
        config = transformers.Qwen2Config(hidden_size=args.hidden, intermediate_size=args.hidden * 11 // 4,
                                          num_hidden_layers=args.layers, num_attention_heads=args.heads,
                                          num_key_value_heads=max(1, args.heads // 4), vocab_size=args.vocab,
                                          max_position_embeddings=args.context, eos_token_id=None,
                                          bos_token_id=None, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.endswith(("norm.weight", "ln_1.weight", "ln_2.weight", "ln_f.weight")):
                p.copy_(p * 4)
    model.save_pretrained(folder)
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", choices=("qwen2", "gpt2"), default="qwen2")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--composed", action="store_true", help="also time ms_llm decoding with the composition")
    ap.add_argument("--threads", type=int, default=0, help="threads of both frameworks (default: each one's own)")
    args = ap.parse_args()
    os.environ.setdefault("GLOG_v", "3")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)

    from ms_llm.eval.source import LoadedModel, build as build_ours, context_config, setup
    from ms_llm.config import from_dict
    from ms_llm.config.validate import validate_config
    from ms_llm.diagnose.measure import HostMeter
    from ms_llm.generate import Generator, next_token
    from ms_llm.interop import huggingface as hf

    with tempfile.TemporaryDirectory() as folder:
        theirs = build(args, folder)
        hf_cfg = hf.read_hf_config(folder)
        cfg = validate_config(from_dict({"model": hf.model_section(hf_cfg), "train": {"seed": 0},
                                         "context": {"num_threads": args.threads or None}}))
        setup(cfg.context)
        cfg, context = context_config(cfg, None)
        tensors, _ = hf.read_hf_tensors(folder)
        model = build_ours(cfg, hf.hf_to_ours(tensors, cfg.model, hf.detect_prefix(tensors, cfg.model.arch)), folder)
    n_params = sum(p.numel() for p in theirs.parameters())
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, args.vocab, args.prompt).tolist() for _ in range(args.batch)]
    generators = {"ms_llm": Generator(model, context, args.batch)}
    if args.composed:
        generators["ms_llm composed"] = Generator(model, context, args.batch, fused_decode=False)
    phases = {name: PhaseTimer(g) for name, g in generators.items()}

    # greedy in the graph (choose=None); an older generator (a before/after split) takes a host-side choice
    in_graph = inspect.signature(Generator.generate).parameters["choose"].default is None
    choose = None if in_graph else (lambda _, logits: next_token(logits))

    def ours(generator):
        return lambda: generator.generate(prompts, args.new, choose)

    def run_theirs():
        with torch.no_grad():
            ids = torch.tensor(prompts)  # no padding: the mask says so (a token 0 would otherwise read as padding)
            out = theirs.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new,
                                  min_new_tokens=args.new,
                                  do_sample=False, pad_token_id=0)
        return out[:, args.prompt:].tolist()

    print(f"{args.family}: {n_params / 1e6:.1f}M parameters, context {context}, batch {args.batch}, {args.new} new "
          f"tokens after {args.prompt}; torch {torch.__version__} ({torch.get_num_threads()} threads)", flush=True)
    sides = {name: ours(g) for name, g in generators.items()}
    sides["transformers"] = run_theirs
    tokens = {}
    for name, fn in sides.items():
        t0 = time.perf_counter()
        tokens[name] = fn()
        if name != "transformers":
            print(f"{name} warm-up (compiles prefill + decode): {time.perf_counter() - t0:.1f} s", flush=True)
    speeds, others = {name: [] for name in sides}, []
    for r in range(args.rounds):
        for name, fn in sides.items():
            if name in phases:
                phases[name].reset()
            with HostMeter(own=resource.RUSAGE_SELF) as host:
                t0 = time.perf_counter()
                n = sum(map(len, fn()))
                s = n / (time.perf_counter() - t0)
            speeds[name].append(s)
            others.append(host.other)
            split = f" ({phases[name].line(args.new)})" if name in phases else ""
            print(f"round {r + 1} {name}: {s:,.1f} tokens/s{split}; other processes on "
                  f"{'?' if host.other is None else f'{host.other:.2f}'} cores", flush=True)
    med = {k: statistics.median(v) for k, v in speeds.items()}
    known = [o for o in others if o is not None]
    print("median tokens/s: " + ", ".join(f"{k} {med[k]:,.1f} ({min(v):,.1f}-{max(v):,.1f})" for k, v in speeds.items())
          + "; ratio " + ", ".join(f"{k} {med[k] / med['transformers']:.2f}x" for k in generators)
          + f"; other processes on {statistics.median(known) if known else float('nan'):.2f} cores (median)")
    for name in generators:
        print(f"greedy tokens identical, {name} and transformers: {tokens[name] == tokens['transformers']}")


class PhaseTimer:
    """Wall time of the generator's prefill and decode graphs (each call waited for: its first output is read);
    the rest of a generation is the host's work between graph calls. Works on a generator whose graphs return
    the cache beside the logits too (an older ms_llm's), to split the time per token of both the same way."""

    def __init__(self, generator):
        self.seconds = {"prefill": 0.0, "decode": 0.0}
        for attr, phase in (("prefill", "prefill"), ("step", "decode"), ("greedy_step", "decode")):
            if hasattr(generator, attr):
                setattr(generator, attr, self.timed(getattr(generator, attr), phase))
        self.t0 = time.perf_counter()

    def timed(self, cell, phase):
        def call(*args):
            t0 = time.perf_counter()
            out = cell(*args)
            (out[0] if isinstance(out, tuple) else out).asnumpy()  # graphs run asynchronously: wait for this one
            self.seconds[phase] += time.perf_counter() - t0
            return out
        return call

    def reset(self):
        self.seconds = dict.fromkeys(self.seconds, 0.0)
        self.t0 = time.perf_counter()

    def line(self, new_tokens):
        total = time.perf_counter() - self.t0
        graphs = sum(self.seconds.values())
        return (f"per token {total / new_tokens * 1e3:.2f} ms: prefill {self.seconds['prefill'] / new_tokens * 1e3:.2f}, "
                f"decode graphs {self.seconds['decode'] / new_tokens * 1e3:.2f}, host {(total - graphs) / new_tokens * 1e3:.2f}")

if __name__ == "__main__":
    main()
