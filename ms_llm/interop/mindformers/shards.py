"""Rank-sharded MindFormers checkpoints (rank_<r>/*.ckpt + the strategy files semi-auto parallel saved) →
one full checkpoint, through MindSpore's own `transform_checkpoints`: the layouts are MindSpore's, so is
the merge."""
import glob
import os
import re

from ms_llm.errors import UserError


def rank_files(src):
    ranks = sorted((d for d in os.listdir(src) if re.fullmatch(r"rank_\d+", d)), key=lambda d: int(d[5:]))
    if not ranks:
        raise UserError(f"'{src}' holds no rank_<r>/ folders: give a MindFormers checkpoint file, or the folder of "
                        f"its per-rank shards (output/checkpoint/ with rank_0/, rank_1/, ...).")
    files = {}
    for r in ranks:
        found = sorted(f for f in os.listdir(os.path.join(src, r)) if f.endswith(".ckpt"))
        if len(found) != 1:
            raise UserError(f"'{os.path.join(src, r)}' holds {len(found)} .ckpt files ({', '.join(found[:4]) or 'none'}"
                            f"{' ...' if len(found) > 4 else ''}); MindSpore's merge takes exactly one per rank (it "
                            f"would silently pick the alphabetically last). Copy the step you want into a folder with "
                            f"one checkpoint per rank_<r>/ and give that folder.")
        files[r] = os.path.join(src, r, found[0])
    return files


def merge_rank_shards(src, strategy, work, log=print):
    """Path of one full checkpoint merged from `src`/rank_<r>/ under `strategy` (a file, or a folder of the
    per-stage files pipeline parallelism leaves, merged first with `merge_pipeline_strategys`)."""
    import mindspore as ms

    files = rank_files(src)
    if len(files) == 1 and not strategy:
        return next(iter(files.values()))
    if not strategy or not os.path.exists(strategy):
        raise UserError(f"'{src}' holds {len(files)} rank shards: merging them needs the strategy file(s) MindFormers "
                        f"saved (output/strategy/ckpt_strategy_rank_0.ckpt, or the folder of them with pipeline "
                        f"parallelism). Pass --strategy PATH" + (f" ('{strategy}' does not exist)." if strategy else "."))
    if os.path.isdir(strategy):
        merged = os.path.join(work, "merged_strategy.ckpt")
        try:
            ms.merge_pipeline_strategys(strategy, merged)
        except (ValueError, RuntimeError, TypeError) as e:
            raise UserError(f"--strategy '{strategy}': MindSpore could not merge the strategy files in it "
                            f"({str(e).splitlines()[0][:200]}).") from None
        strategy = merged
    out = os.path.join(work, "full")
    os.makedirs(out, exist_ok=True)
    log(f"merging {len(files)} rank shards of '{src}' with MindSpore's transform_checkpoints ...")
    try:
        ms.transform_checkpoints(src, out, "full", src_strategy_file=strategy, dst_strategy_file=None)
    except (ValueError, RuntimeError, TypeError, KeyError) as e:
        raise UserError(f"MindSpore's transform_checkpoints could not merge the shards in '{src}' with strategy "
                        f"'{strategy}' ({str(e).splitlines()[0][:300]}). Check that the strategy file belongs to "
                        f"the run that saved these shards.") from None
    merged = glob.glob(os.path.join(out, "rank_0", "*.ckpt"))
    if not merged:
        raise UserError(f"MindSpore's transform_checkpoints wrote no merged checkpoint for '{src}'.")
    return merged[0]
