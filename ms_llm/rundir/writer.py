"""The run directory: one per run, never overwritten. Its layout is in the README ("What a run leaves behind")."""
import datetime
import json
import os
import platform
import socket
import subprocess
import sys

from ms_llm.errors import UserError
from ms_llm.fileio import atomic_write_bytes


def check_run_dir_path(run_dir):
    """Refuse a run directory that cannot be created: a file in its place or on its path, or no permission."""
    if os.path.exists(run_dir) and not os.path.isdir(run_dir):
        raise UserError(f"--run-dir '{run_dir}' is a file, not a directory. Nothing was changed; choose another path.")
    parent = os.path.dirname(os.path.abspath(run_dir))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise UserError(f"--run-dir '{run_dir}' lies under '{parent}', which is a file, not a directory. Nothing was "
                        f"changed; choose a path under a directory.")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"--run-dir '{run_dir}': no permission to create it in '{parent}'. Choose a directory you "
                        f"can write to.")


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
    for sub in ("", "checkpoints"):
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


def update_run_info(run_dir, **fields):
    path = os.path.join(run_dir, "run_info.json")
    with open(path, encoding="utf-8") as f:
        info = json.load(f)
    info.update(fields)
    write_json(path, info)


def write_config(cfg, path, save):
    """The config as run, written where the run directory is; a filesystem error becomes one paragraph."""
    try:
        save(cfg, path)
    except OSError as e:
        raise UserError(f"cannot write {path} ({e.strerror}). Check the disk and permissions of the run directory; "
                        f"nothing else was written.") from None
