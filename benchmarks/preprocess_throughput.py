"""Throughput and memory of `ms-llm preprocess` against a bare `tokenizers` loop, as JSON.

    nice python benchmarks/preprocess_throughput.py [--sizes-mb 60 240] [--workers 1 2] [--work-dir /tmp/x]
    nice python benchmarks/preprocess_throughput.py --sizes-mb 60 240 960 --workers 2 --no-bare   # memory only

1. Builds JSONL corpora of the given sizes from the bundled sample, cut into documents of varied length
   (log-uniform, 100 to 20,000 characters, from random places).
2. Trains a 32k byte-level BPE tokenizer.json with `ms-llm tokenizer train` (item 4 of issue 11).
3. For each size and worker count, runs `ms-llm preprocess` as a user does (a fresh process) and records
   wall time (end to end, imports included), the preprocessing time the manifest records (reading,
   tokenizing, packing, writing and checksumming, without Python/MindSpore start-up), CPU seconds of the
   process and its workers, and peak RSS of the process tree (the main process alone, and main + workers
   summed, sampled every 0.1 s), with each process's own high-water mark (VmHWM; their sum bounds the tree's
   peak from above, whatever the sampling missed).
4. Unless --no-bare, runs the bare loop: the same documents, already in memory, split over the same number of
   processes, each calling the same `encode_batch` method ms_llm uses on batches of ~1 MiB; only the encode calls
   are timed (from a common start), wall and CPU. That is the practical limit: no reading, no JSON, no writing.
On a machine whose cores are busy with other work the wall ratios are noisy; the CPU ratio is not.
"""
import argparse
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(ROOT, "data", "tinyshakespeare.txt")


def build_corpus(path, size_mb, seed=0):
    if os.path.exists(path) and os.path.getsize(path) >= size_mb * 1e6:
        return path
    text = open(SAMPLE, encoding="utf-8").read()
    rng = np.random.default_rng(seed)
    target, written = size_mb * 1e6, 0
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        while written < target:
            n = int(np.exp(rng.uniform(np.log(100), np.log(20_000))))
            start = int(rng.integers(0, len(text) - n))
            line = json.dumps({"text": text[start:start + n]}) + "\n"
            f.write(line)
            written += len(line.encode())
    os.replace(path + ".tmp", path)
    return path


def tree_rss_mb(pid):
    """RSS of `pid` and of all its descendants, in MB (from /proc)."""
    children = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(d))
            except (OSError, IndexError, ValueError):
                pass

    def rss(p):
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024
        except OSError:
            pass
        return 0.0

    main, total, todo = rss(pid), 0.0, [pid]
    while todo:
        p = todo.pop()
        total += rss(p)
        todo += children.get(p, [])
    return main, total


def tree_hwm_mb(pid):
    """{pid: VmHWM in MB} of `pid` and its descendants: each process's own peak RSS so far."""
    out, todo = {}, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        out[p] = int(line.split()[1]) / 1024
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def run_preprocess(corpus, tokenizer, out, workers):
    import threading

    cmd = [sys.executable, "-m", "ms_llm.cli", "preprocess", "--input", corpus, "--output-dir", out, "--seq-length",
           "1024", "--tokenizer", tokenizer, "--workers", str(workers), "--overwrite"]
    log = out + ".log"
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=dict(os.environ, GLOG_v="3"))
    peaks, hwm, done = [0.0, 0.0], {}, threading.Event()

    def sample():
        while not done.is_set():
            m, t = tree_rss_mb(proc.pid)
            peaks[0], peaks[1] = max(peaks[0], m), max(peaks[1], t)
            hwm.update(tree_hwm_mb(proc.pid))  # the last reading of each process is its peak
            time.sleep(0.1)

    sampler = threading.Thread(target=sample)
    sampler.start()
    _, status, usage = os.wait4(proc.pid, 0)  # CPU of the command and of the workers it waited for
    wall = time.perf_counter() - t0
    done.set()
    sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"preprocess failed:\n{open(log).read()}")
    with open(os.path.join(out, "manifest.json")) as f:
        m = json.load(f)
    tokens = m["splits"]["train"]["tokens"] + m["splits"]["val"]["tokens"]
    size = os.path.getsize(corpus)
    return {"wall_s": round(wall, 2), "preprocess_s": m["seconds"], "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            "mb_per_s": round(size / 1e6 / wall, 3), "mb_per_s_excluding_startup": round(size / 1e6 / m["seconds"], 3),
            "tokens_per_s": round(tokens / wall), "tokens": tokens,
            "peak_rss_main_mb": round(peaks[0]), "peak_rss_tree_mb": round(peaks[1]),
            "hwm_main_mb": round(hwm.get(proc.pid, 0)),
            "hwm_children_mb": sorted((round(v) for p, v in hwm.items() if p != proc.pid), reverse=True),
            "hwm_sum_mb": round(sum(hwm.values())),
            "shards": {k: [s["sha256"][:16] for s in v["shards"]] for k, v in m["splits"].items()},
            "summary": open(log).read().strip().splitlines()[-1]}


def _bare_worker(args):
    tokenizer, docs, start_at = args
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer)
    encode = getattr(tok, "encode_batch_fast", None) or tok.encode_batch
    batches, batch, size = [], [], 0
    for d in docs:
        batch.append(d)
        size += len(d)
        if size >= 1 << 20:
            batches.append(batch)
            batch, size = [], 0
    if batch:
        batches.append(batch)
    while time.time() < start_at:  # every process starts encoding at the same moment
        time.sleep(0.001)
    t0, c0 = time.perf_counter(), time.process_time()
    n = sum(len(e.ids) for b in batches for e in encode(b, add_special_tokens=False))
    return n, time.perf_counter() - t0, time.process_time() - c0


def run_bare(corpus, tokenizer, workers):
    docs = [json.loads(line)["text"] for line in open(corpus, encoding="utf-8")]
    shares = np.array_split(np.arange(len(docs)), workers)
    start_at = time.time() + 5.0 + len(docs) / 2e5  # time for every process to receive its documents
    with mp.get_context("spawn").Pool(workers) as pool:
        results = pool.map(_bare_worker, [(tokenizer, [docs[i] for i in s], start_at) for s in shares])
    tokens, wall, cpu = sum(r[0] for r in results), max(r[1] for r in results), sum(r[2] for r in results)
    size = os.path.getsize(corpus)
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "mb_per_s": round(size / 1e6 / wall, 3),
            "tokens_per_s": round(tokens / wall),
            "tokens": tokens, "encode_call": "encode_batch_fast" if hasattr(__import__("tokenizers").Tokenizer,
                                                                               "encode_batch_fast") else "encode_batch"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes-mb", type=int, nargs="+", default=[60, 240])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--vocab-size", type=int, default=32000)
    ap.add_argument("--work-dir", default="/tmp/ms_llm_preprocess_bench")
    ap.add_argument("--no-bare", action="store_true", help="ms-llm only, no bare tokenizers loop (memory runs: "
                                                           "the loop holds the whole corpus in memory)")
    args = ap.parse_args()
    os.makedirs(args.work_dir, exist_ok=True)
    tokenizer = os.path.join(args.work_dir, f"bpe{args.vocab_size}.json")
    if not os.path.exists(tokenizer):
        # min-frequency 1: the 1 MB sample holds too few distinct pairs for 32k merges at the default of 2
        subprocess.run([sys.executable, "-m", "ms_llm.cli", "tokenizer", "train", "--input", SAMPLE, "--vocab-size",
                        str(args.vocab_size), "--min-frequency", "1", "--output", tokenizer], check=True, cwd=ROOT,
                       env=dict(os.environ, GLOG_v="3"))
    from tokenizers import Tokenizer

    result = {"tokenizer": {"path": tokenizer, "vocab": Tokenizer.from_file(tokenizer).get_vocab_size()},
              "cpus": len(os.sched_getaffinity(0)), "runs": {}}
    for size in args.sizes_mb:
        corpus = build_corpus(os.path.join(args.work_dir, f"corpus_{size}mb.jsonl"), size)
        entry = {"bytes": os.path.getsize(corpus)}
        for w in args.workers:
            out = os.path.join(args.work_dir, f"out_{size}_{w}")
            ours = run_preprocess(corpus, tokenizer, out, w)
            shutil.rmtree(out)  # the next size's output and corpus need the room more
            if args.no_bare:
                entry[f"workers_{w}"] = {"ms_llm": ours}
                print(json.dumps({size: {w: entry[f"workers_{w}"]}}), file=sys.stderr, flush=True)
                continue
            bare = run_bare(corpus, tokenizer, w)
            entry[f"workers_{w}"] = {"ms_llm": ours, "bare_tokenizers": bare,
                                     "ratio_end_to_end": round(ours["mb_per_s"] / bare["mb_per_s"], 3),
                                     "ratio_excluding_startup": round(ours["mb_per_s_excluding_startup"] /
                                                                      bare["mb_per_s"], 3),
                                     # CPU seconds of the encode loop / of the whole ms-llm process tree: the wall
                                     # ratio on a machine whose cores are not shared with other work
                                     "ratio_cpu": round(bare["cpu_s"] / ours["cpu_s"], 3)}
            print(json.dumps({size: {w: entry[f"workers_{w}"]}}), file=sys.stderr, flush=True)
        shards = {w: entry[f"workers_{w}"]["ms_llm"]["shards"] for w in args.workers}
        entry["identical_output_across_workers"] = all(s == shards[args.workers[0]] for s in shards.values())
        result["runs"][f"{size}mb"] = entry
    sizes = [f"{s}mb" for s in args.sizes_mb]
    if len(sizes) >= 2:  # what must not grow with the corpus (issue 22 item 4, issue 33 item 6: at most 1.05x)
        w = args.workers[-1]
        for key in ("peak_rss_tree_mb", "hwm_sum_mb", "peak_rss_main_mb"):
            peaks = {s: result["runs"][s][f"workers_{w}"]["ms_llm"][key] for s in sizes}
            result.setdefault("peak_rss_growth", {"workers": w})[key] = dict(
                peaks, ratio_last_to_first=round(peaks[sizes[-1]] / peaks[sizes[0]], 3))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
