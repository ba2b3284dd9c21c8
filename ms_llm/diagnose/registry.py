"""The diagnosis's rules, each registered once by `@rule(...)` with what it finds and what it reads.

    @rule(finds=("divergence",), reads=("loss_nonfinite",), live=CHEAP)
    def rule_divergence(run, found, limit): ...

- `finds`: the ids of the findings the rule returns ("config_*" for a family of ids);
- `reads`: the ids of other rules' findings it looks at in `found` (it runs after every rule that finds them);
- `live`: when the diagnosis during training (live.py) runs it: CHEAP at every log interval, EVAL at evaluations,
  OFFLINE never (it reads other runs' directories or whole log files).

The order in which rules run follows from `reads` (a topological order; rules that read nothing keep the order
their modules register them in, ms_llm/diagnose/rules/__init__.py), and the order of the findings from what
explains what (engine.ordered). No rule edits another rule's finding: a finding that explains another says so in
`Finding.explains`, and the engine puts that cause first in the finding it explains (engine.compose).
"""
import fnmatch
from dataclasses import dataclass
from typing import Callable, Tuple

CHEAP, EVAL, OFFLINE = "cheap", "eval", "offline"


@dataclass(frozen=True)
class Rule:
    name: str
    fn: Callable
    finds: Tuple[str, ...]
    reads: Tuple[str, ...]
    live: str
    module: str = ""
    line: int = 0

    def finds_id(self, fid):
        return any(fnmatch.fnmatchcase(fid, pattern) for pattern in self.finds)


REGISTERED = []


def rule(finds, reads=(), live=EVAL):
    """Register a rule (see the module's docstring)."""
    assert live in (CHEAP, EVAL, OFFLINE), live

    def register(fn):
        REGISTERED.append(Rule(fn.__name__, fn, tuple(finds), tuple(reads), live, fn.__module__.rpartition(".")[2],
                               fn.__code__.co_firstlineno))
        return fn
    return register


def ordered_rules():
    """Every registered rule, each after the rules whose findings it reads (a cycle is a defect: it raises)."""
    from ms_llm.diagnose.rules import MODULES  # importing the package registers every rule module

    rules = sorted(REGISTERED, key=lambda r: (MODULES.index(r.module), r.line))
    after = {r.name: {o.name for o in rules if o is not r and any(overlap(x, f) for x in r.reads for f in o.finds)}
             for r in rules}
    done, out = set(), []
    while len(out) < len(rules):
        ready = [r for r in rules if r.name not in done and after[r.name] <= done]
        if not ready:
            left = sorted(r.name for r in rules if r.name not in done)
            raise RuntimeError(f"diagnose rules read each other's findings in a circle: {', '.join(left)}")
        r = ready[0]
        done.add(r.name)
        out.append(r)
    return out


def overlap(a, b):
    """Whether two id patterns ("divergence", "config_*") can name the same finding."""
    return fnmatch.fnmatchcase(a, b) or fnmatch.fnmatchcase(b, a) or (a.endswith("*") and b.endswith("*") and
                                                                      (a[:-1].startswith(b[:-1]) or
                                                                       b[:-1].startswith(a[:-1])))


def by_name(name):
    return next(r for r in ordered_rules() if r.name == name)
