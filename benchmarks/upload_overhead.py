"""What mirroring checkpoints to an S3 store costs a training step: the quickstart model (configs/shakespeare_char.yaml,
~0.8M parameters, a 9.6 MB checkpoint with the optimizer state) trained for --steps steps with a checkpoint every 10
steps, with and without `checkpoint.remote_dir: s3://...` (moto's S3 server on 127.0.0.1, in its own process at
the lowest CPU priority, standing in for a store on another machine), the two alternating
--pairs times so that drift of the machine's load hits both alike. The step time is the median of the log records'
ms_per_step (every 10 steps, the first left out: it holds the compile); the upload side is the median upload time
of a checkpoint from the upload events, the training thread's part of each save (the checkpoint events' duration,
queueing the upload included), and the CPU seconds of the training process.

  python benchmarks/upload_overhead.py [--steps 200] [--pairs 3]
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import boto3

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "tests"))
from object_store import free_port, isolated_aws_env  # noqa: E402


def train(run_dir, steps, remote, env):
    args = ["train", "--config", os.path.join(ROOT, "configs", "shakespeare_char.yaml"), "--run-dir", run_dir,
            "--set", f"train.max_steps={steps}", "--set", "train.log_interval=10", "--set", "train.eval_interval=0",
            "--set", "checkpoint.save_interval=10", "--set", "checkpoint.keep_last=2",
            "--set", "monitor.report=false", "--set", "monitor.summary=false",
            "--set", "monitor.telemetry_interval_s=null"]
    if remote:
        args += ["--set", f"checkpoint.remote_dir={remote[0]}", "--set", f"checkpoint.remote_endpoint={remote[1]}"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "ms_llm.cli", *args], check=True, capture_output=True, cwd=ROOT,
                   env=dict(os.environ, GLOG_v="3", **env))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
        recs = [json.loads(line) for line in f]
    step_ms = [r["ms_per_step"] for r in recs if r.get("ms_per_step") and "event" not in r][1:]
    uploads = [r["upload_s"] for r in recs if r.get("event") == "upload"]
    saves = [r["duration_s"] for r in recs if r.get("event") == "checkpoint"]
    return statistics.median(step_ms), uploads, saves, cpu_s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--pairs", type=int, default=3)
    args = ap.parse_args()
    # the store in a process of its own at the lowest CPU priority: it stands in for a server on another machine,
    # instead of taking the training's cores as an in-process server would
    port = free_port()
    server = subprocess.Popen(["nice", "-n", "19", sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                               str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(url, timeout=1)
            break
        except OSError:
            time.sleep(0.2)
    key, secret = "bench-key", "bench-secret"  # moto checks no signatures by default
    boto3.client("s3", endpoint_url=url, aws_access_key_id=key, aws_secret_access_key=secret,
                 region_name="us-east-1").create_bucket(Bucket="bench")
    with tempfile.TemporaryDirectory() as tmp:
        env = isolated_aws_env(tmp, key, secret)
        local, remote, uploads, saves, saves_remote, cpu_local, cpu_remote = [], [], [], [], [], [], []
        for i in range(args.pairs):
            ms, _, s, cpu = train(os.path.join(tmp, f"local{i}"), args.steps, None, env)
            local.append(ms)
            cpu_local.append(cpu)
            saves += s
            ms, up, s, cpu = train(os.path.join(tmp, f"s3_{i}"), args.steps, (f"s3://bench/run{i}", url), env)
            saves_remote += s
            remote.append(ms)
            cpu_remote.append(cpu)
            uploads += up
            print(f"pair {i + 1}: {local[-1]:.1f} ms/step local only ({cpu_local[-1]:.1f} CPU s), {remote[-1]:.1f} "
                  f"ms/step with s3:// ({cpu_remote[-1]:.1f} CPU s); load average {os.getloadavg()[0]:.1f}",
                  flush=True)
    server.terminate()
    server.wait()
    a, b = statistics.median(local), statistics.median(remote)
    print(f"median over {args.pairs} pairs, {args.steps} steps each, a checkpoint every 10 steps: {a:.1f} ms/step "
          f"without remote_dir, {b:.1f} ms/step with s3:// ({100 * (b - a) / a:+.1f}%); a checkpoint's save in the "
          f"training thread {1000 * statistics.median(saves):.0f} ms without, "
          f"{1000 * statistics.median(saves_remote):.0f} ms with (queueing included); its upload + read-back in the "
          f"background "
          f"{1000 * statistics.median(uploads):.0f} ms median ({len(uploads)} uploads); CPU seconds of the training "
          f"process {statistics.median(cpu_local):.1f} without, {statistics.median(cpu_remote):.1f} with")


if __name__ == "__main__":
    main()
