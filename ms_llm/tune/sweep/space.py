"""What a sweep is: the golden config (file + --set), the varied keys and their values, the trial length, the
metric and the strategy. `Spec` is checked once, before any trial starts, and compared with the spec stored in
an existing sweep directory (a resumed sweep must be the same sweep).

A trial is identified by the values of every varied key, so the same point reached twice (one-at-a-time often
comes back to it) is one trial, run once; its directory name is made of those values.
"""
import hashlib
import os
import re
from dataclasses import asdict, dataclass, field

from ms_llm.errors import UserError
from ms_llm.tune.values import parse_vary, show

STRATEGIES = ("one-at-a-time", "grid")
METRICS = ("val_loss", "best_val_loss", "loss")
# The divergence rule (ms-llm diagnose) compares trailing medians of 5 log records for 3 records in a row, so a
# trial needs about 8 records before it can be stopped early; 30 per trial leaves room to stop well before the end.
RECORDS_PER_TRIAL = 30
# Checkpoints per trial: an interrupted sweep loses at most a fifth of the trial that was running.
SAVES_PER_TRIAL = 5


@dataclass
class Spec:
    config: str
    overrides: list  # the user's --set, applied to every trial (part of the golden config)
    vary: dict  # key -> [values], in --vary order (one-at-a-time tunes the keys in this order)
    strategy: str = "one-at-a-time"
    steps: int = None
    metric: str = "val_loss"
    rounds: int = 3
    halving: bool = False
    config_sha256: str = ""
    fixed: list = field(default_factory=list)  # what the sweep adds to every trial: steps, log and save intervals
    golden: dict = field(default_factory=dict)  # the config's own value of each varied key

    def to_dict(self):
        return asdict(self)

    def identity(self):
        """What makes two sweeps' trials at the same values the same runs: the golden config and the trial
        length. The plan (--vary, --strategy, --rounds, --halving, --metric) may change between invocations:
        extending a range reruns nothing already run."""
        return {"config": os.path.abspath(self.config), "config_sha256": self.config_sha256,
                "overrides": list(self.overrides), "steps": self.steps, "fixed": list(self.fixed)}


def build_spec(config, overrides, vary_args, strategy, steps, metric, rounds, halving):
    from ms_llm.config import load_config

    if not vary_args:
        raise UserError("sweep needs at least one --vary KEY=VALUES, e.g. --vary train.lr=1e-4,3e-4,1e-3.")
    if strategy not in STRATEGIES:
        raise UserError(f"--strategy {strategy!r} is not one of {', '.join(STRATEGIES)}.")
    if metric not in METRICS:
        raise UserError(f"--metric {metric!r} is not one of {', '.join(METRICS)} (val_loss: the validation loss at "
                        f"the end of the trial; best_val_loss: the lowest of its evaluations; loss: its final "
                        f"training loss).")
    if steps is not None and steps < 1:
        raise UserError(f"--steps {steps} must be a positive number of optimizer steps per trial, e.g. --steps 300.")
    if rounds < 1:
        raise UserError(f"--rounds {rounds} must be at least 1 (one pass over the varied keys).")
    vary = {}
    for text in vary_args:
        key, values = parse_vary(text)
        if key in vary:
            raise UserError(f"--vary {key} is given twice. Give each key once, with all its values: "
                            f"--vary {key}=V1,V2,...")
        vary[key] = values
    if "train.max_steps" in vary:
        raise UserError("--vary train.max_steps: the trial length is the sweep's --steps (early stopping and "
                        "successive halving read the trials at fractions of it). Run one sweep per length instead.")
    for key in vary:
        if any(o.partition("=")[0].strip() == key for o in overrides):
            raise UserError(f"{key} is both varied (--vary) and fixed (--set). Remove one: the golden value of a "
                            f"varied key is the config's, or fix it with --set and do not vary it.")
    golden_cfg = load_config(config, overrides)  # the golden config itself must load (names the bad --set)
    steps = steps or golden_cfg.train.max_steps
    fixed = economy_overrides(golden_cfg, overrides, steps)
    base = load_config(config, overrides + fixed)
    for key, values in vary.items():  # first: the loader's refusal names a misspelt key's closest match
        for v in values:
            check_point(config, overrides + fixed, {key: v}, f"--vary {key}={show(v)}")
    golden = {k: config_value(base, k) for k in vary}
    with open(config, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    return Spec(config, list(overrides), vary, strategy, steps, metric, rounds, halving, sha, fixed, golden)


def economy_overrides(cfg, overrides, steps):
    """Settings the sweep adds to every trial unless the user fixed them with --set: the trial length, a log
    interval fine enough for early stopping, and checkpoints often enough to resume an interrupted trial."""
    given = {o.partition("=")[0].strip() for o in overrides}
    out = [f"train.max_steps={steps}"]
    log = max(1, steps // RECORDS_PER_TRIAL)
    if "train.log_interval" not in given and cfg.train.log_interval > log:
        out.append(f"train.log_interval={log}")
    if "checkpoint.save_interval" not in given:
        out.append(f"checkpoint.save_interval={max(1, steps // SAVES_PER_TRIAL)}")
    return out


def config_value(cfg, key):
    from ms_llm.config import to_dict

    node = to_dict(cfg)
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            raise UserError(f"--vary {key}: no such config key. Keys are SECTION.KEY as in the YAML, e.g. train.lr.")
        node = node[part]
    return node


def check_point(config, base_overrides, values, what):
    """Load the config with these values; a refusal names the --vary value that caused it."""
    from ms_llm.config import load_config

    try:
        return load_config(config, base_overrides + point_overrides(values))
    except UserError as e:
        raise UserError(f"{what}: {e}") from None


def point_overrides(values):
    return [f"{k}={show(v)}" for k, v in values.items()]


def trial_name(values):
    """'lr=0.001_weight_decay=0.1': the last part of each key (the whole key where two share it), its value."""
    lasts = [k.rsplit(".", 1)[-1] for k in values]
    parts = []
    for (k, v), last in zip(values.items(), lasts):
        label = last if lasts.count(last) == 1 else k
        parts.append(f"{label}={show(v)}")
    return re.sub(r"[^A-Za-z0-9=._,+\-\[\]]", "-", "_".join(parts))


def same_point(a, b):
    return all(a.get(k) == b.get(k) for k in set(a) | set(b))
