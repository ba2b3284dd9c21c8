"""What the loop does on which step (ms_llm/train/loop/cadence.py): each cadence on its own steps; the last step
logs and reads the update codes back, and leaves its evaluation and checkpoint to the end of the run."""
from types import SimpleNamespace

from ms_llm.train.loop.cadence import Cadence


def steps(cadence, what, max_steps):
    return [n for n in range(1, max_steps + 1) if getattr(cadence.at(n), what)]


def test_each_cadence_falls_on_its_own_steps():
    c = Cadence(SimpleNamespace(max_steps=20, log_interval=10, eval_interval=6), SimpleNamespace(save_interval=4))
    assert steps(c, "log", 20) == [10, 20]
    assert steps(c, "halt_check", 20) == [8, 16, 20]  # at most 8 steps between host syncs of the codes
    assert steps(c, "eval", 20) == [6, 12, 18]  # step 20's evaluation is the run's final one
    assert steps(c, "save", 20) == [4, 8, 12, 16]


def test_a_short_log_interval_checks_the_codes_with_each_log_and_zero_intervals_are_off():
    c = Cadence(SimpleNamespace(max_steps=5, log_interval=2, eval_interval=0), SimpleNamespace(save_interval=0))
    assert steps(c, "halt_check", 5) == steps(c, "log", 5) == [2, 4, 5]
    assert steps(c, "eval", 5) == steps(c, "save", 5) == []
