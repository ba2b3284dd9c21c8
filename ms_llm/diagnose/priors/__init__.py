"""The published configurations `ms-llm diagnose` judges every setting against, and how each setting is judged.

The data are the YAML files beside this module, one per family or paper (gpt2.yaml, llama3.yaml, gpt3.yaml,
mindformers.yaml, ...). Each entry is one released model or one training recipe: its name, its source and the values
that source states, under ms_llm's own config keys (`model.num_heads`, `train.beta2`) or one of the recipe quantities
(`derived.batch_tokens`, ...). No value is guessed: a source that does not state a setting leaves it out.

`keys.yaml` says, for every key of the schema, how it is judged:

    range      its value (or a derived quantity's) against the published values, on a scale (log, odds, ...)
    choice     a boolean or a choice against the values the published entries use
    through    judged by the derived quantities it enters (model.num_heads through derived.head_dim, ...)
    rule       judged by a rule of its own (the LR against the recipes of the model's size, the vocabulary against
               the ids the data holds, ...)
    measure    a speed setting of the same computation: judged against ms_llm's default, and measured
               (`ms-llm diagnose RUN --measure` times the run's step with the default)
    unjudged   with its reason (a path, a name, a cadence that changes no number)

`tests/test_priors.py` walks every key of the schema and fails on a key that is in none of these, so a key added
later is judged or says why not. The derived quantities (head width, the MLP's ratio to the width, ...) are defined
once here (DERIVED) and computed the same way for a published entry and for a run.
"""
import functools
import glob
import math
import os
from dataclasses import dataclass, field
from typing import Callable, Optional

import yaml

# libyaml's parser when PyYAML was built with it: the tables are ~260 kB, 0.37 s with the Python parser and 0.04 s
# with libyaml, paid by every process that diagnoses (a training run's live diagnosis included)
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

HERE = os.path.dirname(os.path.abspath(__file__))
KEYS_FILE = os.path.join(HERE, "keys.yaml")
HOW = ("range", "choice", "through", "rule", "measure", "unjudged")


@dataclass(frozen=True)
class Entry:
    """One released model or recipe: what its source states, under ms_llm's keys."""
    name: str
    source: str
    kind: str              # shape | recipe
    family: str
    values: dict
    params: Optional[float] = None
    file: str = ""
    stage: str = "pretrain"  # pretrain | finetune (LoRA, SFT, preference: a released model trained further)

    def get(self, key):
        v = self.values.get(key)
        return None if v is None else v


@dataclass(frozen=True)
class Derived:
    """A quantity computed from settings, judged like a setting: head width, the MLP's ratio to the width, ..."""
    name: str
    what: str                       # what it is, in words ("attention head width")
    formula: str                    # how it is computed, in the schema's keys
    compute: Callable               # (get) -> value or None; get(key) reads a setting (None when unknown)
    lever: str                      # the setting a fix changes
    inverse: Callable               # (get, target value) -> the lever's value that gives about `target`, or
                                    # {key: value} when the fix must change other settings with it


def _ratio(a, b):
    return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None


def head_dim(get):
    explicit = get("model.head_dim")
    return explicit if explicit else _ratio(get("model.hidden_size"), get("model.num_heads"))


def kv_heads(get):
    return get("model.num_kv_heads") or get("model.num_heads")


def ffn_size(get):
    """The dense MLP's inner width: as stated, else GPT-2's 4 × hidden (a GPT-2 config.json's n_inner null)."""
    v = get("model.ffn_hidden_size")
    if v:
        return v
    h = get("model.hidden_size")
    return 4 * h if h and get("model.arch") == "gpt2" else None


def divisor_near(n, target, at_least=1):
    """The divisor of n nearest `target` on a log scale (a head count must divide the width)."""
    if not n or not target or target <= 0:
        return None
    ds = [d for d in range(at_least, int(n) + 1) if n % d == 0]
    return min(ds, key=lambda d: abs(math.log(d / target))) if ds else None


def heads_for_width(get, width):
    """{model.num_heads, model.num_kv_heads} giving heads about `width` wide, the key/value heads' share kept."""
    h, heads = get("model.hidden_size"), get("model.num_heads")
    new = divisor_near(h, h / width)
    if get("model.head_dim"):
        return {"model.head_dim": int(round(width))}
    share = _ratio(kv_heads(get), heads) or 1.0
    return {"model.num_heads": new, "model.num_kv_heads": divisor_near(new, new * share)}


def tokens_per_param(get):
    steps, batch, seq, params = get("train.max_steps"), get("train.global_batch_size"), get("model.seq_length"), \
        get("params")
    train_tokens = get("derived.train_tokens") or (steps * batch * seq if steps and batch and seq else None)
    return _ratio(train_tokens, params)


DERIVED = {d.name: d for d in (
    Derived("derived.head_dim", "attention head width", "model.head_dim, else model.hidden_size / model.num_heads",
            head_dim, "model.num_heads", lambda get, t: heads_for_width(get, t)),
    Derived("derived.kv_share", "share of key/value heads", "model.num_kv_heads / model.num_heads",
            lambda get: _ratio(kv_heads(get), get("model.num_heads")), "model.num_kv_heads",
            lambda get, t: divisor_near(get("model.num_heads"), get("model.num_heads") * t)),
    Derived("derived.ffn_ratio", "the MLP's width over the model's", "model.ffn_hidden_size / model.hidden_size",
            lambda get: _ratio(ffn_size(get), get("model.hidden_size")), "model.ffn_hidden_size",
            lambda get, t: int(round(get("model.hidden_size") * t))),
    Derived("derived.width_per_layer", "width per layer (the model's aspect ratio)",
            "model.hidden_size / model.num_layers",
            lambda get: _ratio(get("model.hidden_size"), get("model.num_layers")), "model.num_layers",
            lambda get, t: max(1, int(round(get("model.hidden_size") / t)))),
    Derived("derived.expert_ffn_ratio", "each expert's width over the model's",
            "model.moe.ffn_hidden_size (else model.ffn_hidden_size) / model.hidden_size",
            lambda get: _ratio(get("model.moe.ffn_hidden_size") or (ffn_size(get) if get("model.moe.num_experts")
                                                                    else None), get("model.hidden_size")),
            "model.moe.ffn_hidden_size", lambda get, t: int(round(get("model.hidden_size") * t))),
    Derived("derived.active_expert_share", "share of experts each token uses", "model.moe.top_k / model.moe.num_experts",
            lambda get: _ratio(get("model.moe.top_k"), get("model.moe.num_experts")), "model.moe.top_k",
            lambda get, t: max(1, int(round(get("model.moe.num_experts") * t)))),
    Derived("derived.window_share", "sliding window over the context", "model.sliding_window / model.seq_length",
            lambda get: _ratio(get("model.sliding_window"), get("model.seq_length")), "model.sliding_window",
            lambda get, t: max(1, int(round(get("model.seq_length") * t)))),
    Derived("derived.tokens_per_param", "training tokens per parameter",
            "train.max_steps × train.global_batch_size × model.seq_length / parameters",
            tokens_per_param, "train.max_steps",
            lambda get, t: int(math.ceil(t * get("params") / (get("train.global_batch_size") * get("model.seq_length"))))),
    Derived("derived.lora_scale", "LoRA's scale (alpha / rank)", "finetune.lora.alpha / finetune.lora.rank",
            lambda get: _ratio(get("finetune.lora.alpha"), get("finetune.lora.rank")), "finetune.lora.alpha",
            lambda get, t: float(t * get("finetune.lora.rank"))),
    Derived("derived.warmup_share", "warmup over the run", "train.warmup_steps / train.max_steps",
            lambda get: _ratio(get("train.warmup_steps"), get("train.max_steps")), "train.warmup_steps",
            lambda get, t: int(round(t * get("train.max_steps")))),
    Derived("derived.min_lr_share", "the final LR over the peak", "train.min_lr / train.lr",
            lambda get: _ratio(get("train.min_lr"), get("train.lr")), "train.min_lr",
            lambda get, t: t * get("train.lr")),
    Derived("derived.batch_tokens", "tokens per optimizer step", "train.global_batch_size × model.seq_length",
            lambda get: (get("train.global_batch_size") * get("model.seq_length")
                         if get("train.global_batch_size") and get("model.seq_length") else None),
            "train.global_batch_size", lambda get, t: max(1, int(round(t / get("model.seq_length"))))),
)}


# --- the table -------------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def entries():
    """Every published entry of every data file, in file order."""
    out = []
    for path in sorted(glob.glob(os.path.join(HERE, "*.yaml"))):
        if path == KEYS_FILE:
            continue
        with open(path, encoding="utf-8") as f:
            doc = yaml.load(f, Loader=SAFE_LOADER) or {}  # noqa: S506 (a safe loader)
        for e in doc.get("entries") or []:
            out.append(Entry(name=str(e["name"]), source=str(e.get("source") or doc.get("source") or ""),
                             kind=str(e.get("kind") or doc.get("kind") or "shape"),
                             family=str(e.get("family") or doc.get("family") or ""),
                             values=dict(e.get("values") or {}), params=e.get("params"),
                             file=os.path.basename(path), stage=stage_of(e, doc)))
    return tuple(out)


FINETUNE_WORDS = ("finetune", "fine-tune", "lora", "sft", "dpo", "simpo", "qlora")


def stage_of(entry, doc):
    """An entry's `stage`, else its file's, else finetune when its name says so (MindFormers' finetune_*, lora_*)."""
    stated = entry.get("stage") or doc.get("stage")
    if stated:
        return str(stated)
    return "finetune" if any(w in str(entry.get("name", "")).lower() for w in FINETUNE_WORDS) else "pretrain"


@functools.lru_cache(maxsize=None)
def keys():
    """keys.yaml: {key: {"how": ..., ...}} for every schema key and derived quantity."""
    with open(KEYS_FILE, encoding="utf-8") as f:
        doc = yaml.load(f, Loader=SAFE_LOADER) or {}  # noqa: S506 (a safe loader)
    out = {}
    for how in HOW:
        for key, spec in (doc.get(how) or {}).items():
            spec = spec if isinstance(spec, dict) else {"why": spec}
            out[key] = dict(spec, how=how)
    return out


def getter(values, params=None):
    """get(key) over a flat {dotted key: value} (a published entry's values), with the entry's parameter count; a
    section's name (model.moe) reads as set when the entry states any key of it."""
    def get(key):
        if key == "params":
            return params
        if key in values:
            return values[key]
        return True if any(k.startswith(key + ".") for k in values) else None
    return get


def applies(when, get):
    """Whether a key acts where `get` reads (keys.yaml `when`: {key: set | unset | positive | [values]})."""
    for key, cond in (when or {}).items():
        v = get(key)
        if cond == "set":
            ok = v is not None and v is not False
        elif cond == "unset":
            ok = v is None or v is False
        elif cond == "positive":
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
        else:
            ok = v in cond
        if not ok:
            return False
    return True


def quantity(key, get):
    """A setting's or derived quantity's value through `get`, or None."""
    if key in DERIVED:
        try:
            return DERIVED[key].compute(get)
        except (TypeError, ZeroDivisionError, ValueError):
            return None
    return get(key)


@dataclass(frozen=True)
class Published:
    """The values published entries give one key: [(value, entry)], and where each comes from."""
    key: str
    values: tuple = field(default_factory=tuple)

    @property
    def numbers(self):
        return [v for v, _ in self.values if isinstance(v, (int, float)) and not isinstance(v, bool)]

    def span(self):
        nums = self.numbers
        return (min(nums), max(nums)) if nums else None

    def at(self, value):
        """The entries that give `value` (or the nearest value to it)."""
        return [e for v, e in self.values if v == value]


def published(key):
    """Published(key): the value of `key` in every entry that states it (or, for a derived quantity, every entry
    that states what it is computed from) and where the key acts (keys.yaml `when`)."""
    return _published(key, repr((keys().get(key) or {}).get("when")))


@functools.lru_cache(maxsize=None)
def _published(key, _when):
    spec = keys().get(key) or {}
    when = spec.get("when")
    out = []
    for e in entries():
        if e.stage == "default" and not spec.get("defaults"):
            continue  # what a library runs without the key set, not what a recipe chose (keys.yaml `defaults`)
        get = getter(e.values, e.params)
        # a condition on a key the entry does not state (most recipes state no dtype) does not exclude it
        stated = {k: c for k, c in (when or {}).items() if get(k) is not None or c in ("set", "unset")}
        if not applies(stated, get):
            continue
        v = quantity(key, get)
        if v is not None and not (isinstance(v, float) and not math.isfinite(v)):
            out.append((v, e))
    return Published(key, tuple(out))


def cite(pub, limit=3):
    """'40 (MindFormers deepseek2 236B) to 128 (Llama-2-7b); 47 configurations in priors/mindformers.yaml,
    llama2.yaml': the entries at the ends of a key's published span and the files that hold every source."""
    nums = sorted(((v, e) for v, e in pub.values if isinstance(v, (int, float)) and not isinstance(v, bool)),
                  key=lambda x: x[0])
    n = len({e.name for _, e in pub.values})
    files = ", ".join(dict.fromkeys(e.file for _, e in pub.values if e.file))
    where = f"{n} configuration{'s' if n != 1 else ''}" + (f" in ms_llm/diagnose/priors/ ({files})" if files else
                                                             f": {pub.values[0][1].source}" if pub.values else "")
    if nums and nums[0][0] != nums[-1][0]:
        return f"{fmt(nums[0][0])} ({nums[0][1].name}) to {fmt(nums[-1][0])} ({nums[-1][1].name}); {where}"
    names = list(dict.fromkeys(e.name for _, e in pub.values))
    shown = ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")
    value = fmt(nums[0][0]) if nums else ", ".join(sorted({fmt(v) for v, _ in pub.values}))
    return f"{value} ({shown}); {where}"


def fmt(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v).lower() if isinstance(v, bool) else str(v)
    if isinstance(v, int) or (isinstance(v, float) and v.is_integer() and abs(v) >= 1):
        return f"{int(v):,}"
    if v == 0 or 1e-3 <= abs(v) < 1e4:
        return f"{v:.3g}"
    return f"{v:.2g}"
