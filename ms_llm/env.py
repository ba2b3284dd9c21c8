"""Every environment variable ms_llm reads, declared once with what it must hold, and read through one function
per kind so that a bad value ends in one paragraph naming the variable, its value and the fix.

A folder variable (the cache, ModelArts' local disk) that points at a file, at a folder this process cannot write,
or at a path that cannot be created is refused before anything is written; an empty one is treated as unset, and
that is said once. A number variable set by a launcher (msrun's MS_WORKER_NUM, RANK_SIZE, DEVICE_ID) that is not a
whole number is refused the same way. tests/test_env.py walks the source for every variable read and fails on one
that is not declared here.
"""
import os
import sys
import tempfile

from ms_llm.errors import UserError

DEFAULT_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "ms_llm")

# name → (kind, what it is for). Kinds: "folder" (read by folder()), "count" (read by count()), and "passed"
# (read as text and handed on unchanged to the library that owns it; no value of it can break ms_llm itself).
DECLARED = {
    "MS_LLM_CACHE": ("folder", "the compile cache, built kernels, demo tasks and diagnose's measurements"),
    "MS_LLM_MODELARTS_CACHE": ("folder", "the local disk a ModelArts job copies its data and checkpoints to"),
    "MS_WORKER_NUM": ("count", "msrun's number of worker processes"),
    "RANK_SIZE": ("count", "the number of devices of a rank-table launch"),
    "DEVICE_ID": ("count", "the device this process drives"),
    "MS_ROLE": ("passed", "msrun's role of this process (MS_SCHED or MS_WORKER)"),
    "RANK_TABLE_FILE": ("passed", "a rank-table launch's table (its presence means a distributed launch)"),
    "GLOG_v": ("passed", "MindSpore's log level"),
    "MS_CUSTOM_AOT_WHITE_LIST": ("passed", "MindSpore's list of folders custom kernels may load from"),
    "CXX": ("passed", "the C++ compiler that builds the CPU kernels (a missing one leaves them off)"),
    "PATH": ("passed", "where subprocesses find ms-llm"),
    "TOKENIZERS_PARALLELISM": ("passed", "the tokenizers library's thread switch"),
    "ASCEND_HOME_PATH": ("passed", "where CANN is installed (read for its version only)"),
    "ASCEND_TOOLKIT_HOME": ("passed", "where CANN is installed (read for its version only)"),
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": ("passed", "mlflow's retries"),
    "MLFLOW_HTTP_REQUEST_TIMEOUT": ("passed", "mlflow's timeout"),
    "MLFLOW_EXPERIMENT_NAME": ("passed", "mlflow's experiment"),
    "SWANLAB_LOG_DIR": ("passed", "swanlab's log folder (swanlab reports its own errors)"),
    "SWANLAB_PROJ_NAME": ("passed", "swanlab's project"),
    "SWANLAB_MODE": ("passed", "swanlab's mode"),
    "OBS_ENDPOINT": ("passed", "the OBS endpoint"),
    "OBS_ACCESS_KEY_ID": ("passed", "OBS credentials"),
    "OBS_SECRET_ACCESS_KEY": ("passed", "OBS credentials"),
    "OBS_SECURITY_TOKEN": ("passed", "OBS credentials"),
    "AWS_ENDPOINT_URL_S3": ("passed", "the S3 endpoint"),
    "AWS_ENDPOINT_URL": ("passed", "the S3 endpoint"),
}

_said = set()


def say_once(message):
    if message not in _said:
        _said.add(message)
        print(f"note: {message}", file=sys.stderr)


def folder(name, default):
    """The folder `name` names (created when missing), or `default` when it is unset or empty; refused in one
    paragraph when it is a file, cannot be created, or cannot be written."""
    value = os.environ.get(name)
    if value is not None and not value.strip():
        say_once(f"{name} is set but empty; using {default}")
        value = None
    path = value if value is not None else default
    where = f"{name}={value!r}" if value is not None else f"the default {default!r} ({name} is unset)"
    fix = f"Point {name} at a folder this user can write, or unset it to use {default}."
    if os.path.exists(path) and not os.path.isdir(path):
        raise UserError(f"{where} is a file, not a folder; ms_llm keeps {DECLARED[name][1]} there. {fix}")
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write_check_"):
            pass
    except OSError as e:
        raise UserError(f"{where} cannot be used as a folder ({e.strerror}); ms_llm keeps {DECLARED[name][1]} "
                        f"there. {fix}") from None
    return path


def folder_path(name, default):
    """Where `name` points (or `default`), without creating or checking it: for readers that only look."""
    value = os.environ.get(name)
    return value if value and value.strip() else default


def cache_root():
    return folder("MS_LLM_CACHE", DEFAULT_CACHE)


def count(name):
    """The whole number `name` holds, or None when it is unset; refused in one paragraph when it is not one."""
    value = os.environ.get(name)
    if value is None:
        return None
    try:
        number = int(value.strip())
    except ValueError:
        number = -1
    if number < 0:
        raise UserError(f"environment variable {name}={value!r} is not a whole number ≥ 0; it is "
                        f"{DECLARED[name][1]}. Set it to a number (the launcher sets it: unset it when not launched "
                        f"by msrun or a rank table).")
    return number
