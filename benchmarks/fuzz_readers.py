"""The fuzz properties of tests/fuzz (every reader of a user's file: it reads, or it refuses in one paragraph that
names the file) with a large budget, reporting per reader how many damaged inputs read, how many were refused,
and each distinct failure (exception type and where it was raised, with the first input that raised it).

    python benchmarks/fuzz_readers.py [--examples 2000] [--only safetensors] [--seed 0] [--max-seconds 600]

The fast tier runs each property with tests/fuzz/fuzzing.py's FAST_EXAMPLES; this runs --examples of each (at most
--max-seconds per reader). Exit 1 when any reader failed.
"""
import argparse
import collections
import importlib
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "fuzz"))
sys.path.insert(0, os.path.join(ROOT, "tests"))
os.environ.setdefault("GLOG_v", "3")

from hypothesis import HealthCheck, given, seed as fixed_seed, settings  # noqa: E402

from fuzzing import NO_SHRINK, run_once  # noqa: E402

FAMILIES = ("test_fuzz_checkpoints", "test_fuzz_configs", "test_fuzz_tokenizers", "test_fuzz_data",
            "test_fuzz_rundir")


class OutOfTime(Exception):
    pass


def where(e):
    frame = traceback.extract_tb(e.__traceback__)[-1]
    return f"{type(e).__name__} at {os.path.relpath(frame.filename, ROOT)}:{frame.lineno}"


def fuzz(name, prop, examples, seed, max_seconds, echo):
    counts, failures = collections.Counter(), {}
    start = time.perf_counter()
    slowest = [0.0]

    @fixed_seed(seed)
    @settings(max_examples=examples, deadline=None, database=None, phases=NO_SHRINK,
              suppress_health_check=list(HealthCheck))
    @given(value=prop.strategy)
    def one(value):
        if time.perf_counter() - start > max_seconds:
            raise OutOfTime
        t = time.perf_counter()
        try:
            counts[run_once(prop, value)] += 1
        except Exception as e:  # noqa: BLE001 (any exception but a UserError is what this looks for)
            key = where(e)
            counts["failed"] += 1
            failures.setdefault(key, (repr(value)[:400], f"{type(e).__name__}: {str(e)[:300]}"))
        slowest[0] = max(slowest[0], time.perf_counter() - t)
        done = sum(counts.values())
        if done % max(1, examples // 10) == 0:
            echo(f"  {name}: {done}/{examples} ({time.perf_counter() - start:.0f} s)")

    try:
        one()
    except OutOfTime:
        echo(f"  {name}: stopped after {max_seconds} s")
    return counts, failures, time.perf_counter() - start, slowest[0]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--examples", type=int, default=2000, help="damaged inputs per reader")
    p.add_argument("--only", default="", help="readers whose name contains this")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-seconds", type=float, default=600, help="time limit per reader")
    args = p.parse_args(argv)
    rows, failed = [], 0
    for family in FAMILIES:
        module = importlib.import_module(family)
        for name, prop in module.PROPERTIES.items():
            if args.only not in name:
                continue
            print(f"{name} ({family}.py): {args.examples} examples", flush=True)
            counts, failures, seconds, slowest = fuzz(name, prop, args.examples, args.seed, args.max_seconds,
                                                       lambda m: print(m, flush=True))
            rows.append((name, counts, seconds, slowest))
            for key, (value, error) in failures.items():
                failed += 1
                print(f"  FAIL {key}\n    {error}\n    input: {value}", flush=True)
    print(f"\n{'reader':40} {'examples':>8} {'read':>6} {'refused':>8} {'failed':>7} {'seconds':>8} {'slowest':>8}")
    for name, c, seconds, slowest in rows:
        print(f"{name:40} {sum(c.values()):8d} {c['read']:6d} {c['refused']:8d} {c['failed']:7d} {seconds:8.1f} "
              f"{slowest:8.3f}")
    print(f"\n{failed} distinct failure(s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
