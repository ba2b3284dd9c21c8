"""What routing costs: `ms-llm benchmark` of a mixture-of-experts model (8 experts, top-2) against the same model with
every expert computing every token (model.moe.dispatch: dense), against a dense model with the same active
parameters (an MLP k experts wide), and with the capacity mode. Each variant runs in its own process, so its peak
memory (process RSS on CPU) is its own; variants are interleaved over --rounds rounds and each reports its median.

  python benchmarks/moe_dispatch.py [--rounds 2] [--steps 20] [--set key=value ...]

The model: the quickstart's Llama-style layer, 4 layers, hidden 128, experts 256 wide, on the bundled Shakespeare
data (batch 12 × 64 tokens). Results and their reading: docs/moe.md ("What routing costs").
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = ["model.arch=llama", "model.num_layers=4", "model.hidden_size=128", "model.num_heads=4", "train.lr=1e-3",
        "context.compile_cache=false"]
EXPERTS, TOP_K, EXPERT_FFN = 8, 2, 256
VARIANTS = {
    "moe, dropless (sorted)": [f"model.ffn_hidden_size={EXPERT_FFN}",
                               f"model.moe={{num_experts: {EXPERTS}, top_k: {TOP_K}}}"],
    "moe, capacity 1.25 (sorted)": [f"model.ffn_hidden_size={EXPERT_FFN}",
                                    f"model.moe={{num_experts: {EXPERTS}, top_k: {TOP_K}, capacity_factor: 1.25}}"],
    "(a) moe, every expert dense": [f"model.ffn_hidden_size={EXPERT_FFN}",
                                    f"model.moe={{num_experts: {EXPERTS}, top_k: {TOP_K}, dispatch: dense}}"],
    "(b) dense, same active params": [f"model.ffn_hidden_size={TOP_K * EXPERT_FFN}"],
}


def run(sets, steps):
    cmd = [sys.executable, "-m", "ms_llm.cli", "benchmark", "--config", os.path.join(ROOT, "configs",
                                                                                      "shakespeare_char.yaml"),
           "--steps", str(steps), "--warmup", "3", "--json"]
    for s in BASE + sets:
        cmd += ["--set", s]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, GLOG_v="3"))
    if out.returncode:
        raise SystemExit(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--set", action="append", default=[], dest="extra")
    args = ap.parse_args()
    results = {name: [] for name in VARIANTS}
    for _ in range(args.rounds):
        for name, sets in VARIANTS.items():
            results[name].append(run(sets + args.extra, args.steps))
    print(f"| variant | parameters | active | tokens/s | ms/step | peak memory (GiB) |\n|---|---:|---:|---:|---:|---:|")
    for name, rs in results.items():
        r = rs[0]
        print(f"| {name} | {r['parameters']:,} | {r.get('active_parameters', r['parameters']):,} | "
              f"{statistics.median(x['tokens_per_s'] for x in rs):,.0f} | "
              f"{statistics.median(x['ms_per_step'] for x in rs):.1f} | "
              f"{statistics.median(x['peak_mem_gib'] for x in rs):.2f} |")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
