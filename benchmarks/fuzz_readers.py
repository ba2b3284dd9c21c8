"""The fuzz properties of tests/fuzz (every reader of a user's file: it reads, or it refuses in one paragraph that
names the file) with a large budget, reporting per reader how many damaged inputs read, how many were refused,
and each distinct failure (exception type and where it was raised, with the first input that raised it).

    python benchmarks/fuzz_readers.py [--examples 2000] [--only safetensors] [--seed 0] [--max-seconds 600]

The fast tier runs each property with tests/fuzz/fuzzing.py's FAST_EXAMPLES; this runs --examples of each (at most
--max-seconds per reader), each reader in a process of its own: a reader that crashes the process (a native
library overrunning a buffer) is reported with the input it was reading, saved to a file. Exit 1 when any reader
failed.
"""
import argparse
import collections
import importlib
import json
import os
import subprocess
import sys
import tempfile
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


def fuzz(name, prop, examples, seed, max_seconds, echo, last_input=None):
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
        if last_input:  # what a crash of the whole process was reading
            with open(last_input, "wb") as f:
                f.write(value if isinstance(value, bytes) else repr(value).encode())
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


def properties(only=""):
    for family in FAMILIES:
        for name, prop in importlib.import_module(family).PROPERTIES.items():
            if only in name:
                yield family, name, prop


def child(args):
    """One reader, in this process: its counts and failures as one JSON line at the end."""
    (family, name, prop), = [p for p in properties(args.reader) if p[1] == args.reader]
    print(f"{name} ({family}.py): {args.examples} examples", flush=True)
    counts, failures, seconds, slowest = fuzz(name, prop, args.examples, args.seed, args.max_seconds,
                                               lambda m: print(m, flush=True), args.last_input)
    print("RESULT " + json.dumps({"counts": counts, "failures": failures, "seconds": seconds, "slowest": slowest}),
          flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--examples", type=int, default=2000, help="damaged inputs per reader")
    p.add_argument("--only", default="", help="readers whose name contains this")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-seconds", type=float, default=600, help="time limit per reader")
    p.add_argument("--reader", help=argparse.SUPPRESS)  # the child process's one reader
    p.add_argument("--last-input", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.reader:
        return child(args)
    rows, failed = [], 0
    keep = tempfile.mkdtemp(prefix="fuzz-readers-")
    for _, name, _ in list(properties(args.only)):
        last = os.path.join(keep, "".join(c if c.isalnum() else "_" for c in name) + ".input")
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--reader", name, "--examples",
                                 str(args.examples), "--seed", str(args.seed), "--max-seconds", str(args.max_seconds),
                                 "--last-input", last], stdout=subprocess.PIPE, text=True, cwd=ROOT)
        result = None
        for line in proc.stdout:
            if line.startswith("RESULT "):
                result = json.loads(line[7:])
            else:
                print(line, end="", flush=True)
        proc.wait()
        if result is None:  # the process died mid-read: what it was reading is the defect
            failed += 1
            print(f"  FAIL the process died (exit {proc.returncode}) reading the input saved in {last}", flush=True)
            rows.append((name, collections.Counter(failed=1), 0.0, 0.0))
            continue
        for key, (value, error) in result["failures"].items():
            failed += 1
            print(f"  FAIL {key}\n    {error}\n    input: {value}", flush=True)
        rows.append((name, collections.Counter(result["counts"]), result["seconds"], result["slowest"]))
    print(f"\n{'reader':40} {'examples':>8} {'read':>6} {'refused':>8} {'failed':>7} {'seconds':>8} {'slowest':>8}")
    for name, c, seconds, slowest in rows:
        print(f"{name:40} {sum(c.values()):8d} {c['read']:6d} {c['refused']:8d} {c['failed']:7d} {seconds:8.1f} "
              f"{slowest:8.3f}")
    print(f"\n{failed} distinct failure(s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
