"""The run plan: decided once, before the session opens — which directory the run writes, which checkpoint it
resumes from, which rank saves, where parallel strategy files go. Every rank reaches the same plan, or every
rank refuses with the same message."""
import os
import time
from dataclasses import dataclass
from typing import Optional

from ms_llm.parallel.layout import uses_semi_auto
from ms_llm.rundir import writer as rd
from ms_llm.train.setup.context import agree, rank0_int
from ms_llm.train.setup.resume import check_remote, find_checkpoint, has_checkpoints


@dataclass(frozen=True)
class RunPlan:
    run_dir: str
    ckpt_rank: int  # the rank whose checkpoints this rank writes and reads
    checkpoint: Optional[tuple]  # (path, manifest) of the checkpoint to resume from; None for a new run
    strategy_dir: Optional[str]  # semi-auto parallel strategy files
    load_weights: Optional[str]  # initial weights of a new run (checkpoint.load_weights)
    weights_only: bool = False

    @property
    def resume(self):
        return self.checkpoint is not None

    @property
    def fresh_start(self):
        """The first step runs from the config's own initialisation (what the compile cache can verify)."""
        return self.checkpoint is None and not self.load_weights


def plan_run(cfg, rt, run_dir, resume, weights_only, config_path, log):
    # semi-auto parallel ranks hold different shards: each saves its own; data-parallel replicas share rank 0's
    ckpt_rank = rt.rank if uses_semi_auto(cfg.parallel_config) else 0
    run_dir = run_dir or default_run_dir(rt, config_path)
    agree(rt, lambda: rd.check_run_dir_path(run_dir))
    strategy_dir = cfg.checkpoint.strategy_dir or os.path.join(run_dir, "strategy")
    if cfg.checkpoint.remote_dir:
        agree(rt, lambda: check_remote(cfg.checkpoint))
    if resume or cfg.checkpoint.auto_resume:  # an empty local run directory is filled from remote_dir first
        resume = has_checkpoints(run_dir, ckpt_rank, rt, cfg, log) or resume
    agree(rt, lambda: rd.check_run_dir(run_dir, resume))
    found = []
    if resume:
        agree(rt, lambda: found.append(find_checkpoint(run_dir, ckpt_rank, log)))
    return RunPlan(run_dir, ckpt_rank, found[0] if found else None, strategy_dir,
                   None if resume else cfg.checkpoint.load_weights, weights_only)


def default_run_dir(rt, config_path):
    """runs/<config>-<time>, the same on every rank (rank clocks can straddle a second)."""
    import datetime

    stamp = rank0_int(rt, int(time.time()))
    stem = os.path.splitext(os.path.basename(config_path))[0] if config_path else "run"
    return os.path.join("runs", f"{stem}-{datetime.datetime.fromtimestamp(stamp):%Y%m%d-%H%M%S}")
