"""Which framework wrote these logs, and which files of a folder are its logs.

A folder is searched three levels deep for log files (*.log, *.txt, *.out, *.err, and msrun's worker_K.log,
MindFormers' output/log/rank_K/info.log, torchrun's <attempt>/K/stdout.log), in rank order. The format is the
reader whose training line matches the most lines; a tie or no match at all leaves the choice to --format.
"""
import os
import re

from ms_llm.errors import UserError
from ms_llm.rundir.foreign import megatron, mindformers, torchtitan
from ms_llm.rundir.foreign.logtext import file_rank

READERS = {m.NAME: m for m in (megatron, mindformers, torchtitan)}
FORMATS = ("auto",) + tuple(READERS)
LOG_NAMES = re.compile(r"(\.(log|txt|out|err)(\.\d+)?$)|^worker_\d+|^std(out|err)", re.I)
NOT_LOGS = ("metrics.jsonl", "stats.jsonl", "telemetry.jsonl")
MAX_FILES = 512
SAMPLE_LINES = 20000  # lines per file that detection looks at (the training lines start early)


def log_files(path):
    """The log files of `path` (itself when it is a file), ordered by rank then name."""
    if os.path.isfile(path):
        return [path]
    found = []
    for here, dirs, files in os.walk(path):
        depth = os.path.relpath(here, path).count(os.sep) + (here != path)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".")) if depth < 3 else []
        for name in files:
            if name in NOT_LOGS or not LOG_NAMES.search(name):
                continue
            found.append(os.path.join(here, name))
        if len(found) > MAX_FILES:
            break
    rank = lambda f: (file_rank(f) is None, file_rank(f) or 0, f)  # noqa: E731
    return sorted(found, key=rank)[:MAX_FILES]


def scores(physical):
    """{format: lines matching its training line} over the files' cleaned lines."""
    out = {name: 0 for name in READERS}
    for lines in physical.values():
        sample = lines[:SAMPLE_LINES]
        for i, line in enumerate(sample):
            for name, mod in READERS.items():
                if mod.starts(line.text):
                    out[name] += 1
                elif i + 1 < len(sample) and mod.starts(line.text + sample[i + 1].text) and \
                        not mod.starts(sample[i + 1].text):
                    out[name] += 1  # a wrap fell inside the record's mark
    return out


def detect(physical, path):
    found = scores(physical)
    best = max(found.values())
    winners = [name for name, n in found.items() if n == best]
    if best == 0:
        raise UserError(f"'{path}' holds no training line of Megatron-LM / MindSpeed-LLM ('iteration N/ M | ... |'), "
                        f"MindFormers ('{{ Epoch:[..], step:[..], loss: ..') or torchtitan ('step: N  loss: ..') in "
                        f"{len(physical)} file(s), and it is not a run directory (no metrics.jsonl). Pass the log "
                        f"the training printed (or the folder of its worker logs), or force a reader with --format "
                        f"{'|'.join(READERS)}.")
    if len(winners) > 1:
        raise UserError(f"'{path}' has as many training lines of {' and '.join(winners)} ({best} each): say which "
                        f"with --format {'|'.join(winners)}.")
    return winners[0]
