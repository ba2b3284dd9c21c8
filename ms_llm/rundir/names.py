"""The names of a run directory's files and folders, in one place (the layout is in the README, "What a run leaves
behind"). Every module that reads or writes a run directory takes its names from here."""
import os
import re

CONFIG = "config.yaml"  # the resolved config, exactly as run
RUN_INFO = "run_info.json"  # versions, device, host, git revision, command line, layout, final results
METRICS = "metrics.jsonl"  # one JSON object per log interval, evaluation and event
REPORT = "report.html"
TELEMETRY = "telemetry.jsonl"  # rank 0's; other ranks write telemetry_rank_<r>.jsonl
STATS = "stats.jsonl"  # monitor.tensor_stats records
BENCHMARK = "benchmark.json"  # `ms-llm benchmark --output RUN/benchmark.json`: what diagnose compares speed with
BISECT = "bisect.json"  # `ms-llm debug bisect` (and `diagnose --measure`): the settings that explain a metric
BISECT_DIR = "bisect"  # ... its short runs, their configs and logs
LOGS = "logs"  # train.log (rank 0's console) and rank_<r>.log
TRAIN_LOG = "train.log"
CHECKPOINTS = "checkpoints"  # rank_<r>/step_<n>.ckpt + .json, latest
SUMMARY = "summary"  # MindSpore Insight
TENSORBOARD = "tensorboard"
NAN = "nan"  # monitor.nan_check's saved steps
PROFILE = "profile"
TRACKERS = "trackers.json"  # the experiment trackers' run ids, so that a resume continues the same tracker runs
RUN_FILES = (METRICS, CONFIG, RUN_INFO, TRACKERS)  # what a remote copy of a run holds beside its checkpoints

_RESUME = re.compile(r"config\.resume_(\d+)\.yaml")


def resume_config(step):
    """The config a resume at `step` ran with."""
    return f"config.resume_{step}.yaml"


def telemetry(rank):
    return TELEMETRY if rank == 0 else f"telemetry_rank_{rank}.jsonl"


def rank_log(rank):
    return f"rank_{rank}.log"


def rank_checkpoints(run_dir, rank):
    return os.path.join(run_dir, CHECKPOINTS, f"rank_{rank}")


def resume_configs(run_dir):
    """[(step, file name)] of the run's resume configs, oldest first."""
    found = []
    if os.path.isdir(run_dir):
        for name in os.listdir(run_dir):
            m = _RESUME.fullmatch(name)
            if m:
                found.append((int(m.group(1)), name))
    return sorted(found)


def run_config_path(run_dir):
    """The config a run ended with: a resumed run writes config.resume_<step>.yaml next to config.yaml (its
    settings may have changed, max_steps say), so the newest of those; else config.yaml."""
    resumed = resume_configs(run_dir)
    return os.path.join(run_dir, resumed[-1][1] if resumed else CONFIG)
