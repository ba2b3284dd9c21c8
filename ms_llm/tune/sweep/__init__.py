"""`ms-llm sweep`: trials of a golden config varied one key at a time or on a grid (space.py, strategy.py), run
and watched (runner.py, trial.py, progress.py), ranked (results.py), on one machine or a cluster (cluster.py)."""
