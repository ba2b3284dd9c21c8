"""`ms-llm debug ladder`: plain first, then one optimisation per rung (run.py), each judged against the rung before
(verdict.py); the rungs planned (plan.py), launched (launch.py) and printed (output.py)."""
