"""Fine-tuning (`ms-llm diagnose`): what goes wrong when a released model is fine-tuned on chat/instruction data
(docs/finetuning.md).

  loss_mask_empty   the loss mask keeps no, or almost no, target tokens: the loss is computed on nothing
  prompt_in_loss    the loss counts the prompts: the run turned the mask off, or the prompt tokens' loss falls
                    faster than the responses' and ends visibly below it
  base_drift        the base model is being forgotten: the plain-text validation set (data.extra_val) rises while
                    the fine-tuning loss falls

Evidence: the log records' `loss_tokens_frac` (the share of target tokens the loss counted, rank 0's micro-batches
over each log interval), the evaluations' `val_loss` (response tokens), `val_loss_prompt` and `extra_val_loss`,
the run's config (finetune.loss_mask) and the dataset facts in run_info.json (format, share of response tokens,
conversations cut to the sample length).
"""
import statistics

from ms_llm.diagnose.common import Finding, cause, curve, g, points, quoted
from ms_llm.diagnose.registry import EVAL, rule

EMPTY_FRAC = 0.02          # fewer than 2% of the target tokens in the loss: "almost none"
PROMPT_GAP_ABS, PROMPT_GAP_REL = 0.3, 0.15   # prompt loss below the responses' by max(0.3 nats, 15%) ...
PROMPT_FALL_RATIO = 1.5    # ... having fallen 1.5x as much as the responses' since the first evaluation
MASK_OFF_FRAC = 0.95       # the loss counted >= 95% of the target tokens on data whose mask keeps far fewer
DRIFT_ABS, DRIFT_REL = 0.05, 0.03   # extra_val_loss above its first value by max(0.05, 3%) at the last two evals
TRAIN_FALL = 0.02          # ... while the training loss fell by 2%


def dataset(run):
    return (run.info.get("dataset") or {}) if isinstance(run.info, dict) else {}


def chat_data(run):
    return dataset(run).get("format") in ("chat", "instruction")


def data_fraction(run):
    """The share of the training split's tokens the dataset's loss mask keeps (preprocessing counted it)."""
    return ((dataset(run).get("finetune") or {}).get("train") or {}).get("loss_fraction")


def rule_empty_mask(run, found, _):
    fr = points(run.train, "loss_tokens_frac")
    if not fr:
        return None
    values = [v for _, v in fr]
    median = statistics.median(values)
    zero_steps = [s for s, v in fr if v == 0]
    if median >= EMPTY_FRAC and not zero_steps:
        return None
    ds = dataset(run)
    ft = ds.get("finetune") or {}
    ev = [f"the loss counted {100 * median:.2f}% of the target tokens (median over {len(fr)} log records of "
          f"loss_tokens_frac; min {100 * min(values):.2f}%)"]
    if zero_steps:
        ev.append(f"no token at all in the log intervals ending at step(s) {', '.join(map(str, zero_steps[:8]))}: "
                  f"those updates were computed on nothing (loss 0, gradients 0)")
    if data_fraction(run) is not None:
        ev.append(f"the dataset's loss mask keeps {100 * data_fraction(run):.2f}% of its training tokens "
                  f"(preprocessing's count)")
    causes = []
    truncated = ft.get("truncated") or 0
    data_frac, run_seq, data_seq = data_fraction(run), run.cfg("model.seq_length"), ds.get("seq_length")
    if data_frac is not None and median < data_frac / 4 and run_seq and data_seq and run_seq < data_seq:
        causes.append(cause(f"the run reads part of each sample: model.seq_length = {run_seq}, the dataset's samples "
                            f"hold {data_seq} + 1 tokens, and the cut-off tails hold the responses", "high"))
    if truncated:
        causes.append(cause(f"conversations longer than a sample: {truncated:,} were cut to model.seq_length + 1 "
                            f"tokens, which cuts the responses at their end first"
                            + (f" ({ft.get('dropped')} kept none and were dropped)" if ft.get("dropped") else ""),
                            "high" if median < EMPTY_FRAC and not causes else "medium"))
    causes.append(cause("responses that are very short beside their prompts (a long system prompt or context and "
                        "one-word answers): the data's own balance", "medium" if not truncated else "low"))
    causes.append(cause("the chat template marks little as the assistant's (a template whose assistant header "
                        "swallows the reply, or {% generation %} markers around the wrong text)", "low"))
    ds_dir = ds.get("dir")
    actions = [f"ms-llm data info {quoted(ds_dir) if ds_dir else 'DATASET'} (the share of tokens in the loss and the "
               f"conversations cut)"]
    if run_seq and data_seq and run_seq < data_seq:
        actions.append(f"--set model.seq_length={data_seq} (the dataset's sample length)")
    if truncated:
        actions.append(f"preprocess again with a longer --seq-length (now {run.cfg('model.seq_length')}), or "
                       f"--refuse-long to find the long conversations")
    actions.append("check one sample's mask: docs/finetuning.md shows how to print a sample with its loss mask")
    severity = "error" if median < EMPTY_FRAC / 4 or len(zero_steps) > len(fr) // 2 else "warning"
    return [Finding("loss_mask_empty", severity, f"the loss mask keeps almost no tokens ({100 * median:.2f}% of the "
                    f"targets): the loss is computed on {'nothing' if median == 0 else 'almost nothing'}",
                    ev, causes, actions, zero_steps[:8] or [fr[0][0]])]


def rule_prompt_in_loss(run, found, _):
    if not chat_data(run) and not points(run.evals, "val_loss_prompt"):
        return None
    fr = [v for _, v in points(run.train, "loss_tokens_frac")]
    data_frac = data_fraction(run)
    mask_off = run.cfg("finetune.loss_mask") is False or (
        fr and data_frac is not None and statistics.median(fr) >= MASK_OFF_FRAC > data_frac + 0.1)
    ev, causes, steps = [], [], []
    if mask_off:
        ev.append("finetune.loss_mask = false: the loss counts every token, the prompts and the template's own text "
                  "included" if run.cfg("finetune.loss_mask") is False else "the mask is on, yet the loss counted "
                  "nearly every token")
        if fr and data_frac is not None:
            ev.append(f"the loss counted {100 * statistics.median(fr):.1f}% of the target tokens; the dataset's mask "
                      f"keeps {100 * data_frac:.1f}%")
        causes.append(cause("the loss is computed over the prompts as well as the responses: the model spends its "
                            "capacity learning to write the user's turns and the template", "high"))
    prompt, resp = points(run.evals, "val_loss_prompt"), points(run.evals, "val_loss")
    learned = None
    if len(prompt) >= 2 and len(resp) >= 2:
        p0, p1, r0, r1 = prompt[0][1], prompt[-1][1], resp[0][1], resp[-1][1]
        below = r1 - p1 > max(PROMPT_GAP_ABS, PROMPT_GAP_REL * r1)
        faster = (p0 - p1) > PROMPT_FALL_RATIO * max(r0 - r1, 0.0) and p0 - p1 > PROMPT_GAP_ABS
        learned = below and faster
        if learned or mask_off:
            ev.append(f"validation: loss on the prompt tokens {g(p0)} → {g(p1)}, on the response tokens {g(r0)} → "
                      f"{g(r1)} (steps {prompt[0][0]} → {prompt[-1][0]})")
            steps = [prompt[0][0], prompt[-1][0]]
        if learned and not mask_off:
            causes.append(cause("the prompts reach the loss by another way: a dataset made without its mask (plain "
                                "text rendered from chats) or a mask that marks the prompts", "medium"))
            causes.append(cause("the prompts are templated and repetitive (a fixed system prompt, role headers), so "
                                "they become predictable from what the responses teach, without being trained on",
                                "medium"))
    if not mask_off and not learned:
        return None
    actions = ["--set finetune.loss_mask=true (the loss on the response tokens only)"] if mask_off else []
    if learned and not mask_off:
        actions.append("compare loss_tokens_frac in metrics.jsonl with the dataset's share of response tokens "
                       "(ms-llm data info DATASET): equal means the mask is applied, and the prompts are merely easy")
    actions.append("preprocess chat data with --format chat (or instruction) so that it carries its loss mask")
    return [Finding("prompt_in_loss", "warning", "the loss counts the prompts" if mask_off else
                    "the prompt tokens' loss falls faster than the responses' and ends well below it",
                    ev, causes, actions, steps)]


def rule_base_drift(run, found, _):
    extra = points(run.evals, "extra_val_loss")
    pts = curve(run)
    if len(extra) < 3 or len(pts) < 4:
        return None
    first = extra[0]
    line = first[1] + max(DRIFT_ABS, DRIFT_REL * first[1])
    train_first = statistics.median([v for s, v in pts[:3]])
    train_last = statistics.median([v for s, v in pts[-3:]])
    if not (extra[-1][1] > line and extra[-2][1] > line and train_last < (1 - TRAIN_FALL) * train_first):
        return None
    resp = points(run.evals, "val_loss")
    ev = [f"extra_val_loss (the plain-text set {run.cfg('data.extra_val')}): {g(first[1])} at step {first[0]}, then "
          + ", ".join(f"{g(v)} at step {s}" for s, v in extra[1:]),
          f"fine-tuning loss {g(train_first)} → {g(train_last)} over the same steps"]
    if resp:
        ev.append(f"val_loss (held-out fine-tuning data) {g(resp[0][1])} → {g(resp[-1][1])}")
    full = run.cfg("finetune.lora") is None
    lr = run.cfg("train.lr")
    causes = [cause("the fine-tuning moves the weights away from what the base model knew (catastrophic "
                    "forgetting): " + (f"every weight trains (full fine-tuning) at train.lr = {g(lr)}" if full else
                                       f"LoRA at train.lr = {g(lr)}"), "high"),
              cause("data.extra_val is unlike the base model's own data, so its loss says little about the base's "
                    "knowledge", "low")]
    best = min(extra, key=lambda p: p[1])
    actions = [f"lower the learning rate (--set train.lr={g(lr / 4) if lr else '1e-5'}; docs/finetuning.md lists the "
               f"usual fine-tuning values)",
               f"fewer steps: the plain-text loss was lowest at step {best[0]}"]
    if full:
        actions.append("train adapters instead: --set finetune.lora.rank=16 (the base weights stay as they are)")
    actions.append("mix base-domain text into the fine-tuning data")
    return [Finding("base_drift", "warning", f"the model drifts from the base: plain-text validation rising "
                    f"({g(first[1])} → {g(extra[-1][1])}) while the fine-tuning loss falls", ev, causes, actions,
                    [first[0], extra[-1][0]])]


@rule(finds=('loss_mask_empty', 'prompt_in_loss', 'base_drift'), reads=('labels',), live=EVAL)
def rule_finetune(run, found, limit):
    """The three rules above. An empty mask explains a loss near zero better than the label rules' causes (targets
    not shifted): their finding is withdrawn in its favour."""
    out = []
    for judge in (rule_empty_mask, rule_prompt_in_loss, rule_base_drift):
        out += judge(run, found, limit) or []
    for f in out:
        if f.id == "loss_mask_empty":
            f.supersedes = ["labels"]
    return out
