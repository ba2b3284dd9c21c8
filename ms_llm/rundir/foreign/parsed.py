"""What a framework's reader hands on: its records in ms_llm's names, before they are ordered into one run
(assemble.py chooses the rank that logged the loss, drops the lines other ranks repeated, finds restarts)."""
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Parsed:
    framework: str                             # "Megatron-LM", "MindSpeed-LLM", "MindFormers", "torchtitan"
    train: list = field(default_factory=list)  # (rank, order, record): a log line's metrics in ms_llm's names
    evals: list = field(default_factory=list)  # (rank, order, {"step", "val_loss"})
    events: list = field(default_factory=list)  # (rank, order, {"step", "event", ...})
    config: dict = field(default_factory=dict)  # ms_llm's nested config, where the log or a file beside it says
    config_source: str = ""                     # where the config came from ("" when the log has none)
    config_notes: list = field(default_factory=list)
    info: dict = field(default_factory=dict)    # version, max_steps, world size, ... (what the log says)
    counts: Counter = field(default_factory=Counter)  # what was read and what was left out, by reason
    features: set = field(default_factory=set)  # the line's variants seen (which fields, prefixes): the version
    absent: dict = field(default_factory=dict)  # field -> why this framework's log lacks it
    ended: bool = False                         # the log says training finished
    restarts: list = field(default_factory=list)  # (rank, order, step): a process that started again at step
