"""What published training recipes use, setting by setting, read from the published configurations (priors/): the
reference the schedule and optimizer rules judge a run's config against (rules/settings.py, rules/schedule.py).

    key             the priors' key             meaning
    lr              train.lr                    peak learning rate
    warmup_share    derived.warmup_share        linear warmup as a share of the training steps
    min_lr_share    derived.min_lr_share        the decay's final LR over the peak LR
    weight_decay    train.weight_decay          AdamW decoupled weight decay
    dropout         model.dropout               dropout on residual branches / attention
    beta1, beta2    train.beta1, train.beta2    AdamW's moment decays
    eps             train.eps                   AdamW epsilon
    clip_grad       train.clip_grad             global gradient-norm clip
    init_std        model.init_std              std of the normal init
    batch_tokens    derived.batch_tokens        tokens per optimizer step
    seq_length      model.seq_length            context length

Recipes are the priors' entries of kind recipe that train from scratch (pretraining); fine-tuning recipes (LoRA,
DPO, MindFormers' finetune configs) train a released model at far smaller LRs and are left out here. `span(key)`
gives the range the recipes cover and `cite(key)` the sentence that names them; `lr_reference(params)` the peak
LRs of the recipes of about the same size (larger models train at smaller LRs: GPT-3's Table 2.1).
"""
import math

from ms_llm.diagnose import priors

KEYS = {"lr": "train.lr", "warmup_share": "derived.warmup_share", "min_lr_share": "derived.min_lr_share",
        "weight_decay": "train.weight_decay", "dropout": "model.dropout", "beta1": "train.beta1",
        "beta2": "train.beta2", "eps": "train.eps", "clip_grad": "train.clip_grad", "init_std": "model.init_std",
        "batch_tokens": "derived.batch_tokens", "seq_length": "model.seq_length"}

# Beyond single recipes: what the scaling studies and the practitioner's guides found.
CHINCHILLA = ("Hoffmann et al. 2022, Training Compute-Optimal Large Language Models: about 20 training tokens per "
              "parameter is compute-optimal; a cosine cycle much longer than the training steps (by 25% or more) "
              "leaves the model under-trained")
WARMUP_GUIDE = "practitioners' guides for Ascend training: warmup 1-3% of the steps"
DROPOUT_PAPER = ("Srivastava et al. 2014, Dropout: at test time the network with all units is an approximation of "
                 "the average of the thinned ones, and p = 0.5 was their largest rate for hidden units")


def pretraining(entry):
    return entry.kind == "recipe" and entry.stage == "pretrain"


def values(key):
    """[(value, entry)] of every pretraining recipe that states `key` (a name of KEYS)."""
    return [(v, e) for v, e in priors.published(KEYS.get(key, key)).values if pretraining(e)
            and isinstance(v, (int, float)) and not isinstance(v, bool)]


def span(key):
    """(smallest, largest) value the recipes use for `key`, or None."""
    vals = [v for v, _ in values(key)]
    return (min(vals), max(vals)) if vals else None


def fmt(v):
    return priors.fmt(v)


def cite(key, limit=5, scale=None):
    """'GPT-3 Small 0.1, LLaMA 7B 0.1, nanoGPT shakespeare-char 0.1 (priors: gpt3.yaml, ...)': the recipes that
    state `key`, the ends of their span first. `scale` turns values into what the sentence compares (e.g. shares
    into percent)."""
    vals = sorted(values(key), key=lambda x: x[0])
    if not vals:
        return "no published recipe states it"
    ends = [vals[0], vals[-1]] + vals[1:-1]
    seen, parts = set(), []
    for v, e in ends:
        shown = scale(v) if scale else fmt(v)
        if (shown, e.file) in seen:
            continue
        seen.add((shown, e.file))
        parts.append(f"{e.name} {shown}")
        if len(parts) >= limit:
            break
    files = ", ".join(dict.fromkeys(e.file for _, e in vals))
    return ", ".join(parts) + f" ({len(vals)} recipes in ms_llm/diagnose/priors/: {files})"


def lr_reference(params):
    """(smallest, largest, [entries]) of the peak LRs of recipes within 4x of `params` parameters; below the
    smallest recipe its LR stands for every smaller model, above the largest the largest's. None without a
    parameter count."""
    if not params:
        return None
    sized = [(v, e) for v, e in values("lr") if entry_params(e)]
    if not sized:
        return None
    near = [(v, e) for v, e in sized if entry_params(e) / 4 <= params <= entry_params(e) * 4]
    if not near:
        smallest = min(sized, key=lambda x: entry_params(x[1]))
        largest = max(sized, key=lambda x: entry_params(x[1]))
        near = [smallest] if params < entry_params(smallest[1]) else [largest]
    lrs = [v for v, _ in near]
    return min(lrs), max(lrs), [e for _, e in near]


def entry_params(e):
    """An entry's parameter count: as its source states it, else from its shape (shape_params)."""
    if isinstance(e.params, (int, float)) and e.params > 0:
        return e.params
    return shape_params(priors.getter(e.values))


def shape_params(get):
    """12 x layers x hidden^2 for the blocks (attention 4h², an MLP of 4h: 8h²; a gated MLP of width f: 3hf) plus
    the embedding, from the keys an entry or a run states; None without a shape."""
    h, layers = get("model.hidden_size"), get("model.num_layers")
    if not h or not layers:
        return None
    ffn = get("model.ffn_hidden_size")
    gated = get("model.arch") != "gpt2" and ffn
    mlp = 3 * h * ffn if gated else 8 * h * h if not ffn else 2 * h * ffn
    return layers * (4 * h * h + mlp) + (get("model.vocab_size") or 0) * h


def lr_text(params):
    ref = lr_reference(params)
    if ref is None:
        return ""
    lo, hi, entries = ref
    names = ", ".join(f"{e.name} {fmt(e.values['train.lr'])}" for e in entries[:6])
    more = f" and {len(entries) - 6} more" if len(entries) > 6 else ""
    return f"{names}{more} (ms_llm/diagnose/priors/: {', '.join(dict.fromkeys(e.file for e in entries))})"


def estimate_params(run):
    """The model's parameter count: run_info's final summary, what the live diagnosis was told, or the usual
    formula (12 x layers x hidden^2 for the blocks, + vocab x hidden for the embedding)."""
    n = run.final.get("parameters") or getattr(run, "parameters", None)
    if isinstance(n, int) and n > 0:
        return n
    h, layers, v = run.cfg("model.hidden_size"), run.cfg("model.num_layers"), run.cfg("model.vocab_size") or 0
    if not h or not layers:
        return None
    return 12 * layers * h * h + v * h


def ln(x):
    return math.log(x) if x and x > 0 else None
