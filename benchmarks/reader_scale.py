"""Start-up time and memory of the training reader on a large dataset, as JSON.

    nice python benchmarks/reader_scale.py [--samples 10000000] [--work-dir /tmp/x]

Builds (once) a dataset of synthetic tokens: `--samples` samples of seq_length 8 in 10 MindRecord shards,
written by 2 processes, with a schema-2 manifest. Then, each in a fresh process so that memory is its own:
  * `load_manifest` the first time (sizes + SHA-256 of every shard, cached) and the second time (sizes only);
  * the reader as training uses it: TrainBatches(...) and its first batch, at the start and after a resume
    deep into the fourth epoch, then 500 more batches; RSS after imports, and the growth the reader adds;
  * the same for the design this replaced: a numpy permutation of the whole split per epoch and a
    SubsetSampler of up to 1M indices per pipeline.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEQ, VOCAB, SHARDS = 8, 1000, 10


def _write_shards(args):
    directory, split, first_k, ks, per = args
    sys.path.insert(0, ROOT)
    from ms_llm.data.shards import describe_shard, open_writer, rows_per_group, shard_name

    out = []
    for k in ks:
        rng = np.random.default_rng(k)
        name = shard_name(split, k)
        w = open_writer(os.path.join(directory, name), SEQ + 1)
        group = rows_per_group(SEQ + 1)
        for start in range(0, per[k], group):
            rows = rng.integers(0, VOCAB, (min(group, per[k] - start), SEQ + 1)).astype(np.int32)
            w.write_raw_data([{"input_ids": r} for r in rows])
        w.commit()
        out.append(describe_shard(directory, name, per[k]))
    return out


def build(directory, samples):
    if os.path.exists(os.path.join(directory, "manifest.json")):
        return
    import multiprocessing as mp

    os.makedirs(directory, exist_ok=True)
    per = [samples // SHARDS + (1 if k < samples % SHARDS else 0) for k in range(SHARDS)]
    t0 = time.perf_counter()
    with mp.get_context("spawn").Pool(2) as pool:
        parts = pool.map(_write_shards, [(directory, "train", 0, list(range(k, SHARDS, 2)), per) for k in (0, 1)])
    shards = sorted((s for p in parts for s in p), key=lambda s: s["file"].replace("train.mindrecord", "train.0"))
    val = _write_shards((directory, "val", 0, [0], [1000]))
    manifest = {"schema_version": 2, "seq_length": SEQ, "sample_length": SEQ + 1, "tokenizer": {"kind": "byte",
                "eod_id": 256}, "vocab_size": VOCAB, "eod_id": 256, "max_token_id": VOCAB - 1,
                "splits": {"train": {"samples": samples, "tokens": samples * SEQ, "shards": shards},
                           "val": {"samples": 1000, "tokens": 8000, "shards": val}},
                "build_seconds": round(time.perf_counter() - t0, 1)}
    with open(os.path.join(directory, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)


PROBE = r'''
import json, os, resource, sys, time
sys.path.insert(0, ROOT)
def rss():
    with open("/proc/self/status") as f:
        return [int(l.split()[1]) / 1024 for l in f if l.startswith("VmRSS")][0]
def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
import numpy as np, mindspore as ms, mindspore.dataset as ds
from ms_llm.data.manifest import load_manifest
from ms_llm.data.loader import TrainBatches
out = {"rss_after_imports_mb": round(rss())}
if MODE == "manifest":
    for name in ("first_use", "cached"):
        t = time.perf_counter(); m = load_manifest(DIR); out[f"load_manifest_{name}_s"] = round(time.perf_counter() - t, 3)
elif MODE == "reader":
    m = load_manifest(DIR)
    base = rss()
    for name, consumed in (("start", 0), ("resume_epoch_3", 3 * m["splits"]["train"]["samples"] + 12345 * 12)):
        t = time.perf_counter()
        it = TrainBatches(DIR, m, "train", 12, seed=1337, seq_length=8, consumed=consumed)
        b = next(it)
        out[f"first_batch_{name}_s"] = round(time.perf_counter() - t, 3)
    t = time.perf_counter()
    for _ in range(500):
        next(it)
    out["next_500_batches_s"] = round(time.perf_counter() - t, 3)
    out["rss_growth_mb"] = round(rss() - base)
    out["peak_rss_mb"] = round(peak())
else:  # the design this replaced: a whole-split numpy permutation, SubsetSampler of up to 1M indices
    m = load_manifest(DIR)
    base = rss()
    files = [os.path.join(DIR, s["file"]) for s in m["splits"]["train"]["shards"]]
    t = time.perf_counter()
    perm = np.random.default_rng([1337, 0]).permutation(m["splits"]["train"]["samples"])
    d = ds.MindDataset(files, columns_list=["input_ids"], sampler=ds.SubsetSampler(perm[: 1 << 20].tolist()))
    b = next(d.batch(12).create_tuple_iterator(num_epochs=1, output_numpy=True))
    out["first_batch_start_s"] = round(time.perf_counter() - t, 3)
    out["rss_growth_mb"] = round(rss() - base)
    out["peak_rss_mb"] = round(peak())
print(json.dumps(out))
'''


def probe(mode, directory):
    code = f"ROOT={ROOT!r}\nDIR={directory!r}\nMODE={mode!r}\n" + PROBE
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ, GLOG_v="3"))
    if r.returncode:
        raise SystemExit(r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=10_000_000)
    ap.add_argument("--work-dir", default="/tmp/ms_llm_reader_bench")
    args = ap.parse_args()
    directory = os.path.join(args.work_dir, f"synthetic_{args.samples}")
    build(directory, args.samples)
    with open(os.path.join(directory, "manifest.json")) as f:
        m = json.load(f)
    for name in os.listdir(directory):  # measure the first use: forget earlier verifications
        if name == ".verified.json":
            os.remove(os.path.join(directory, name))
    size = sum(s["bytes"] + s["db_bytes"] for s in m["splits"]["train"]["shards"])
    result = {"samples": m["splits"]["train"]["samples"], "shards": len(m["splits"]["train"]["shards"]),
              "dataset_mb": round(size / 1e6), "build_seconds": m.get("build_seconds"),
              "manifest": probe("manifest", directory), "reader": probe("reader", directory),
              "replaced_design": probe("old", directory)}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
