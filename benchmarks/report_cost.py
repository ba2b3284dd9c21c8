"""Time and size of `ms-llm report`, as a user runs it (a fresh process, imports included), on synthetic runs:
2,000 steps and 100,000 steps, each logged at every step, with events, telemetry, per-layer statistics and a
profiled window. Targets: under 3 s for 2,000 steps, under 5 MB of HTML for 100,000.

  python benchmarks/report_cost.py [--repeat 3]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from synthetic_run import make_run  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for steps in (2_000, 100_000):
            run = make_run(os.path.join(tmp, f"run{steps}"), steps=steps, log_interval=1, stats_every=steps // 20,
                           profile=(300, 320), spike_at=steps // 2 + 1, nan_at=steps * 3 // 4)
            times = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                subprocess.run([sys.executable, "-m", "ms_llm.cli", "report", run], check=True, capture_output=True)
                times.append(time.perf_counter() - t0)
            size = os.path.getsize(os.path.join(run, "report.html"))
            print(f"{steps:>7,} steps ({steps:,} log records): ms-llm report {min(times):.2f} s best, "
                  f"{sorted(times)[len(times) // 2]:.2f} s median of {args.repeat}; HTML {size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
