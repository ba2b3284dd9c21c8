"""ms_llm vs PyTorch eager on the same model, alternating runs on the same machine: tokens/s and peak memory.

  python benchmarks/side_by_side.py --rounds 3                         # the quickstart (speed)
  python benchmarks/side_by_side.py --rounds 3 --steps 20 --dataset-dir /tmp/shakespeare_256 \\
         --set model.seq_length=256 --vocab-size 32000                  # context 256, a 32k vocabulary

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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "shakespeare_char.yaml"))
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="ms_llm config override")
    ap.add_argument("--dataset-dir", help="both sides read this dataset (default: the config's)")
    ap.add_argument("--vocab-size", type=int, default=0, help="both models get this vocabulary (default: the data's)")
    ap.add_argument("--torch-compile", action="store_true", help="PyTorch's model under torch.compile (inductor)")
    args = ap.parse_args()
    env = dict(os.environ, GLOG_v="3")
    overrides = list(args.overrides)
    if args.dataset_dir:
        overrides.append(f"data.dataset_dir={args.dataset_dir}")
    if args.vocab_size:
        overrides.append(f"model.vocab_size={args.vocab_size}")
    ours_cmd = [sys.executable, "-m", "ms_llm.cli", "benchmark", "--config", args.config, "--steps", str(args.steps),
                "--json"] + [x for o in overrides for x in ("--set", o)]
    theirs_cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "pytorch_reference.py"), "--steps",
                  str(args.steps + 10), "--eval-every", "0", "--vocab-size", str(args.vocab_size)]
    if args.dataset_dir:
        theirs_cmd += ["--dataset-dir", args.dataset_dir]
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
