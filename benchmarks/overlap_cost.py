"""What the splits' overlap measure (ms_llm.data.overlap) costs at corpus scale, and that it streams.

    python benchmarks/overlap_cost.py --sizes-mb 100 1000 [--workdir /tmp] [--preprocess]

For each size, a JSONL corpus is built in a temporary folder from the bundled Tiny Shakespeare: documents of about
2,000 characters from random offsets, every 12th character on average replaced (so that documents are not copies
of each other), and one document in ten a near-copy of an earlier one (every 200th character replaced): leakage to
find. Then, in a fresh process per size, the corpus is streamed as preprocessing streams it (read, char tokens,
documents to validation by a hash of their text, 10%) through SplitOverlap, timing the measure apart from the
reading, and the process's peak RSS is taken (ru_maxrss). With --preprocess, `ms-llm preprocess` itself is timed on
the largest corpus, the measure inside it timed apart. The corpora are deleted at the end.
"""
import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import zlib

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def build_corpus(path, size_mb, seed=0):
    text = open(os.path.join(ROOT, "data", "tinyshakespeare.txt"), encoding="utf-8").read()
    base = np.frombuffer(text.encode("ascii", "replace"), np.uint8)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", np.uint8)
    rng = np.random.default_rng(seed)
    kept, written, docs = [], 0, 0
    with open(path, "w", encoding="ascii") as f:
        while written < size_mb * 1e6:
            if kept and rng.random() < 0.1:  # a near-copy of an earlier document
                doc = kept[rng.integers(len(kept))].copy()
                rate = 200
            else:
                start = rng.integers(0, len(base) - 2100)
                doc = base[start:start + 2000].copy()
                rate = 12
            hit = rng.random(len(doc)) < 1.0 / rate
            doc[hit] = letters[rng.integers(0, 26, int(hit.sum()))]
            if len(kept) < 2000:
                kept.append(doc)
            elif rng.random() < 0.01:
                kept[rng.integers(len(kept))] = doc
            line = json.dumps({"text": doc.tobytes().decode("ascii")}) + "\n"
            f.write(line)
            written += len(line)
            docs += 1
    return docs


def measure(path):
    """Stream the corpus through SplitOverlap as preprocessing does; print one JSON line."""
    from ms_llm.data.overlap import SplitOverlap

    sketch = SplitOverlap(32)
    table = np.zeros(256, np.int64)
    t_all = time.perf_counter()
    t_sketch, docs, tokens = 0.0, 0, 0
    counts = {"train": np.zeros(256, np.int64), "val": np.zeros(256, np.int64)}
    with open(path, "rb") as f:
        while True:
            lines = f.readlines(1 << 24)  # ~16 MB at a time
            if not lines:
                break
            parts = {"train": [], "val": []}
            for line in lines:
                doc = json.loads(line)["text"].encode("ascii")
                split = "val" if zlib.crc32(doc) % 1000 < 100 else "train"
                parts[split].append(np.frombuffer(doc, np.uint8))
                parts[split].append(np.zeros(1, np.uint8))  # the end-of-document token
                docs += 1
            for split, arrays in parts.items():
                if not arrays:
                    continue
                ids = np.concatenate(arrays).astype(np.int64)
                tokens += len(ids)
                counts[split] += np.bincount(ids, minlength=256)
                t0 = time.perf_counter()
                sketch.add(split, ids)
                t_sketch += time.perf_counter() - t0
    t0 = time.perf_counter()
    result = sketch.result(counts["train"] + table, counts["val"])
    t_sketch += time.perf_counter() - t0
    print(json.dumps({"bytes": os.path.getsize(path), "documents": docs, "tokens": tokens,
                      "measure_s": round(t_sketch, 1), "total_s": round(time.perf_counter() - t_all, 1),
                      "cpu_s": round(time.process_time(), 1),
                      "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                      "overlap": result}))


def preprocess_timed(path, out):
    """`ms-llm preprocess` on the corpus, the time inside SplitOverlap counted apart."""
    from ms_llm.data import overlap
    from ms_llm.data.preprocess import preprocess

    spent = [0.0]
    add, result = overlap.SplitOverlap.add, overlap.SplitOverlap.result

    def timed(fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[0] += time.perf_counter() - t0
        return wrapper

    overlap.SplitOverlap.add, overlap.SplitOverlap.result = timed(add), timed(result)
    t0 = time.perf_counter()
    m = preprocess(path, out, 1024, "byte", 0.1, log=lambda *_: None)
    print(json.dumps({"bytes": os.path.getsize(path), "preprocess_s": round(time.perf_counter() - t0, 1),
                      "measure_s": round(spent[0], 1),
                      "peak_rss_mib_main": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                      "overlap": m["overlap"]}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes-mb", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--preprocess", action="store_true")
    ap.add_argument("--child", nargs=2, metavar=("MODE", "PATH"), help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return measure(a.child[1]) if a.child[0] == "measure" else preprocess_timed(a.child[1], a.out)
    work = tempfile.mkdtemp(prefix="overlap_cost_", dir=a.workdir)
    try:
        for mb in a.sizes_mb:
            path = os.path.join(work, f"corpus_{mb}mb.jsonl")
            t0 = time.perf_counter()
            docs = build_corpus(path, mb)
            print(f"built {path}: {os.path.getsize(path) / 1e6:,.0f} MB, {docs:,} documents in "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)
            out = subprocess.run([sys.executable, __file__, "--child", "measure", path], capture_output=True,
                                 text=True, env=dict(os.environ, PYTHONPATH=ROOT, GLOG_v="3"))
            print(out.stdout.strip() or out.stderr[-2000:], flush=True)
            if a.preprocess and mb == max(a.sizes_mb):
                out = subprocess.run([sys.executable, __file__, "--child", "preprocess", path, "--out",
                                      os.path.join(work, "ds")], capture_output=True, text=True,
                                     env=dict(os.environ, PYTHONPATH=ROOT, GLOG_v="3"))
                print(out.stdout.strip() or out.stderr[-2000:], flush=True)
                shutil.rmtree(os.path.join(work, "ds"), ignore_errors=True)
            os.remove(path)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
