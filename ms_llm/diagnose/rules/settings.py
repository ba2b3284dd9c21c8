"""The run's settings judged against published recipes (../recipes.py) and against what its data supports
(`ms-llm diagnose`): each is a Suspect (suspect.py) with the reference it is judged against, the effect it would
have, and its own evidence where no curve rule names that effect.

- against the recipes: dropout above every recipe's, a peak LR far outside what recipes of the model's size use,
  no warmup (every recipe warms up; at a high LR a combination no recipe runs), gradient clipping off (every
  recipe clips at 1.0), an init far from 0.02;
- against the data (the dataset's manifest): a model vocabulary much larger than the ids the data holds, a
  context shorter than the samples the data was packed into (the rest of every sample is never trained on).

The schedule and optimizer suspects (warmup longer than the run, the decay, min_lr, weight decay, beta2, eps, the
batch) are schedule.py's; rule_schedule there turns every suspect into a finding or a note.
"""
import math
import statistics

from ms_llm.diagnose import recipes
from ms_llm.diagnose.common import curve, finite, g, points, quoted
from ms_llm.diagnose.references import manifest, split_entropy, unigram_entropy
from ms_llm.diagnose.rules.suspect import COST, GAP, SLOW, START, UNSTABLE, Suspect

CONTEXT_FREE = 0.95     # a loss at or above 95% of its split's unigram entropy has learned little beyond frequencies
                        # (healthy runs here: 79-85% of it by step 200)
SLOW_GATE = 200         # ... judged from this step and twice the warmup (progress.py's SLOW_MIN_STEPS)
DROPOUT_STRONG = 0.5    # 2.5x the largest recipe's (nanoGPT char 0.2); Srivastava et al.'s largest hidden rate
LR_FAR = 10.0           # a peak LR 10x above the recipes of the model's size (or 30x below) is far from them
LR_FAR_LOW = 30.0
NO_WARMUP_SHARE = 0.001  # warmup under 0.1% of the steps: below every recipe (GPT-3's 0.13% is the least)
HIGH_LR = 3.0           # ... a combination no recipe runs at an LR 3x the recipes' for the size
VOCAB_SLACK, VOCAB_PAD = 2.0, 128  # model vocabulary above 2x (and 128 more than) the ids the data holds
COST_SHOWN = 0.5        # a cost suspect is a finding when it spends half the step's compute or the data
START_MARGIN = 1.0      # a start 1 nat above ln(the data's ids): the first steps unlearn ids the data never has
INIT_FAR = 5.0          # init_std 5x the recipes' 0.02


def suspects(run):
    if not run.config:
        return []  # no settings to judge (another framework's log without its arguments): absent is not "off"
    out = []
    # no warmup at a high LR names the LR too: the combination leads what it explains, before the LR alone
    for judge in (dropout, warmup, learning_rate, clipping, init, vocabulary, context):
        s = judge(run)
        if s is not None:
            out.append(s)
    return out


# --- what the curve shows -------------------------------------------------------------------------------

def slow_gate(run):
    warm, n = run.cfg("train.warmup_steps") or 0, run.max_steps or 0
    return max(SLOW_GATE, 2 * min(warm, n // 4 if n else warm))


def context_free(run):
    """An evidence line when the latest validation loss (else the training loss) is still at the context-free level
    past the slow gate, or None."""
    gate = slow_gate(run)
    evals = [(s, v) for s, v in points(run.evals, "val_loss") if s >= gate]
    h_val = split_entropy(run, "val")
    if evals and h_val:
        s, v = evals[-1]
        if v >= CONTEXT_FREE * h_val.nats:
            return (f"validation loss {g(v)} at step {s} is {100 * v / h_val.nats:.0f}% of the validation split's "
                    f"unigram entropy {g(h_val.nats)} ({h_val.source}), the loss of a model that ignores the context: "
                    f"by step {s} it has learned little beyond token frequencies (healthy runs here are below 85% of "
                    f"it by step {SLOW_GATE})")
        return None
    pts = [(s, v) for s, v in curve(run) if s >= gate]
    h = unigram_entropy(run)
    if len(pts) >= 3 and h:
        late = statistics.median(v for _, v in pts[-3:])
        if late >= CONTEXT_FREE * h.nats:
            return (f"training loss {g(late)} (median of the last 3 records, step {pts[-1][0]}) is "
                    f"{100 * late / h.nats:.0f}% of the training data's unigram entropy {g(h.nats)} ({h.source}): it "
                    f"has learned little beyond token frequencies")
    return None


def experiment(run, sets, steps, what):
    """The cheapest run that separates a suspect from the rest: the same config with `sets` for `steps` steps."""
    from ms_llm.rundir.names import run_config_path

    base = run.path.rstrip("/\\")
    tag = "_".join(s.split("=")[0].split(".")[-1] + s.split("=")[1] for s in sets)
    out = quoted(f"{base}_{tag}")
    return [f"the experiment that separates it: ms-llm train --config {quoted(run_config_path(run.path))} --run-dir "
            f"{out} " + " ".join(f"--set {s}" for s in sets) + f" --set train.max_steps={steps}",
            f"then ms-llm compare-curves {quoted(run.path)} {out}: {what}"]


def steps_for(run):
    """How long the experiment runs: to where this run showed its symptom (its last record), at least 100 steps."""
    last = max([s for s, _ in points(run.train, "loss")] + [s for s, _ in points(run.evals, "val_loss")] + [0])
    return max(100, min(last, run.max_steps or last))


# --- against the recipes --------------------------------------------------------------------------------

def dropout(run):
    p = run.cfg("model.dropout") or 0.0
    lo, hi = recipes.span("dropout")
    if p <= hi:
        return None
    ref = recipes.cite("dropout")
    train_val = dropout_gap(run) if p >= DROPOUT_STRONG else None

    def shown_by(r):
        line = context_free(r)
        return line and line + (f"; {train_val}" if train_val else "")

    fix = 0.1
    return Suspect(
        "dropout", SLOW, f"model.dropout = {g(p)}: every published recipe uses {g(lo)}-{g(hi)}; "
        f"{g(p)} drops {100 * p:.0f}% of the activations at every step", f"dropout far above any recipe's: "
        f"model.dropout = {g(p)} ({g(p / hi)}x the largest, {g(hi)}) drops {100 * p:.0f}% of the activations, so each "
        f"step trains a small random part of the model, and the full model that evaluation runs is a poor stand-in "
        f"for it", f"--set model.dropout={fix} (GPT-2's; now {g(p)})", p >= DROPOUT_STRONG, "model.dropout",
        ref + (f"; {recipes.DROPOUT_PAPER}" if p >= DROPOUT_STRONG else ""), also=(GAP,), shown_by=shown_by,
        experiment=experiment(run, [f"model.dropout={fix}"], steps_for(run),
                              "validation clearly lower (and below the unigram entropy) → dropout was the cause; the "
                              "same → the data or the model (a split shift: ms-llm data info)"))


def dropout_gap(run):
    """'validation (dropout off) above training (dropout on) ...' when it is, or None."""
    evals, pts = points(run.evals, "val_loss"), curve(run)
    if not evals or not pts:
        return None
    s, v = evals[-1]
    near = [x for st, x in pts if st <= s][-3:]
    if not near:
        return None
    t = statistics.median(near)
    if v <= t:
        return None
    return (f"validation {g(v)} (dropout off) is above training {g(t)} (dropout on) at step {s}: with this much "
            f"dropout the full network is not the average of the thinned ones it was trained as")


def learning_rate(run):
    """The peak LR against the recipes of the model's size: only a note here; the divergence and progress rules
    name the LR themselves and cite this (lr_judgement)."""
    j = lr_judgement(run)
    if j is None:
        return None
    direction, factor, text, ref = j
    lr = run.cfg("train.lr")
    if direction == "high":
        # too high an LR also stalls a loss: it bounces at the context-free level instead of falling below it
        return Suspect("lr", UNSTABLE, text, f"learning rate too high: train.lr = {g(lr)} is {factor:,.0f}x the "
                       f"largest peak LR recipes use for a model of this size", f"--set train.lr="
                       f"{recipes.fmt(lr / factor)} (the recipes' largest for the size)", True, "train.lr", ref,
                       also=(SLOW,), shown_by=context_free,
                       experiment=experiment(run, [f"train.lr={recipes.fmt(lr / factor)}"], steps_for(run),
                                             "the loss clearly lower → the LR; the same → the labels, the data or the "
                                             "model (ms-llm debug overfit tells)"))
    return Suspect("lr", SLOW, text, f"learning rate too low: train.lr = {g(lr)} is 1/{factor:,.0f} of the smallest "
                   f"peak LR recipes use for a model of this size", f"--set train.lr={recipes.fmt(lr * factor)} (the "
                   f"recipes' smallest for the size)", True, "train.lr", ref, shown_by=context_free,
                   experiment=experiment(run, [f"train.lr={recipes.fmt(lr * factor)}"], steps_for(run),
                                         "the loss clearly lower → the LR; the same → the labels, the data or the "
                                         "model (ms-llm debug overfit tells)"))


def lr_judgement(run):
    """("high" | "low", factor, evidence sentence, reference) when train.lr is far from the recipes of the model's
    size, else None."""
    lr, params = run.cfg("train.lr"), recipes.estimate_params(run)
    ref = recipes.lr_reference(params)
    if not finite(lr) or lr <= 0 or ref is None:
        return None
    lo, hi, _ = ref
    src = recipes.lr_text(params)
    size = f"{params / 1e6:,.2g}M" if params >= 1e5 else f"{params / 1e3:,.0f}K"
    if lr > LR_FAR * hi:
        return ("high", lr / hi, f"train.lr = {g(lr)} is {lr / hi:,.0f}x the largest peak LR of the published recipes "
                f"nearest this model's size ({size} parameters)", src)
    if lr < lo / LR_FAR_LOW:
        return ("low", lo / lr, f"train.lr = {g(lr)} is 1/{lo / lr:,.0f} of the smallest peak LR of the published "
                f"recipes nearest this model's size ({size} parameters)", src)
    return None


def warmup(run):
    warm, n, lr = run.cfg("train.warmup_steps") or 0, run.max_steps or 0, run.cfg("train.lr")
    if not n or warm >= NO_WARMUP_SHARE * n:
        return None
    ref = recipes.cite("warmup_share", scale=lambda v: f"{100 * v:.2g}%") + f"; {recipes.WARMUP_GUIDE}"
    lo, _ = recipes.span("warmup_share")
    j = lr_judgement(run)
    lr_ref = recipes.lr_reference(recipes.estimate_params(run))
    high = lr_ref is not None and finite(lr) and lr >= HIGH_LR * lr_ref[1]
    steps = max(1, round(0.01 * n))
    what = (f"train.warmup_steps = {warm} of {n} steps ({100 * warm / n:.2g}%): every published recipe warms up, "
            f"the least for {100 * lo:.2g}% of its steps")
    if high:
        what += f"; and train.lr = {g(lr)} is {lr / lr_ref[1]:.0f}x the recipes' largest for this size"
    return Suspect("warmup_none", UNSTABLE, what,
                   f"no warmup at a high LR: train.warmup_steps = {warm} with train.lr = {g(lr)} "
                   f"({lr / lr_ref[1]:.0f}x the recipes' peak LR for the size): the first updates, made before "
                   f"Adam's second moment has settled, are the largest of the run" if high else
                   f"no LR warmup (train.warmup_steps = {warm}): the first updates, before Adam's second moment has "
                   f"settled, are as large as the peak LR allows",
                   f"--set train.warmup_steps={steps} (1% of the run)", high or (j is not None and j[0] == "high"),
                   "train.warmup_steps", ref,
                   experiment=experiment(run, [f"train.warmup_steps={steps}"], min(steps_for(run), 200),
                                         "the early spikes or the divergence gone → the warmup; still there → the "
                                         "LR itself (halve it)"))


def clipping(run):
    clip = run.cfg("train.clip_grad") or 0
    if clip > 0:
        return None
    ref = recipes.cite("clip_grad")
    j = lr_judgement(run)
    return Suspect("clip_off", UNSTABLE, f"train.clip_grad = {g(clip)} (off): every published recipe clips the "
                   f"global gradient norm at 1.0", "gradient clipping off (train.clip_grad = 0): one large "
                   "gradient moves the weights as far as it points", "--set train.clip_grad=1.0",
                   j is not None and j[0] == "high", "train.clip_grad", ref)


def init(run):
    std = run.cfg("model.init_std")
    lo, hi = recipes.span("init_std")
    if not finite(std) or std <= INIT_FAR * hi:
        return None
    ref = recipes.cite("init_std")
    return Suspect("init_std", START, f"model.init_std = {g(std)}: the recipes initialise with std {g(hi)}",
                   f"the initialisation is {g(std / hi)}x the recipes' (model.init_std = {g(std)}): the model starts "
                   f"with large, confident logits", f"--set model.init_std={g(hi)}", std >= 25 * hi, "model.init_std",
                   ref)


# --- against the data -----------------------------------------------------------------------------------

def data_ids(run):
    """(ids the data holds: its largest id + 1, where it comes from) from the dataset's manifest, or None."""
    m = manifest(run)
    if not m:
        return None
    top = m.get("max_token_id")
    if isinstance(top, int) and top >= 0:
        return top + 1, "manifest.json max_token_id"
    v = m.get("vocab_size")
    return (v, "manifest.json vocab_size") if isinstance(v, int) and v > 0 else None


def head_share(run, vocab):
    """The LM head's share of a step's FLOPs (6 x hidden x vocab per token against 6 x the parameters of the blocks
    and the head), or None."""
    h, layers = run.cfg("model.hidden_size"), run.cfg("model.num_layers")
    if not h or not layers or not vocab:
        return None
    blocks = 12 * layers * h * h
    return vocab * h / (blocks + vocab * h)


def vocabulary(run):
    v_model, found = run.cfg("model.vocab_size"), data_ids(run)
    if not isinstance(v_model, int) or found is None:
        return None
    v_data, where = found
    if v_model <= max(VOCAB_SLACK * v_data, v_data + VOCAB_PAD):
        return None
    share, lean = head_share(run, v_model), head_share(run, v_data)
    first = run.train[0].get("initial_loss") if run.train else None
    ref = (f"{where} = {v_data - 1 if 'max' in where else v_data}; recipes pad a vocabulary by a fraction of a percent "
           f"for speed (nanoGPT: GPT-2's 50,257 ids to 50,304, a multiple of 64), never to many times the ids used")
    setting = (f"model.vocab_size = {v_model:,} while the data holds ids below {v_data:,} ({where}): "
               f"{v_model - v_data:,} output rows the data never asks for"
               + (f"; the LM head is {100 * share:.0f}% of each step's FLOPs (with {v_data:,} rows it would be "
                  f"{100 * lean:.0f}%)" if share is not None else ""))

    def shown_by(r):
        lines = []
        if finite(first) and first >= math.log(v_model) - 0.5 and math.log(v_model) - math.log(v_data) >= START_MARGIN:
            lines.append(f"the loss before any update was {g(first)} ≈ ln({v_model:,}) = {g(math.log(v_model))}, "
                         f"{g(first - math.log(v_data))} nats above ln({v_data:,}) = {g(math.log(v_data))}, where a "
                         f"model of the data's ids starts: the first steps only learn that those ids never occur")
        if share is not None and share >= COST_SHOWN:
            lines.append(f"the LM head computes {v_model:,} logits per token, {100 * share:.0f}% of each step's "
                         f"FLOPs, for {v_data:,} ids the data uses")
        return "; ".join(lines) or None

    return Suspect("vocab", COST, setting, f"the model's vocabulary ({v_model:,}) is far larger than the ids the data "
                   f"holds ({v_data:,}): a tokenizer/model mismatch (e.g. a Hugging Face model's vocabulary on data "
                   f"tokenized another way) or a hand-set vocab_size", f"--set model.vocab_size=null (take it from the "
                   f"dataset: {v_data:,})", (share or 0) >= COST_SHOWN or math.log(v_model / v_data) >= 2,
                   "model.vocab_size", ref, also=(START,), shown_by=shown_by)


def context(run):
    m = manifest(run)
    t = run.cfg("model.seq_length")
    if not m or not isinstance(t, int):
        return None
    sample = m.get("seq_length")
    if isinstance(sample, int) and t < sample:
        share = (sample - t) / (sample + 1)
        return Suspect("context_short", COST, f"model.seq_length = {t} reads the first {t + 1} of the {sample + 1} "
                       f"tokens of every sample (the dataset was packed for {sample}: manifest.json seq_length): "
                       f"{100 * share:.0f}% of the training tokens are never trained on",
                       f"the context is shorter than the samples: {100 * share:.0f}% of the data is cut away, so the "
                       f"run repeats {(sample + 1) / (t + 1):.1f}x fewer distinct tokens per epoch",
                       f"--set model.seq_length={sample} (the samples' length), or preprocess again with "
                       f"--seq-length {t} (no token cut)", share >= COST_SHOWN, "model.seq_length",
                       "the dataset's manifest (seq_length)",
                       shown_by=lambda r: (f"{100 * share:.0f}% of each sample's tokens are dropped before the model "
                                           f"sees them") if share >= COST_SHOWN else None)
    longest = longest_document(m)
    if longest is not None and m.get("format") in (None, "text") and longest * 8 <= t:
        return Suspect("context_long", COST, f"model.seq_length = {t}, while no training document is longer than "
                       f"{longest:,} tokens (manifest.json doc_length_histogram): each sample packs {t // longest}+ "
                       f"documents, and attention spends most of its work across unrelated ones",
                       "a context far longer than the documents: attention across document boundaries",
                       f"a context nearer the documents' length (--set model.seq_length={max(64, 2 * longest)}, "
                       f"preprocessed to match)", False, "model.seq_length",
                       "the dataset's manifest (document lengths)")
    return None


def longest_document(m):
    """The upper edge of the training split's longest document-length bin, or None."""
    hist = (((m.get("stats") or {}).get("train") or {}).get("doc_length_histogram")) or {}
    tops = []
    for label in hist:
        edge = label.split("-")[-1].replace(",", "").lstrip(">=")
        if edge.isdigit():
            tops.append(int(edge))
    return max(tops) if tops else None
