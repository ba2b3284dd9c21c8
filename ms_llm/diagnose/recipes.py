"""What published training recipes use, setting by setting: the reference `ms-llm diagnose` judges a run's config
against (rules/settings.py, rules/schedule.py). Every value here is one a paper, a reference implementation or a
released config states; a recipe that does not state a setting leaves it out (no value is guessed).

    key             meaning                                              unit
    lr              peak learning rate                                   -
    warmup_share    linear warmup as a share of the training steps       -
    min_lr_share    the decay's final LR over the peak LR                -
    weight_decay    AdamW decoupled weight decay                         -
    dropout         dropout on residual branches / attention             probability
    beta1, beta2    AdamW's moment decays                                -
    eps             AdamW epsilon                                        -
    clip_grad       global gradient-norm clip                            -
    init_std        std of the normal init                               -
    batch_tokens    tokens per optimizer step                            tokens
    seq_length      context length                                       tokens

`span(key)` gives the range the recipes cover and `cite(key)` the sentence that names them; `lr_reference(params)`
the peak LRs of the recipes of about the same size (larger models train at smaller LRs: GPT-3's Table 2.1).
"""
import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Recipe:
    name: str
    source: str
    params: float = None        # model parameters, where the recipe is for one size
    settings: dict = field(default_factory=dict)


GPT3 = "Brown et al. 2020, Language Models are Few-Shot Learners, Table 2.1 and Appendix B"
LLAMA2 = "Touvron et al. 2023, Llama 2, §2.2 and Table 1"
RECIPES = (
    Recipe("GPT-2", "Radford et al. 2019 (context, batch); dropout and init from the released model's config "
                    "(resid/embd/attn_pdrop 0.1, initializer_range 0.02)", 124e6,
           {"dropout": 0.1, "init_std": 0.02, "seq_length": 1024, "batch_tokens": 512 * 1024}),
    Recipe("GPT-3 125M", GPT3, 125e6, {"lr": 6e-4, "batch_tokens": 0.5e6}),
    Recipe("GPT-3 350M", GPT3, 350e6, {"lr": 3e-4, "batch_tokens": 0.5e6}),
    Recipe("GPT-3 760M", GPT3, 760e6, {"lr": 2.5e-4, "batch_tokens": 0.5e6}),
    Recipe("GPT-3 1.3B", GPT3, 1.3e9, {"lr": 2e-4, "batch_tokens": 1e6}),
    Recipe("GPT-3 2.7B", GPT3, 2.7e9, {"lr": 1.6e-4, "batch_tokens": 1e6}),
    Recipe("GPT-3 6.7B", GPT3, 6.7e9, {"lr": 1.2e-4, "batch_tokens": 2e6}),
    Recipe("GPT-3 13B", GPT3, 13e9, {"lr": 1e-4, "batch_tokens": 2e6}),
    Recipe("GPT-3 175B", GPT3, 175e9, {"lr": 6e-5, "batch_tokens": 3.2e6}),
    Recipe("GPT-3 (every size)", GPT3, None,
           {"beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "clip_grad": 1.0, "weight_decay": 0.1, "min_lr_share": 0.1,
            "warmup_share": 375e6 / 300e9, "seq_length": 2048}),
    Recipe("nanoGPT GPT-2 124M", "karpathy/nanoGPT train.py defaults with config/train_gpt2.py", 124e6,
           {"lr": 6e-4, "min_lr_share": 0.1, "warmup_share": 2000 / 600000, "weight_decay": 0.1, "beta1": 0.9,
            "beta2": 0.95, "clip_grad": 1.0, "dropout": 0.0, "init_std": 0.02, "seq_length": 1024,
            "batch_tokens": 12 * 1024 * 40}),
    Recipe("nanoGPT shakespeare-char", "karpathy/nanoGPT config/train_shakespeare_char.py (train.py defaults for "
                                       "the rest)", 10.65e6,
           {"lr": 1e-3, "min_lr_share": 0.1, "warmup_share": 100 / 5000, "weight_decay": 0.1, "beta1": 0.9,
            "beta2": 0.99, "clip_grad": 1.0, "dropout": 0.2, "init_std": 0.02, "seq_length": 256,
            "batch_tokens": 64 * 256}),
    Recipe("Llama 7B", "Touvron et al. 2023, LLaMA, §2.2 and Table 2", 6.7e9,
           {"lr": 3e-4, "beta1": 0.9, "beta2": 0.95, "weight_decay": 0.1, "clip_grad": 1.0, "min_lr_share": 0.1,
            "warmup_share": 2000 / (1e12 / 4e6), "batch_tokens": 4e6, "seq_length": 2048}),
    Recipe("Llama 2 7B", LLAMA2, 7e9,
           {"lr": 3e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-5, "weight_decay": 0.1, "clip_grad": 1.0,
            "min_lr_share": 0.1, "warmup_share": 2000 / (2e12 / 4e6), "batch_tokens": 4e6, "seq_length": 4096,
            "dropout": 0.0}),
    Recipe("Llama 2 70B", LLAMA2, 70e9,
           {"lr": 1.5e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-5, "weight_decay": 0.1, "clip_grad": 1.0,
            "min_lr_share": 0.1, "warmup_share": 2000 / (2e12 / 4e6), "batch_tokens": 4e6, "seq_length": 4096}),
    Recipe("Llama 3 405B", "Llama Team 2024, The Llama 3 Herd of Models, §3.4.1", 405e9,
           {"lr": 8e-5, "warmup_share": 8000 / 1.2e6, "min_lr_share": 0.01, "seq_length": 8192}),
    Recipe("MindFormers Llama 2 7B", "mindspore-lab/mindformers configs/llama2/pretrain_llama2_7b.yaml", 7e9,
           {"lr": 5e-5, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "warmup_share": 0.03, "min_lr_share": 0.0,
            "seq_length": 4096}),
)
# Beyond single recipes: what the scaling studies and the practitioner's guides found.
CHINCHILLA = ("Hoffmann et al. 2022, Training Compute-Optimal Large Language Models: about 20 training tokens per "
              "parameter is compute-optimal; a cosine cycle much longer than the training steps (by 25% or more) "
              "leaves the model under-trained")
WARMUP_GUIDE = "practitioners' guides for Ascend training: warmup 1-3% of the steps"
DROPOUT_PAPER = ("Srivastava et al. 2014, Dropout: at test time the network with all units is an approximation of "
                 "the average of the thinned ones, and p = 0.5 was their largest rate for hidden units")

SHORT = {  # how a recipe is named in an evidence line
    "GPT-2": "GPT-2", "nanoGPT GPT-2 124M": "nanoGPT", "nanoGPT shakespeare-char": "nanoGPT char",
    "GPT-3 (every size)": "GPT-3", "Llama 7B": "Llama", "Llama 2 7B": "Llama 2", "Llama 2 70B": "Llama 2 70B",
    "Llama 3 405B": "Llama 3", "MindFormers Llama 2 7B": "MindFormers Llama 2"}


def values(key):
    """[(value, recipe)] of every recipe that states `key`."""
    return [(r.settings[key], r) for r in RECIPES if key in r.settings]


def span(key):
    """(smallest, largest) value the recipes use for `key`, or None."""
    vals = [v for v, _ in values(key)]
    return (min(vals), max(vals)) if vals else None


def fmt(v):
    if isinstance(v, float) and (v == 0 or 1e-3 <= abs(v) < 1e4):
        return f"{v:.3g}"
    if isinstance(v, float) and v.is_integer() and abs(v) >= 1e4:
        return f"{v:,.0f}"
    return f"{v:.3g}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v)


def cite(key, limit=5, scale=None):
    """'GPT-3 0.1, Llama 2 0.1, nanoGPT 0.1 (sources: ...)': the recipes that state `key` and where they say it.
    `scale` turns values into what the sentence compares (e.g. shares into percent)."""
    seen, parts, sources = set(), [], []
    for v, r in values(key):
        name = SHORT.get(r.name, r.name)
        if name in seen or (r.name.startswith("GPT-3 ") and r.name != "GPT-3 (every size)" and key != "lr"):
            continue
        seen.add(name)
        shown = scale(v) if scale else fmt(v)
        parts.append(f"{name} {shown}")
        if r.source not in sources:
            sources.append(r.source)
        if len(parts) >= limit:
            break
    return ", ".join(parts) + " (" + "; ".join(sources) + ")"


def lr_reference(params):
    """(smallest, largest, [recipes]) of the peak LRs of recipes within 4x of `params` parameters; below the
    smallest recipe (nanoGPT's 10.65M char model) its LR stands for every smaller model, above the largest the
    largest's. None without a parameter count."""
    if not params:
        return None
    sized = [(v, r) for v, r in values("lr") if r.params]
    near = [(v, r) for v, r in sized if r.params / 4 <= params <= r.params * 4]
    if not near:
        smallest = min(sized, key=lambda x: x[1].params)
        largest = max(sized, key=lambda x: x[1].params)
        near = [smallest] if params < smallest[1].params else [largest]
    lrs = [v for v, _ in near]
    return min(lrs), max(lrs), [r for _, r in near]


def lr_text(params):
    ref = lr_reference(params)
    if ref is None:
        return ""
    lo, hi, recipes = ref
    names = ", ".join(f"{r.name} {fmt(r.settings['lr'])}" for r in recipes)
    return f"{names} ({'; '.join(dict.fromkeys(r.source for r in recipes))})"


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
