"""ms_llm vs PyTorch eager on the same model, alternating runs on the same machine: tokens/s and peak memory.

  python benchmarks/side_by_side.py --rounds 3                         # the quickstart (speed)
  python benchmarks/side_by_side.py --rounds 3 --layers 6 --hidden 768 --heads 12 --context 256 --batch 4
  python benchmarks/side_by_side.py --rounds 3 --family llama          # the quickstart's shape as a Llama
  python benchmarks/side_by_side.py --rounds 3 --steps 20 --context 256 --vocab-size 32000   # a 32k vocabulary

The shape options set ms_llm's config (--family: model.arch, --layers, --hidden, --heads, --kv-heads, --context:
model.seq_length, --batch: the global and micro batch); the PyTorch model (benchmarks/pytorch_reference.py) is then
built from ms_llm's resolved config, so both sides always train the same shape, including what a preset or --set
changed. What the PyTorch reference cannot build (biases, dropout, q/k norms, q/k/v biases, a sliding window, a
head size apart from hidden / heads, RoPE scaling, experts, accumulation, a compute dtype other than float32) is
refused before anything runs. A context other than the dataset's gets a dataset of that context, preprocessed once
from the config's source into data/<dataset>_<context>/.

Each round runs `ms-llm benchmark --json` and `benchmarks/pytorch_reference.py` back to back, so both see the
same machine state; the ratio of medians over rounds is printed. Peak memory is each process's maximum
resident set (`/usr/bin/time -v` where it exists, else the children's rusage), and the working memory is that
peak less what importing the framework alone costs (measured the same way, once per framework). Peak memory is
robust to a busy machine; tokens/s are not, hence the alternation, the range over rounds, and the cores other
processes kept busy during each run (the host's busy time less the benchmarked process's own), printed beside it.
Needs `pip install torch==2.13.0`.
"""
import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIME = shutil.which("time") and os.path.exists("/usr/bin/time")


def last_json(text):
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"no JSON result in output:\n{text[-2000:]}")


def run(cmd, env):
    """(stdout, peak resident MiB, other processes' cores) of one process."""
    sys.path.insert(0, ROOT)
    from ms_llm.diagnose.measure import HostMeter

    with HostMeter() as host:
        out, peak = run_alone(cmd, env)
    return out, peak, host.other


def run_alone(cmd, env):
    if TIME:
        proc = subprocess.run(["/usr/bin/time", "-v"] + cmd, cwd=ROOT, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
        peak = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr).group(1)) / 1024
        return proc.stdout, peak
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return proc.stdout, (after if after > before else float("nan")) / 1024  # only a new maximum is visible


def shape_overrides(args):
    """The ms_llm settings the shape options stand for."""
    out = []
    for flag, key in (("family", "model.arch"), ("layers", "model.num_layers"), ("hidden", "model.hidden_size"),
                      ("heads", "model.num_heads"), ("kv_heads", "model.num_kv_heads"),
                      ("context", "model.seq_length"), ("batch", "train.global_batch_size"),
                      ("batch", "train.micro_batch_size")):
        if getattr(args, flag):
            out.append(f"{key}={getattr(args, flag)}")
    return out


def reference_args(cfg):
    """pytorch_reference.py's shape options for ms_llm's resolved config; SystemExit naming what it cannot build."""
    m, t = cfg.model, cfg.train
    unsupported = [(name, value) for name, value, plain in (
        ("model.bias", m.bias, False), ("model.dropout", m.dropout, 0.0), ("model.qkv_bias", m.qkv_bias, False),
        ("model.qk_norm", m.qk_norm, False), ("model.sliding_window", m.sliding_window, None),
        ("model.head_dim", m.head_dim, None), ("model.rope_scaling", m.rope_scaling, None),
        ("model.moe", m.moe, None), ("precision.compute_dtype", cfg.precision.compute_dtype, "float32"),
        ("train.micro_batch_size", t.micro_batch_size, t.global_batch_size)) if value != plain]
    if m.arch == "gpt2" and (m.num_kv_heads or m.num_heads) != m.num_heads:
        unsupported.append(("model.num_kv_heads", m.num_kv_heads))
    if m.arch == "gpt2" and not m.tie_embeddings:
        unsupported.append(("model.tie_embeddings", m.tie_embeddings))
    if unsupported:
        raise SystemExit("the PyTorch reference builds plain GPT-2 and Llama layers only; it cannot follow "
                         + ", ".join(f"{k} = {v}" for k, v in unsupported) + ". Leave these at their defaults.")
    out = ["--family", m.arch, "--layers", str(m.num_layers), "--hidden", str(m.hidden_size), "--heads",
           str(m.num_heads), "--kv-heads", str(m.num_kv_heads or m.num_heads), "--ffn", str(m.ffn_hidden_size),
           "--batch", str(t.global_batch_size), "--norm-eps", str(m.norm_eps), "--rope-theta", str(m.rope_theta)]
    return out + ([] if m.tie_embeddings else ["--untied"])


def dataset_for(cfg, args, env):
    """The dataset both sides read: --dataset-dir, else the config's when its context is the model's, else one of
    the model's context, preprocessed from the config's source the first time (data/<name>_<context>/)."""
    from ms_llm.data.manifest import has_manifest, load_manifest

    if args.dataset_dir:
        return args.dataset_dir
    d, seq = cfg.data, cfg.model.seq_length
    base = d.dataset_dir if os.path.isabs(d.dataset_dir) else os.path.join(ROOT, d.dataset_dir)
    if has_manifest(base) and load_manifest(base)["seq_length"] == seq:
        return base
    folder = f"{base.rstrip(os.sep)}_{seq}"
    if not has_manifest(folder):
        source = d.source if os.path.isabs(d.source) else os.path.join(ROOT, d.source)
        subprocess.run([sys.executable, "-m", "ms_llm.cli", "preprocess", "--input", source, "--output-dir", folder,
                        "--seq-length", str(seq), "--tokenizer", d.tokenizer, "--val-fraction", str(d.val_fraction)],
                       cwd=ROOT, env=env, check=True, capture_output=True)
    return folder


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "shakespeare_char.yaml"))
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="ms_llm config override")
    ap.add_argument("--dataset-dir", help="both sides read this dataset (default: the config's, or one of --context)")
    ap.add_argument("--vocab-size", type=int, default=0, help="both models get this vocabulary (default: the data's)")
    ap.add_argument("--torch-compile", action="store_true", help="PyTorch's model under torch.compile (inductor)")
    ap.add_argument("--family", choices=("gpt2", "llama"), help="model.arch (default: the config's)")
    for flag, what in (("layers", "num_layers"), ("hidden", "hidden_size"), ("heads", "num_heads"),
                       ("kv-heads", "num_kv_heads"), ("context", "seq_length")):
        ap.add_argument(f"--{flag}", type=int, default=0, help=f"model.{what} (default: the config's)")
    ap.add_argument("--batch", type=int, default=0, help="train.global_batch_size = micro_batch_size")
    args = ap.parse_args()
    env = dict(os.environ, GLOG_v="3")
    sys.path.insert(0, ROOT)
    from ms_llm.config import load_config

    overrides = shape_overrides(args) + list(args.overrides)
    if args.vocab_size:
        overrides.append(f"model.vocab_size={args.vocab_size}")
    cfg = load_config(args.config, overrides)
    shape = reference_args(cfg)
    dataset = dataset_for(cfg, args, env)
    overrides.append(f"data.dataset_dir={dataset}")
    m = cfg.model
    print(f"model: {m.arch}, {m.num_layers} layers x {m.hidden_size}, {m.num_heads} heads ({m.num_kv_heads or m.num_heads}"
          f" key/value), MLP {m.ffn_hidden_size}, context {m.seq_length}, batch {cfg.train.global_batch_size}; "
          f"dataset {dataset}", flush=True)
    ours_cmd = [sys.executable, "-m", "ms_llm.cli", "benchmark", "--config", args.config, "--steps", str(args.steps),
                "--json"] + [x for o in overrides for x in ("--set", o)]
    theirs_cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "pytorch_reference.py"), "--steps",
                  str(args.steps + 10), "--eval-every", "0", "--vocab-size", str(args.vocab_size),
                  "--dataset-dir", dataset] + shape
    if args.torch_compile:
        theirs_cmd.append("--compile")
    imports = {name: run([sys.executable, "-c", f"import {name}"], env)[1] for name in ("mindspore", "torch")}
    others = []
    ours, theirs = [], []
    for r in range(args.rounds):
        out, a_peak, a_other = run(ours_cmd, env)
        a = last_json(out)
        out, b_peak, b_other = run(theirs_cmd, env)
        b = last_json(out)
        if a["parameters"] != b["parameters"]:
            raise SystemExit(f"the two models differ: ms_llm has {a['parameters']:,} parameters, the PyTorch "
                             f"reference {b['parameters']:,}")
        others += [o for o in (a_other, b_other) if o is not None]
        load = "?" if a_other is None or b_other is None else f"{a_other:.2f} / {b_other:.2f}"
        ours.append((a["tokens_per_s"], a_peak))
        theirs.append((b["tokens_per_s"], b_peak))
        print(f"round {r + 1}: ms_llm {a['tokens_per_s']:,.0f} tok/s, peak {a_peak:,.0f} MiB   pytorch "
              f"{b['tokens_per_s']:,.0f} tok/s, peak {b_peak:,.0f} MiB   speed ratio "
              f"{a['tokens_per_s'] / b['tokens_per_s']:.2f}   other processes on {load} cores", flush=True)
    ratios = [a[0] / b[0] for a, b in zip(ours, theirs)]
    peak_a, peak_b = max(p for _, p in ours), max(p for _, p in theirs)
    work_a, work_b = peak_a - imports["mindspore"], peak_b - imports["torch"]
    print(f"import alone: mindspore {imports['mindspore']:,.0f} MiB, torch {imports['torch']:,.0f} MiB; working memory "
          f"(peak - import): ms_llm {work_a:,.0f} MiB, pytorch {work_b:,.0f} MiB, ratio {work_a / work_b:.2f}")
    print(json.dumps({"ms_llm_tokens_per_s": float(np.median([a for a, _ in ours])),
                      "pytorch_tokens_per_s": float(np.median([b for b, _ in theirs])),
                      "ratio": float(np.median([a for a, _ in ours]) / np.median([b for b, _ in theirs])),
                      "ratio_range": [min(ratios), max(ratios)], "rounds": args.rounds,
                      "ms_llm_peak_mib": peak_a, "pytorch_peak_mib": peak_b, "import_mib": imports,
                      "working_memory_ratio": work_a / work_b,
                      "other_cores_median": float(np.median(others)) if others else None}))


if __name__ == "__main__":
    main()
