"""MindSpore context and process-group set-up: device, graph mode, threads, ranks under msrun."""
import os
import re
from dataclasses import dataclass

import numpy as np

from ms_llm.errors import UserError
from ms_llm import env

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


def launch_world_size():
    """The number of worker processes of this launch, known from msrun's environment before any rendezvous: a
    config that cannot run on them is refused by every process at once, before one waits on another."""
    for name in ("MS_WORKER_NUM", "RANK_SIZE"):
        if env.count(name) is not None:
            return env.count(name)
    return 1


def device_target(ctx_cfg):
    """context.device_target with `auto` resolved to the backend this MindSpore package was built for."""
    if ctx_cfg.device_target != "auto":
        return ctx_cfg.device_target
    import mindspore as ms

    return ms.get_context("device_target")


def setup_context(ctx_cfg):
    """Configure MindSpore from the `context` section; init communication when launched by msrun."""
    target = select_device(ctx_cfg)
    rt = Runtime(target)
    if launched_distributed():
        from mindspore.communication import get_group_size, get_rank, init

        try:
            init()
        except RuntimeError as e:
            if os.environ.get("MS_ROLE") != "MS_SCHED":
                raise
            # the scheduler outlives the workers: when one ended early (a refusal, a crash), its own message is in
            # its worker log; the scheduler says so in one line instead of MindSpore's timeout traceback
            raise UserError(f"a worker ended before the job finished ({str(e).splitlines()[0]}); see the worker "
                            f"logs (msrun --log_dir) for its message.") from None
        if os.environ.get("MS_ROLE") == "MS_SCHED":  # the scheduler's work ends with the workers'
            raise SystemExit(0)
        rt.rank, rt.world_size = get_rank(), get_group_size()
        _joined.append(rt.rank)
    return rt


_joined = []  # this process's rank, once it joined the cluster


def refusal_exit_code(error):
    """The exit code of a worker that refuses to go on. A refusal every rank agreed on (`agree`) ends all of them
    at once, but msrun kills the other workers the moment one exits non-zero, before they can sign off with its
    scheduler, which then waits for their heartbeats to time out and ends in a traceback. So the other ranks
    exit 0 right away (their log holds the same message) and rank 0 exits with the error's code once they
    have gone; msrun still ends with a failure."""
    if not _joined or not getattr(error, "agreed", False):
        return error.exit_code
    if _joined[0] != 0:
        return 0
    import time

    time.sleep(3)
    return error.exit_code


def select_device(ctx_cfg):
    """Point MindSpore at the configured device (refusing one this package cannot drive) and set the execution
    mode, threads and memory; no communication yet. Returns the device target."""
    os.environ.setdefault("GLOG_v", "3")  # MindSpore's INFO/WARNING spam hides our log lines
    from ms_llm.train import compile_cache

    compile_cache.close()  # off until the training step asks for it under its own key (see close)
    import mindspore as ms

    target = device_target(ctx_cfg)
    device_id = ctx_cfg.device_id
    if device_id is None:
        device_id = env.count("DEVICE_ID")
    try:
        if device_id is not None and target != "CPU":
            ms.set_device(target, device_id)
        else:
            ms.set_device(target)
    except (RuntimeError, ValueError) as e:
        if "runtime has been initialized" in str(e) and ms.get_context("device_target") == target:
            pass  # a kernel of this process already ran on this device (a test, a notebook): nothing to change
        elif "Unsupported device target" not in str(e) and "device_target" not in str(e):
            raise
        else:
            raise UserError(unsupported_device(e, target)) from None

    kwargs = {"mode": ms.GRAPH_MODE if ctx_cfg.mode == "graph" else ms.PYNATIVE_MODE}
    if ctx_cfg.jit_level:
        kwargs["jit_config"] = {"jit_level": ctx_cfg.jit_level}
    ms.set_context(**kwargs)
    if ctx_cfg.max_device_memory and target != "CPU":
        ms.runtime.set_memory(max_size=ctx_cfg.max_device_memory)
    if ctx_cfg.num_threads:
        limit_cpu_threads(ctx_cfg.num_threads)
    return target


_THREADS_SET = {}


def unsupported_device(error, target):
    found = re.search(r"one of the \[(.*?)\]", str(error))
    here = found.group(1).replace("'", "") if found else "another device"
    return (f"context.device_target = {target}, but this MindSpore package and host support only {here}. Launch on "
            f"{target} hardware with MindSpore's {target} package (and its driver/toolkit), or try the config here "
            f"with --set context.device_target=auto.")


def release_freed_host_memory():
    """Return the heap memory the process has freed to the OS (glibc's malloc_trim). MindSpore's graph compiler
    frees ~20% of what it allocated, but glibc keeps freed heap pages mapped, so on CPU they would stay in the
    resident set under the training step's memory (about 35-55 MiB for the quickstart-sized step). A no-op
    where the C library has no malloc_trim."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


def limit_cpu_threads(n):
    """MindSpore's CPU kernel threads, set once per process: select_device runs twice in a training process (the
    layout check, then setup_context), and MindSpore refuses a second threads_num call ("can not be set
    repeatedly") even with the same value."""
    if _THREADS_SET.get("num") == n:
        return
    from mindspore.device_context.cpu import op_tuning

    op_tuning.threads_num(n)
    _THREADS_SET["num"] = n


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


def agree(rt, action):
    """Run `action` and make every rank fail if any rank failed, so no rank waits forever on another."""
    error = None
    try:
        action()
    except UserError as e:
        error = e
    if not all_ranks_ok(rt, error is None):
        error = error or UserError("another rank refused to start; its message is in its log (msrun --log_dir, "
                                   "or the run's logs/rank_<r>.log).")
        error.agreed = True
        raise error


def rank0_int(rt, value):
    """Rank 0's value of a non-negative integer below 2^48, on every rank (sent as exact float32 halves)."""
    if rt.world_size == 1:
        return value
    hi, lo = divmod(value, 1 << 24) if rt.rank == 0 else (0, 0)
    return all_ranks_sum(rt, hi) * (1 << 24) + all_ranks_sum(rt, lo)
