"""Every setting of the run against the published configurations (`ms-llm diagnose`): ../priors/ holds what released
models and recipes use, and ../priors/keys.yaml how each key of the schema is judged. A setting (or a derived
quantity: head width, the MLP's ratio to the width, tokens per parameter, ...) further than a wide margin outside
every published value is a Suspect (suspect.py), whatever its key: no rule names it, the table does.

The suspect becomes a finding when the run shows one of its effects (a curve finding, a measured slowdown) and a
note otherwise (rules/schedule.py rule_schedule); its action is the published value nearest the run's, set through
the key a user changes (`model.num_heads` for the head width), and the experiment that proves it is a bisect
between the run and the run with the suspect at that value (`ms-llm diagnose RUN --measure`).
"""
import math

from ms_llm.diagnose import priors, recipes
from ms_llm.diagnose.common import quoted
from ms_llm.diagnose.rules.suspect import COST, Suspect

DEFAULT_MARGIN = 4.0
MIN_CHOICES = 3          # a choice is judged when at least this many published entries state the key


def run_getter(run):
    """get(key) over the run's settings: what its config states (typed), its parameter count as `params`."""
    def get(key):
        if key == "params":
            return recipes.estimate_params(run)
        return run.cfg(key) if run.given(key) else None
    return get


SCALES = {
    "log": lambda v: math.log(v) if v > 0 else -math.inf,
    "odds": lambda v: (-math.inf if v <= 0 else math.inf if v >= 1 else math.log(v / (1 - v))),
    "excess": lambda v: math.log(v - 1) if v > 1 else -math.inf,
}


def number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def distance(value, refs, scale):
    """(factor, side) of `value` outside the span of `refs` on `scale` (factor 1: inside), or None."""
    if any(value == r for r in refs):
        return 1.0, "inside"  # a published value itself (0: off, as some recipes have it)
    to = SCALES[scale]
    t = to(value)
    ts = [x for x in (to(r) for r in refs) if math.isfinite(x)]
    if not ts or math.isnan(t):
        return None
    lo, hi = min(ts), max(ts)
    if t < lo:
        return (math.inf if math.isinf(t) else math.exp(lo - t)), "below"
    if t > hi:
        return (math.inf if math.isinf(t) else math.exp(t - hi)), "above"
    return 1.0, "inside"


def suspect_id(key):
    for prefix in ("derived.", "model.", "train."):
        if key.startswith(prefix):
            key = key[len(prefix):]
            break
    return key.replace(".", "_")


def times(factor):
    return "infinitely far" if math.isinf(factor) else f"{factor:,.0f}x" if factor >= 10 else f"{factor:.1f}x"


def shown_value(key, get):
    """'1 (model.hidden_size 128 / model.num_heads 128)': a derived quantity with the settings it comes from."""
    v = priors.quantity(key, get)
    if key not in priors.DERIVED:
        return priors.fmt(v)
    d = priors.DERIVED[key]
    parts = [k for k in d.formula.replace(",", " ").split() if k.count(".") >= 1 and k[0].isalpha() and
             not k.startswith("derived.")]
    given = [f"{k} {priors.fmt(get(k))}" for k in dict.fromkeys(parts) if get(k) is not None]
    return f"{priors.fmt(v)} ({', '.join(given)})" if given else priors.fmt(v)


def nearest(pub, value, scale, family):
    """The published value nearest `value` on the scale, preferring entries of the run's family."""
    to = SCALES[scale]
    pairs = [(v, e) for v, e in pub.values if number(v) and math.isfinite(to(v))]
    own = [(v, e) for v, e in pairs if family and e.family.startswith(family)]
    pool = own or pairs
    return min(pool, key=lambda p: abs(to(p[0]) - to(value))) if pool else None


def range_suspect(run, key, spec, get):
    value = priors.quantity(key, get)
    if not number(value):
        return None
    if spec.get("reference") == "default":
        default = priors_default(key)
        if not number(default):
            return None
        pub = priors.Published(key, ((default, DEFAULT_ENTRY),))
    else:
        pub = priors.published(key)
    scale = spec.get("scale", "log")
    found = distance(value, pub.numbers, scale)
    margin = float(spec.get("margin", DEFAULT_MARGIN))
    if found is None or found[0] <= margin:
        return None
    factor, side = found
    lo, hi = pub.span()
    near = nearest(pub, value, scale, run.cfg("model.arch"))
    d = priors.DERIVED.get(key)
    what = d.what if d else key
    lever = d.lever if d else key
    fix = None
    if near is not None:
        try:
            fix = d.inverse(get, near[0]) if d else near[0]
        except (TypeError, ZeroDivisionError, ValueError):
            fix = None
    fixes = fix if isinstance(fix, dict) else {lever: fix} if fix is not None else {}
    sets = tuple(f"{k}={priors.fmt(v).replace(',', '')}" for k, v in fixes.items() if v is not None)
    if fixes and lever not in fixes:
        lever = next(iter(fixes))
    how = spec.get("low" if side == "below" else "high") or {}
    effects = list(how.get("effects") or ["slow"])
    does = how.get("says") or ""
    n = len({e.name for _, e in pub.values})
    where = "ms_llm's default" if spec.get("reference") == "default" else \
        f"{n} published configuration{'s' if n != 1 else ''}"
    span = priors.fmt(lo) if lo == hi else f"{priors.fmt(lo)}-{priors.fmt(hi)}"
    setting = (f"{what if d else key} = {shown_value(key, get)} is {times(factor)} {side} every value of {where} "
               f"({span})")
    named = f"{what} {priors.fmt(value)} ({lever} = {priors.fmt(get(lever))})" if d else f"{key} = {priors.fmt(value)}"
    cause = f"{named} is {times(factor)} {side} every published value ({span})" + (f": {does}" if does else "")
    action = (" ".join(f"--set {x}" for x in sets) + f" ({what} {priors.fmt(near[0])}, as {near[1].name})"
              if sets and near is not None else f"bring {key} into {span}")
    return Suspect(suspect_id(key), effects[0], setting, cause, action, strong=factor >= margin ** 2, key=lever,
                   reference=priors.cite(pub), also=tuple(effects[1:]), experiment=bisect_action(run, sets),
                   sets=sets)


DEFAULT_ENTRY = priors.Entry(name="ms_llm's default", source="ms_llm/config/schema.py", kind="default", family="",
                             values={})


def priors_default(key):
    """The schema's default of a dotted key (nested optional sections: their dataclass's default)."""
    import dataclasses
    import typing

    from ms_llm.config.schema import Config

    cls = Config
    parts = key.split(".")
    for i, part in enumerate(parts):
        f = {x.name: x for x in dataclasses.fields(cls)}.get(part)
        if f is None:
            return None
        if i == len(parts) - 1:
            return f.default if f.default is not dataclasses.MISSING else f.default_factory()
        hint = typing.get_type_hints(cls)[part]
        inner = [a for a in (typing.get_args(hint) or (hint,)) if dataclasses.is_dataclass(a)]
        if not inner:
            return None
        cls = inner[0]
    return None


def choice_suspect(run, key, spec, get):
    value = get(key)
    if value is None:
        return None
    pub = priors.published(key)
    used = [v for v, _ in pub.values]
    default = priors_default(key)
    if isinstance(default, bool):  # a released model's config.json that lacks a feature does not have it
        stated = {e.name for _, e in pub.values}
        used += [default for e in priors.entries() if e.kind == "shape" and e.name not in stated
                 and priors.applies(spec.get("when"), priors.getter(e.values, e.params))]
    if len(used) < int(spec.get("min", MIN_CHOICES)) or value in used:
        return None
    common = max(set(used), key=used.count)
    effects = list(spec.get("effects") or ["slow"])
    note = spec.get("note") or f"every published entry uses {', '.join(sorted(map(priors.fmt, set(used))))}"
    setting = f"{key} = {priors.fmt(value)}: none of {len(used)} published configurations uses it ({note})"
    return Suspect(suspect_id(key), effects[0], setting, f"{key} = {priors.fmt(value)}, which no published "
                   f"configuration uses ({note})", f"--set {key}={priors.fmt(common)}", strong=False, key=key,
                   reference=priors.cite(pub), also=tuple(effects[1:]),
                   experiment=bisect_action(run, (f"{key}={priors.fmt(common)}",)),
                   sets=(f"{key}={priors.fmt(common)}",))


def measure_suspect(run, key, spec, get):
    """A speed setting away from ms_llm's default: a cost suspect, measured by `diagnose --measure`."""
    value, default = get(key), priors_default(key)
    if value is None or value == default:
        return None
    if "costs" not in spec and not spec.get("scale"):
        return None  # judged by measure.py's own variants (accumulation, threads, readers)
    if "costs" in spec and value not in spec["costs"]:
        return None  # the other side of this setting is the faster one (asynchronous saves, more readers)
    if number(value) and number(default):
        if not spec.get("scale"):
            return None  # judged by measure.py's own variants (accumulation, threads, readers)
        found = distance(value, [default], spec["scale"])
        if found is None or found[0] <= float(spec.get("margin", DEFAULT_MARGIN)):
            return None
        how = f"{times(found[0])} {found[1]} ms_llm's default {priors.fmt(default)}"
        strong = found[0] > float(spec.get("margin", DEFAULT_MARGIN)) ** 2
    elif isinstance(value, (bool, str)) or isinstance(default, (bool, str)) or default is None:
        if isinstance(value, (list, dict)) or not isinstance(default, (bool, str, type(None))):
            return None
        how = f"ms_llm's default is {priors.fmt(default) if default is not None else 'null'}"
        strong = False
    else:
        return None
    fix = "null" if default is None else priors.fmt(default).replace(",", "")
    return Suspect(suspect_id(key), COST, f"{key} = {priors.fmt(value)} ({how}): a speed setting of the same "
                   f"computation", f"{key} = {priors.fmt(value)} ({how}) may cost speed for the same numbers",
                   f"--set {key}={fix}", strong=strong, key=key, reference="ms_llm/config/schema.py",
                   experiment=[f"measure it: ms-llm diagnose {quoted(run.path)} --measure (the step timed with "
                               f"{key}={fix} beside the run's own settings)"], sets=(f"{key}={fix}",))


def bisect_action(run, sets):
    """The experiment that proves a suspect: the run beside the run with `sets` (the published value)."""
    if not sets:
        return []
    from ms_llm.rundir.names import run_config_path

    good = " ".join(f"--set-good {x}" for x in sets)
    return [f"prove it: ms-llm diagnose {quoted(run.path)} --measure (a short run with {', '.join(sets)} beside the "
            f"run's own settings), or ms-llm debug bisect {quoted(run_config_path(run.path))} {quoted(run.path)} "
            f"{good}"]


JUDGES = {"range": range_suspect, "choice": choice_suspect, "measure": measure_suspect}


def suspects(run, covered=()):
    """A Suspect for every setting and derived quantity far from every published value; `covered`: the keys a rule
    of their own already judged in this run (their suspect stands, this one would repeat it)."""
    get = run_getter(run)
    out = []
    for key, spec in priors.keys().items():
        judge = JUDGES.get(spec["how"])
        if judge is None or not priors.applies(spec.get("when"), get):
            continue
        s = judge(run, key, spec, get)
        if s is not None and s.key not in covered and key not in covered:
            out.append(s)
    return out
