"""MindSpore context and process-group set-up: device, graph mode, threads, ranks under msrun."""
import os
import re
from dataclasses import dataclass

import numpy as np

from ms_llm.errors import UserError

# Environment variables msrun (MS_*) or a rank-table launch (RANK_*) set for each worker.
LAUNCHER_VARS = ("MS_WORKER_NUM", "MS_ROLE", "RANK_TABLE_FILE")


@dataclass
class Runtime:
    device_target: str
    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self):
        return self.rank == 0


def launched_distributed():
    """True in every process msrun starts, the scheduler included: its init() runs the rendezvous service."""
    return any(v in os.environ for v in LAUNCHER_VARS)


def setup_context(ctx_cfg):
    """Configure MindSpore from the `context` section; init communication when launched by msrun."""
    os.environ.setdefault("GLOG_v", "3")  # MindSpore's INFO/WARNING spam hides our log lines
    import mindspore as ms

    target = ctx_cfg.device_target
    if target == "auto":
        target = ms.get_context("device_target")  # the backend this MindSpore package was built for
    kwargs = {"mode": ms.GRAPH_MODE if ctx_cfg.mode == "graph" else ms.PYNATIVE_MODE, "device_target": target}
    device_id = ctx_cfg.device_id
    if device_id is None and "DEVICE_ID" in os.environ:
        device_id = int(os.environ["DEVICE_ID"])
    if device_id is not None and target != "CPU":
        kwargs["device_id"] = device_id
    if ctx_cfg.max_device_memory and target != "CPU":
        kwargs["max_device_memory"] = ctx_cfg.max_device_memory
    if ctx_cfg.jit_level:
        kwargs["jit_config"] = {"jit_level": ctx_cfg.jit_level}
    try:
        ms.set_context(**kwargs)
    except RuntimeError as e:
        if "Unsupported device target" not in str(e):
            raise
        found = re.search(r"one of the \[(.*?)\]", str(e))
        here = found.group(1).replace("'", "") if found else "another device"
        raise UserError(f"context.device_target = {target}, but this MindSpore package and host support only {here}. "
                        f"Launch on {target} hardware with MindSpore's {target} package (and its driver/toolkit), or "
                        f"try the config here with --set context.device_target=auto.") from None
    if ctx_cfg.num_threads:
        ms.set_context(runtime_num_threads=ctx_cfg.num_threads)
    rt = Runtime(target)
    if launched_distributed():
        from mindspore.communication import get_group_size, get_rank, init

        init()
        if os.environ.get("MS_ROLE") == "MS_SCHED":  # the scheduler's work ends with the workers'
            raise SystemExit(0)
        rt.rank, rt.world_size = get_rank(), get_group_size()
    return rt


def all_ranks_sum(rt, value):
    """Sum of a small integer (|x| < 2^24) over all ranks, which doubles as a barrier.

    Float32 SUM because the CPU AllReduce kernel supports nothing else."""
    if rt.world_size == 1:
        return value
    import mindspore as ms
    from mindspore import ops

    out = ops.AllReduce()(ms.Tensor(np.array([value], np.float32)))
    return int(round(float(out.asnumpy()[0])))


def all_ranks_ok(rt, ok):
    return all_ranks_sum(rt, 1 if ok else 0) == rt.world_size


def rank0_int(rt, value):
    """Rank 0's value of a non-negative integer below 2^48, on every rank (sent as exact float32 halves)."""
    if rt.world_size == 1:
        return value
    hi, lo = divmod(value, 1 << 24) if rt.rank == 0 else (0, 0)
    return all_ranks_sum(rt, hi) * (1 << 24) + all_ranks_sum(rt, lo)
