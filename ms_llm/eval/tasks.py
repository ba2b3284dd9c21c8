"""Which lm-eval tasks an evaluation runs, found before any model is loaded: the names checked against the task index
(--include-path folders, the bundled demo task, then lm-eval's own ~15,000), and the local data files of every task
checked on disk, so that a typo or a missing file is one paragraph instead of a traceback minutes in.

Indexing lm-eval's own tasks reads thousands of YAML files (about 15 s); when every name is found in the include
paths and the demo task, that index is not built.
"""
import difflib
import glob
import os

from ms_llm.errors import UserError
from ms_llm.eval import demo_task

LOCAL_BUILDERS = ("json", "csv", "parquet", "text", "arrow")  # datasets' builders that read data_files


def task_manager(names, include_paths=(), log=print):
    """(lm-eval TaskManager that knows every name, the names) for task names (or YAML paths, or globs)."""
    from lm_eval.tasks import TaskManager

    for path in include_paths:
        if not os.path.isdir(path):
            raise UserError(f"--include-path '{path}' is not a folder. Give the folder holding your task YAML files "
                            f"(it is searched recursively).")
    if not names:
        raise UserError("--tasks is empty. Name one task or more, comma-separated, e.g. --tasks shakespeare_cloze.")
    paths = list(include_paths)
    if demo_task.NAME in names:
        paths.append(demo_task.write_task())
    manager = TaskManager(include_path=paths or None, include_defaults=False) if paths else None
    if manager is None or unknown(manager, names):
        log("indexing lm-eval's own tasks (about 15 s) ...")
        manager = TaskManager(include_path=paths or None)
    missing = unknown(manager, names)
    if missing:
        raise UserError(unknown_message(missing, manager, include_paths))
    for name in names:
        check_data_files(manager, name)
    return manager, names


def unknown(manager, names):
    return [n for n in names if not manager.match_tasks([n]) and not (n.endswith((".yaml", ".yml"))
                                                                      and os.path.isfile(n))]


def unknown_message(missing, manager, include_paths):
    hints = []
    for name in missing:
        close = difflib.get_close_matches(name, manager.all_tasks, n=3, cutoff=0.75)
        hints.append(f"'{name}'" + (f" (did you mean {', '.join(close)}?)" if close else ""))
    where = f"the task YAML files under {', '.join(include_paths)}, " if include_paths else ""
    return (f"unknown task {', '.join(hints)}: not among {where}the bundled {demo_task.NAME} or lm-eval's "
            f"{len(manager.all_tasks):,} tasks, groups and tags. Check the spelling (`lm_eval ls tasks` lists "
            f"lm-eval's), or pass --include-path with the folder of your own task YAML (docs/evaluation.md).")


def check_data_files(manager, name, seen=None):
    """A local task's data files must exist (datasets resolves them against the current directory)."""
    seen = set() if seen is None else seen
    for entry_name in manager.match_tasks([name]) or []:
        if entry_name in seen:
            continue
        seen.add(entry_name)
        entry = manager.task_index.get(entry_name)
        cfg = getattr(entry, "cfg", None) or {}
        children = cfg.get("task") if isinstance(cfg.get("task"), list) else []
        for child in children:  # a group: its tasks, by name or inline config
            if isinstance(child, str):
                check_data_files(manager, child, seen)
        missing = missing_files(cfg)
        if missing:
            where = f" ({entry.yaml_path})" if getattr(entry, "yaml_path", None) else ""
            raise UserError(f"task '{entry_name}'{where} reads {cfg.get('dataset_path')} data files that do not exist: "
                            f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}. Relative paths are "
                            f"relative to the current directory ({os.getcwd()}). Fix dataset_kwargs.data_files in the "
                            f"task's YAML, or download the files there (docs/evaluation.md).")


def missing_files(cfg):
    """The data_files (and data_dir) of a task config that are not on disk, for datasets' local builders."""
    kwargs = cfg.get("dataset_kwargs") or {}
    if cfg.get("dataset_path") not in LOCAL_BUILDERS or not isinstance(kwargs, dict):
        return []
    files = kwargs.get("data_files")
    flat = []
    for value in (files.values() if isinstance(files, dict) else [files]):
        flat += value if isinstance(value, (list, tuple)) else [value]
    out = [f for f in flat if isinstance(f, str) and not (glob.glob(f) if glob.has_magic(f) else os.path.exists(f))]
    data_dir = kwargs.get("data_dir")
    if isinstance(data_dir, str) and not os.path.isdir(data_dir):
        out.append(data_dir)
    return out
