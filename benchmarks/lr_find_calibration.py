"""How well does `ms-llm debug lr-find` predict the best peak LR of a sweep? For each model: one range test
(200 steps) and one 300-step sweep over train.lr; then five standard readings of the range test against the
sweep's best LR, as the factor between them (1.0 = exact). This is how the suggestion rule was chosen
(docs/tuning.md, the LR range test): the reading with the smallest worst-case factor over the models.

  python benchmarks/lr_find_calibration.py --out /tmp/lrcal          # ~30 min on 2 idle cores

Finished range tests and trials are reused when the command is run again with the same --out.
"""
import argparse
import json
import math
import os
import subprocess
import sys

QUICKSTART = "configs/shakespeare_char.yaml"
MODELS = {  # name -> --set overrides of the quickstart
    "A quickstart gpt2 L4 h128": [],
    "B llama L4 h128": ["model.arch=llama"],
    "C gpt2 L6 h256": ["model.hidden_size=256", "model.num_layers=6", "model.num_heads=8"],
}
LRS = "3e-4,1e-3,3e-3,1e-2"
READINGS = {
    "lowest-loss LR (the rule)": lambda r: r["min_lr"],
    "max(steepest, lowest/10) (before)": lambda r: max(r["steepest_lr"] or 0, r["min_lr"] / 10),
    "lowest-loss LR / 3": lambda r: r["min_lr"] / 3,
    "blow-up LR / 10": lambda r: r["blowup_lr"] / 10 if r["blowup_lr"] else None,
    "sqrt(steepest x lowest)": lambda r: math.sqrt(r["steepest_lr"] * r["min_lr"]) if r["steepest_lr"] else None,
}


def ms_llm(*args):
    subprocess.run([sys.executable, "-m", "ms_llm.cli", *args], check=True)


def measure(name, sets, out):
    slug = name.split()[0]
    sets = [a for s in sets for a in ("--set", s)]
    lrf, sweep = os.path.join(out, f"lr_find_{slug}"), os.path.join(out, f"sweep_{slug}")
    if not os.path.isfile(os.path.join(lrf, "lr_find.json")):
        ms_llm("debug", "lr-find", "--config", QUICKSTART, *sets, "--output-dir", lrf)
    ms_llm("sweep", "--config", QUICKSTART, *sets, "--vary", f"train.lr={LRS}", "--steps", "300",
           "--sweep-dir", sweep)  # a sweep directory resumes: finished trials are not run again
    readings = json.load(open(os.path.join(lrf, "lr_find.json")))
    best = json.load(open(os.path.join(sweep, "sweep.json")))["best"]["values"]["train.lr"]
    return readings, best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for the range tests and sweeps")
    args = ap.parse_args()
    measured = {name: measure(name, sets, args.out) for name, sets in MODELS.items()}
    print(f"{'reading':36s}" + "".join(f"{n.split()[0]:>18s}" for n in measured) + f"{'worst':>8s}")
    for label, reading in READINGS.items():
        cells, worst = [], 0.0
        for readings, best in measured.values():
            lr = reading(readings)
            factor = max(lr / best, best / lr) if lr else math.inf
            worst = max(worst, factor)
            cells.append(f"{lr:.2g} ({factor:.1f}x)" if lr else "n/a")
        print(f"{label:36s}" + "".join(f"{c:>18s}" for c in cells) + f"{worst:>7.1f}x")
    print("sweep best: " + ", ".join(f"{n.split()[0]} {b:g}" for n, (_, b) in measured.items()))


if __name__ == "__main__":
    main()
