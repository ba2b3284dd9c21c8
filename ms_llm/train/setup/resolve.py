"""The config as run, decided once before the session opens.

A loaded config leaves three things open: the data-parallel size (from the launch), the vocabulary (from the
dataset's manifest) and where semi-auto parallel writes its strategy files (from the run directory). `resolve`
fills them in, validates the parallel layout against the result, settles what the layout rules out (the chunked
loss under semi-auto parallel, whose strategies shard the LM head's own matmul: the loss takes the whole logits),
and returns both as one frozen value, with a note for each setting it changed; the loaded config itself is never
changed (its sections are frozen dataclasses).

`check_launch` runs the same rules before the processes of a launch meet (the vocabulary still unknown), so that
a layout the launch cannot run is refused by every rank at once, and by msrun's scheduler, rather than by one
rank while the others wait for it.
"""
from dataclasses import dataclass, replace
from typing import Any, Optional, Tuple

from ms_llm.config import check_against_dataset
from ms_llm.parallel.layout import ParallelPlan, build_plan, with_data_parallel


@dataclass(frozen=True)
class ResolvedConfig:
    cfg: Any  # the config as run: data_parallel, vocabulary and strategy directory filled in
    parallel: ParallelPlan  # its validated parallel layout
    notes: Tuple[str, ...] = ()  # the settings the layout overrode, for the run's log


def resolve(cfg, world_size, device_target, manifest=None, strategy_dir: Optional[str] = None):
    """The config as run for a launch of `world_size` ranks on `device_target`, against the dataset described by
    `manifest` (None: vocabulary rules wait), with semi-auto parallel's strategy files under `strategy_dir`."""
    cfg = with_data_parallel(cfg, world_size, device_target)
    if manifest is not None:
        cfg = check_against_dataset(cfg, manifest, cfg.data.dataset_dir)
    plan = build_plan(cfg, world_size)
    if not plan.semi_auto:
        return ResolvedConfig(cfg, plan)
    notes = ()
    # only semi-auto parallel writes strategy files: elsewhere the path stays as configured, so that it does not tie
    # the config as run (and the compile cache's key) to the run directory
    if strategy_dir and cfg.checkpoint.strategy_dir != strategy_dir:
        cfg = replace(cfg, checkpoint=replace(cfg.checkpoint, strategy_dir=strategy_dir))
    if cfg.train.loss_chunk_tokens:  # the chunked loss has its own head matmul, which the strategies cannot shard
        notes = (f"train.loss_chunk_tokens = {cfg.train.loss_chunk_tokens} is not used under semi-auto parallel "
                 f"(the layout shards the LM head's matmul); the loss takes the whole logits",)
        cfg = replace(cfg, train=replace(cfg.train, loss_chunk_tokens=0))
    return ResolvedConfig(cfg, build_plan(cfg, world_size), notes)


def check_launch(cfg, world_size, device_target):
    """Refuse (UserError) a config this launch cannot run, before the ranks meet."""
    resolve(cfg, world_size, device_target)
