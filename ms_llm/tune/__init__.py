"""Hyperparameter search as docs/tuning.md describes it: start from a golden config,
change one dimension at a time (or run a grid), keep every trial as an ordinary run directory, and an LR
range test (`ms-llm debug lr-find`) to place the learning rate before sweeping it.

A trial is `ms-llm train` in a subprocess (MindSpore's global state stays per process, and `--parallel`
needs processes anyway); this package only plans trials, watches their metrics.jsonl, and reads the run
directories back. It uses `ms_llm.train` (lr-find opens a session) and `ms_llm.report` (the sweep page).
"""
