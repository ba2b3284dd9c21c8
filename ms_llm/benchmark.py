"""`ms-llm benchmark`: time the real training step on real data (with the checkpoint saver and the statistics
probe when the config turns them on, which is why it lives beside the CLI and not in ms_llm.train).

Compile time is measured on the first call and reported on its own; then `warmup` steps run untimed and
`steps` steps are timed one by one (each synchronised, so a step's time is its own). Throughput uses
the median step time, which a stray slow step (a noisy neighbour, a page fault) does not move. The cores other
processes kept busy during the timed steps (the host's busy time less this process's own, as `diagnose --measure`
records it) are reported beside the figures: a step timed beside other work is not a quiet machine's.
"""
import json
import os
import resource
import time

import numpy as np

from ms_llm.monitor.throughput import peak_memory_gib
from ms_llm.parallel.shapes import ModelShape
from ms_llm.train.setup.dataset import prepared_runtime
from ms_llm.train.session import open_session
from ms_llm.train.step_runner import StepRunner


def run_benchmark(cfg, steps=50, warmup=5, echo=print):
    """With checkpoint.save_interval > 0 or monitor.tensor_stats set, checkpoints / statistics records are
    written (to a temporary run dir) inside the timed steps, so `ms_per_step_mean` shows their cost; the
    statistics probe is compiled during warm-up, like the step."""
    import tempfile

    from ms_llm.checkpoint import state as ckpt_state
    from ms_llm.checkpoint.saver import CheckpointSaver
    from ms_llm.debug.training_hooks import TensorStats
    from ms_llm.diagnose.measure import HostMeter

    s = open_session(cfg, echo, rt=prepared_runtime(cfg, echo))
    runner = StepRunner(s)
    tmp = tempfile.TemporaryDirectory(prefix="ms_llm_bench_")
    saver = CheckpointSaver(tmp.name, 0, cfg.checkpoint, echo) if cfg.checkpoint.save_interval else None
    stats = TensorStats(cfg.monitor.tensor_stats, tmp.name, 0, 1, echo) if cfg.monitor.tensor_stats else None
    t0 = time.perf_counter()
    runner.step()[0].asnumpy()
    compile_s = time.perf_counter() - t0
    for _ in range(warmup):
        runner.step()[0].asnumpy()
    if stats is not None:  # compile the probe outside the timed steps
        batches = s.next_batches()
        stats.probe_step(s, batches)
        stats.record(s, 0, runner.step(batches))
    times, waits, save_s = [], [], 0.0
    with HostMeter(own=resource.RUSAGE_SELF) as host:  # other processes' cores meanwhile
        for i in range(steps):
            t0 = time.perf_counter()
            batches = s.next_batches()
            waits.append(time.perf_counter() - t0)
            probing = stats is not None and stats.due(i)
            if probing:
                stats.probe_step(s, batches)
            out = runner.step(batches)
            out[0].asnumpy()
            if probing:
                stats.record(s, i, out)
            if saver is not None and (i + 1) % cfg.checkpoint.save_interval == 0:
                t1 = time.perf_counter()
                saver.save(i + 1, ckpt_state.capture(s), ckpt_state.describe(s, i + 1, {}))
                save_s += time.perf_counter() - t1
            times.append(time.perf_counter() - t0)
    if saver is not None:
        saver.close()
    tmp.cleanup()
    times = np.array(times)
    median = float(np.median(times))
    tokens_per_s = s.tokens_per_step / median
    achieved = s.flops_per_token * tokens_per_s / s.rt.world_size
    return {
        "tokens_per_s": tokens_per_s,
        "ms_per_step": 1e3 * median,
        "ms_per_step_p90": 1e3 * float(np.percentile(times, 90)),
        "ms_per_step_p10": 1e3 * float(np.percentile(times, 10)),  # the least disturbed steps (diagnose --measure)
        "ms_per_step_mean": 1e3 * float(times.mean()),
        "compile_s": compile_s,
        "graphs": runner.graphs,  # "compiled", "filled" (into the compile cache) or "reused" (loaded from it)
        "tflops": achieved / 1e12,
        "mfu": achieved / s.peak_flops,
        "peak_tflops": s.peak_flops / 1e12,
        "peak_mem_gib": peak_memory_gib(s.rt.device_target),
        "data_wait_frac": float(np.sum(waits) / np.sum(times)),
        "save_frac": save_s / float(np.sum(times)),  # training-thread time spent in checkpoint saves
        "steps": steps,
        "tokens_per_step": s.tokens_per_step,
        "parameters": s.n_params,
        # MoE: what one token computes with (top_k of each MoE layer's experts); = parameters for a dense model
        "active_parameters": s.n_params - (ModelShape.from_config(s.cfg.model).inactive_expert_params()
                                           if s.cfg.model.moe is not None else 0),
        **optimizer_memory(s),
        "device": s.rt.device_target,
        "world_size": s.rt.world_size,
        "other_cores": host.other,  # None where psutil is missing
        "cpu_count": os.cpu_count(),
    }


def optimizer_memory(s):
    """Trainable parameters and the bytes the optimizer's moments and the gradients hold, counted on the live tensors
    of the step (with finetune.lora: the adapters' alone)."""
    opt = s.step_fn.optimizer
    moments = sum(int(np.prod(p.shape)) * p.itemsize for p in list(opt.exp_avg) + list(opt.exp_avg_sq))
    trainable = sum(int(np.prod(p.shape)) for p in opt.params)
    return {"trainable_parameters": trainable, "optimizer_state_bytes": moments,
            "gradient_bytes": sum(int(np.prod(p.shape)) * p.itemsize for p in opt.params)}


def format_report(r):
    return "\n".join([
        f"benchmark: {r['steps']} timed steps of {r['tokens_per_step']:,} tokens on {r['device']} "
        f"({r['world_size']} rank(s), {r['parameters']:,} parameters"
        + (f", {r['active_parameters']:,} active per token" if r["active_parameters"] != r["parameters"] else "") + ")",
        f"  tokens/s        {r['tokens_per_s']:,.0f}",
        f"  ms/step         median {r['ms_per_step']:.2f}   p90 {r['ms_per_step_p90']:.2f}   "
        f"mean {r['ms_per_step_mean']:.2f}",
        f"  compile         {r['compile_s']:.1f} s (first call, excluded above)",
        f"  achieved        {r['tflops']:.3f} TFLOP/s per device = MFU {100 * r['mfu']:.1f}% "
        f"of {r['peak_tflops']:.2f} TFLOP/s",
        f"  peak memory     {r['peak_mem_gib']:.2f} GiB",
        f"  trainable       {r['trainable_parameters']:,} of {r['parameters']:,} parameters; optimizer states "
        f"{r['optimizer_state_bytes'] / 2**20:,.2f} MiB, gradients {r['gradient_bytes'] / 2**20:,.2f} MiB",
        f"  data wait       {100 * r['data_wait_frac']:.1f}% of step time",
        f"  checkpointing   {100 * r['save_frac']:.1f}% of step time (training thread)",
        "  other load      " + ("unknown (needs psutil)" if r["other_cores"] is None else
                              f"{r['other_cores']:.2f} of {r['cpu_count']} cores busy with other processes during the "
                              f"timed steps"),
    ])


def main(cfg, steps, warmup, as_json, echo=print, output=None, about=None):
    """`output`: also write the result as JSON there, with `about` (the config and overrides it ran), the host and
    its cores: what `ms-llm diagnose` compares a run's speed with."""
    if output:
        folder = os.path.dirname(os.path.abspath(output))
        if not os.path.isdir(folder):
            from ms_llm.errors import UserError

            raise UserError(f"--output {output}: folder '{folder}' does not exist. Create it or choose another path.")
    r = run_benchmark(cfg, steps, warmup, echo=(lambda *_: None) if as_json else echo)
    if not as_json:
        echo(format_report(r))
    else:
        echo(json.dumps(r))
    if output:
        import socket

        from ms_llm.fileio import atomic_write_bytes

        record = dict(r, **(about or {}), host=socket.gethostname(), cpu_count=os.cpu_count(),
                      time=round(time.time(), 3))
        atomic_write_bytes(output, json.dumps(record, indent=1).encode("utf-8"))
    return r
