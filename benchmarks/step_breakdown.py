"""Where one training step's time goes besides the arithmetic: the host's work around the compiled graph, the
runtime's threads, and (--profile) the operators and how many kernels the graph launches.

  python benchmarks/step_breakdown.py                          # the quickstart (4 x 128, context 64, batch 12)
  python benchmarks/step_breakdown.py --profile                # + MindSpore's operator table over 20 steps
  python benchmarks/step_breakdown.py --set model.hidden_size=16 --set model.num_heads=2 \\
         --set train.global_batch_size=1 --set train.micro_batch_size=1   # arithmetic ~0: the fixed cost alone

Each of --steps steps is the StepRunner's, synchronised (its loss read back), split into: the data (the next
micro-batches, their ids checked), the inputs (the loss's arguments), the call of the compiled step and the wait for
its result. Beside the wall time of each part, the CPU time the Python thread spent in it. Then the CPU time of each
thread of the process over the steps (MindSpore's actor and kernel threads run the graph), and the cores other
processes kept busy meanwhile (the host's busy time less this process's own): a breakdown measured beside other
work is not a quiet machine's. With --profile, the operators' own time per step and the number of kernels the step
launches: the step's wall time less the operators' time is the runtime's cost of launching them and the host's work.
"""
import argparse
import os
import resource
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def thread_cpu():
    """{thread id: (name, CPU seconds)} of this process's threads."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        out[tid] = (name, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "shakespeare_char.yaml"))
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="ms_llm config override")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--profile", action="store_true", help="also MindSpore's operator table over 20 steps")
    args = ap.parse_args()
    os.environ.setdefault("GLOG_v", "3")
    from ms_llm.config import load_config
    from ms_llm.diagnose.measure import HostMeter
    from ms_llm.train.session import open_session
    from ms_llm.train.setup.dataset import prepared_runtime
    from ms_llm.train.step_runner import StepRunner

    quiet = lambda *_: None  # noqa: E731
    cfg = load_config(args.config, args.overrides)
    s = open_session(cfg, quiet, rt=prepared_runtime(cfg, quiet))
    runner = StepRunner(s)
    for _ in range(10):  # compile, then warm up
        runner.step()[0].asnumpy()
    parts = ("data", "inputs", "call", "wait")
    wall, cpu = {p: [] for p in parts}, {p: [] for p in parts}
    before = thread_cpu()
    with HostMeter(own=resource.RUSAGE_SELF) as host:
        t_start = time.perf_counter()
        for _ in range(args.steps):
            w, c = [time.perf_counter()], [time.thread_time()]
            batches = s.next_batches()
            w.append(time.perf_counter()), c.append(time.thread_time())
            inputs = s.loss.inputs(batches)
            w.append(time.perf_counter()), c.append(time.thread_time())
            out = runner.run(inputs)
            w.append(time.perf_counter()), c.append(time.thread_time())
            out.loss.asnumpy()
            w.append(time.perf_counter()), c.append(time.thread_time())
            for i, p in enumerate(parts):
                wall[p].append(w[i + 1] - w[i])
                cpu[p].append(c[i + 1] - c[i])
        elapsed = time.perf_counter() - t_start
    after = thread_cpu()
    m = cfg.model
    print(f"{m.arch}, {m.num_layers} layers x {m.hidden_size}, context {m.seq_length}, batch "
          f"{cfg.train.global_batch_size}: {args.steps} synchronised steps, {elapsed / args.steps * 1e3:.2f} ms/step; "
          f"other processes on {'?' if host.other is None else f'{host.other:.2f}'} cores")
    print(f"  {'part':8s}{'wall ms (median)':>18s}{'Python thread CPU ms (mean)':>30s}")
    for p in parts:
        print(f"  {p:8s}{np.median(wall[p]) * 1e3:18.3f}{np.mean(cpu[p]) * 1e3:30.3f}")
    threads = {}
    for tid, (name, seconds) in after.items():
        threads.setdefault(name, 0.0)
        threads[name] += seconds - before.get(tid, (name, 0.0))[1]
    print("  CPU per step by thread: " + ", ".join(f"{name} {t / args.steps * 1e3:.1f} ms"
                                                 for name, t in sorted(threads.items(), key=lambda x: -x[1]) if t > 0))
    if args.profile:
        profile(runner)


def profile(runner, steps=20):
    from mindspore.profiler import ProfilerActivity, profile as ms_profile, schedule, tensorboard_trace_handler

    from ms_llm.monitor.profile import format_top_table, top_operators

    with tempfile.TemporaryDirectory() as folder:
        prof = ms_profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=0, active=steps, repeat=1),
                          on_trace_ready=tensorboard_trace_handler(folder))
        prof.start()
        for _ in range(steps):
            runner.step()[0].asnumpy()
            prof.step()
        prof.stop()
        rows = top_operators(folder, steps, 100)
    print(format_top_table(rows[:12], steps))
    print(f"  every operator: {sum(r[1] for r in rows):.2f} ms/step of their own time, "
          f"{sum(r[2] for r in rows):.0f} kernels per step (the profiler slows the step itself)")


if __name__ == "__main__":
    main()
