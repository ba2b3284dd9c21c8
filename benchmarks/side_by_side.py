"""ms_llm vs PyTorch eager on the quickstart model, alternating runs on the same machine.

  python benchmarks/side_by_side.py --rounds 3

Each round runs `ms-llm benchmark --config configs/shakespeare_char.yaml --json` and
`benchmarks/pytorch_reference.py` (speed only) back to back, so both see the same machine state; the
ratio of medians over rounds is printed. Needs `pip install torch==2.13.0`.
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def last_json(text):
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"no JSON result in output:\n{text[-2000:]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "shakespeare_char.yaml"))
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()
    env = dict(os.environ, GLOG_v="3")
    ours, theirs = [], []
    for r in range(args.rounds):
        cmd = [sys.executable, "-m", "ms_llm.cli", "benchmark", "--config", args.config, "--steps", str(args.steps),
               "--json"] + [x for o in args.overrides for x in ("--set", o)]
        a = last_json(subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, check=True).stdout)
        b = last_json(subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "pytorch_reference.py"),
                                      "--steps", str(args.steps + 10), "--eval-every", "0"], cwd=ROOT,
                                     capture_output=True, text=True, env=env, check=True).stdout)
        ours.append(a["tokens_per_s"])
        theirs.append(b["tokens_per_s"])
        print(f"round {r + 1}: ms_llm {a['tokens_per_s']:,.0f} tok/s ({a['ms_per_step']:.1f} ms/step)  "
              f"pytorch {b['tokens_per_s']:,.0f} tok/s ({b['ms_per_step']:.1f} ms/step)  "
              f"ratio {a['tokens_per_s'] / b['tokens_per_s']:.2f}", flush=True)
    ratio = np.median(ours) / np.median(theirs)
    print(json.dumps({"ms_llm_tokens_per_s": float(np.median(ours)), "pytorch_tokens_per_s": float(np.median(theirs)),
                      "ratio": float(ratio), "rounds": args.rounds}))


if __name__ == "__main__":
    main()
