"""The run directory: one per run, never overwritten. See ARCHITECTURE.md for its layout."""
import datetime
import json
import os
import platform
import socket
import subprocess
import sys

from ms_llm.errors import UserError
from ms_llm.fileio import atomic_write_bytes


def check_run_dir(run_dir, resume):
    """Refuse to write into a run that exists unless resuming it; refuse to resume what is not there."""
    exists = os.path.isdir(run_dir) and bool(os.listdir(run_dir))
    if exists and not resume:
        raise UserError(f"run directory '{run_dir}' already exists and holds a run. Nothing was changed. Choose a new "
                        f"--run-dir, or pass --resume to continue that run.")
    if resume and not exists:
        raise UserError(f"--resume: run directory '{run_dir}' does not exist or is empty, so there is nothing to "
                        f"resume. Drop --resume to start a new run there.")
    if os.path.exists(run_dir) and not os.path.isdir(run_dir):
        raise UserError(f"--run-dir '{run_dir}' is a file, not a directory. Choose another path.")


def create_run_dir(run_dir):
    for sub in ("", "checkpoints", "logs"):
        os.makedirs(os.path.join(run_dir, sub), exist_ok=True)


def git_revision():
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=here, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if rev.returncode != 0:
        return None
    return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def run_info(rt, cfg, extra=None):
    import mindspore as ms
    import numpy as np

    info = {
        "start_time": datetime.datetime.now().isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "host": socket.gethostname(),
        "versions": {"python": platform.python_version(), "mindspore": ms.__version__, "numpy": np.__version__,
                     "ms_llm": __import__("ms_llm").__version__},
        "platform": platform.platform(),
        "device": {"target": rt.device_target, "cpu_count": os.cpu_count()},
        "git_revision": git_revision(),
        "parallel": {"world_size": rt.world_size, "data_parallel": cfg.parallel_config.data_parallel,
                     "model_parallel": cfg.parallel_config.model_parallel,
                     "pipeline_stage": cfg.parallel_config.pipeline_stage},
    }
    cann = os.environ.get("ASCEND_TOOLKIT_HOME") or os.environ.get("ASCEND_HOME_PATH")
    if cann:
        info["device"]["cann_home"] = cann
    info.update(extra or {})
    return info


def write_json(path, obj):
    atomic_write_bytes(path, json.dumps(obj, indent=1).encode())
