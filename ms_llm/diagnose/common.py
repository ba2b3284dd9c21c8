"""Shared pieces of `ms-llm diagnose`: the Finding record, the thresholds and the helpers the rules use.

The thresholds are documented (with the reason for each value) in docs/debugging.md; they were set so
that healthy runs produce no finding at all.
"""
import contextlib
import os
import re
from dataclasses import asdict, dataclass, field

from ms_llm.errors import UserError
from ms_llm import env
from ms_llm.rundir import divergence
from ms_llm.rundir.divergence import finite, nonfinite  # noqa: F401 (the rules' helpers, shared with the tools)

MIN_RECORDS = 4          # loss-curve rules need at least this many log records
STUCK_VAL, STUCK_TRAIN_DROP = 0.95, 0.2  # val never below 95% of ln(vocab) while train fell 20%: labels
FLAT_MIN_STEPS, FLAT_REL_DROP, UNIFORM_FRAC = 100, 0.02, 0.95
ZERO_LOSS, VAL_GAP_ABS, VAL_GAP_REL = 0.1, 1.0, 0.5
SPIKE_WINDOW, SPIKE_MIN_WINDOW, SPIKE_Z, SPIKE_REL = 50, 8, 5.0, 0.10
DATA_WAIT_FRAC = 0.10
SLOW_FRAC, SLOW_SHARE, SLOW_MIN_RECORDS = 0.7, 0.2, 6
LOW_MFU, LOW_MFU_MIN_HIDDEN = 0.10, 1024
OVERFLOW_SHARE, OVERFLOW_MIN = 0.05, 10
SCALE_DROPS_MIN, SCALE_DROPS_SHARE = 4, 0.25
MEMORY_FRAC = 0.9
CLIP_SHARE, CLIP_RATIO = 0.9, 2.0
CPU_RAM_SHARE = 0.9      # default memory limit of a CPU run: 0.9 x this machine's RAM
SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}

CONFIDENCE = ("high", "medium", "low")


@dataclass
class Explains:
    """What a finding says about another: it explains it (the engine puts `cause` first in it, engine.compose)."""
    target: str      # the id of the finding explained
    cause: str       # the cause that leads it
    action: str = ""  # the action that goes first in it
    line: str = ""   # the evidence line that ties the two
    key: str = ""    # a setting: the target's causes that already name it are folded into `cause`


@dataclass
class Finding:
    id: str
    severity: str  # error | warning | info (info never fails the exit code)
    symptom: str
    evidence: list
    causes: list  # most likely first, each ending in "[confidence: high|medium|low]" (see cause())
    actions: list
    steps: list = field(default_factory=list)  # the steps the evidence cites
    explains: list = field(default_factory=list)    # [Explains]: the findings this one is the cause of
    supersedes: list = field(default_factory=list)  # ids of findings this one withdraws (it explains them better)

    @property
    def confidence(self):
        """The confidence of the first (most likely) cause, or "" when it states none."""
        m = re.search(r"\[confidence: (\w+)\]$", self.causes[0]) if self.causes else None
        return m.group(1) if m else ""

    def to_dict(self):
        return dict(asdict(self), confidence=self.confidence)


def cause(text, confidence):
    """A cause with how sure the evidence makes us: high (the evidence points at it and at little else), medium
    (it fits, and so does another cause, named next to it), low (possible; nothing seen for or against it)."""
    assert confidence in CONFIDENCE, confidence
    return f"{text} [confidence: {confidence}]"


# --- helpers ---------------------------------------------------------------------------------------------

# (id(records), len(records), what) -> (records, value), alive only inside `memoised()` (one diagnosis): the rules
# ask for the same points of a 100k-record run many times. The entry holds the records themselves, so their id
# cannot be reused meanwhile. Outside a diagnosis (the sweep's watcher applies single rules to trials it re-reads for
# hours) nothing is remembered, so nothing grows.
_MEMO = None


@contextlib.contextmanager
def memoised():
    """Remember computed points for the duration of one diagnosis."""
    global _MEMO
    _MEMO = {}
    try:
        yield
    finally:
        _MEMO = None


def _memo(records, what, compute):
    if _MEMO is None:
        return compute()
    k = (id(records), len(records), what)
    if k not in _MEMO:
        _MEMO[k] = (records, compute())
    return _MEMO[k][1]


def points(records, key):
    return _memo(records, key, lambda: [(r["step"], r[key]) for r in records if finite(r.get(key))])


def first_nonfinite_step(run):
    return _memo(run.train, "first non-finite loss", lambda: divergence.first_nonfinite_step(run))


def curve(run):
    """Finite (step, loss) points before the first non-finite loss: what the shape rules look at."""
    stop = first_nonfinite_step(run)
    return [(s, v) for s, v in points(run.train, "loss") if stop is None or s < stop]


def g(x):
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def quoted(path):
    """A path as it can be pasted into a shell command (actions quote the run directory)."""
    return f"'{path}'" if any(c in path for c in " \t'\"$") else path


def steps_text(steps, limit=10):
    more = f" (+{len(steps) - limit} more)" if len(steps) > limit else ""
    return ", ".join(str(s) for s in steps[:limit]) + more


def lr_actions(run):
    """Lower the peak LR, lengthen the warmup: by the run's own values where its config states them."""
    lr, warm, n = run.cfg("train.lr"), run.cfg("train.warmup_steps"), run.max_steps or 0
    return [f"--set train.lr={lr / 3:.2g} (a third of {g(lr)})" if lr else
            "a third of the peak learning rate (the log does not state it)",
            f"--set train.warmup_steps={max(2 * warm, n // 10, 100)} (now {warm})" if warm is not None else
            f"a warmup of {max(n // 10, 100)} steps or more (the log does not state the run's)"]


def memory_limit_gib(text, run):
    """--device-memory, else context.max_device_memory on an accelerator, else 0.9 x RAM on CPU, else None."""
    if text:
        return parse_size_gib(text, "--device-memory")
    target = (run.info.get("device") or {}).get("target") or run.cfg("context.device_target")
    if target != "CPU" and run.cfg("context.max_device_memory"):
        return parse_size_gib(run.cfg("context.max_device_memory"), "context.max_device_memory")
    if target == "CPU":
        total = ram_gib()
        return CPU_RAM_SHARE * total if total else None
    return None


def parse_size_gib(text, what):
    """'64GB', '58G', '64GiB', '512MB', '1TB' or a bare number (GiB) → GiB (MindSpore's GB is 1024^3)."""
    s = str(text).strip().upper().replace("IB", "B")
    units = {"TB": 1024, "T": 1024, "GB": 1, "G": 1, "MB": 1 / 1024, "M": 1 / 1024}
    unit = next((u for u in units if s.endswith(u)), "")
    try:
        value = float(s[: len(s) - len(unit)]) * units.get(unit, 1)
    except ValueError:
        value = -1
    if value <= 0:
        raise UserError(f"{what} = '{text}' is not a memory size. Write it like 64GB, 58GB or 512MB.")
    return value


def cache_dir(*parts):
    """~/.cache/ms_llm/diagnose/... (or $MS_LLM_CACHE/diagnose/...): what diagnose computes once per dataset."""
    root = env.cache_root()
    return os.path.join(root, "diagnose", *parts)


def ram_gib():
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 1024 ** 2
    except (OSError, ValueError, IndexError):
        pass
    return None
