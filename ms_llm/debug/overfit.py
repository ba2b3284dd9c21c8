"""`ms-llm debug overfit`: can the model memorise a handful of samples? If not, it is a bug, not the data.

The run: the first `samples` training samples, the same batch every step, dropout and weight decay off,
constant learning rate after a short warmup. It passes when the loss falls below `threshold` × its
initial value *and* the loss the step optimised agrees with an independent next-token loss computed
here from the logits (targets = inputs shifted by one). That second check catches label bugs that a
falling loss hides: targets not shifted (the model learns to copy its input) or shifted twice.
"""
import math

import numpy as np

from ms_llm.config import with_overrides
from ms_llm.rundir.start import judge_start


def overfit_config(cfg, samples, steps):
    micro = cfg.train.micro_batch_size if samples % cfg.train.micro_batch_size == 0 else samples
    return with_overrides(cfg, [f"train.global_batch_size={samples}", f"train.micro_batch_size={micro}",
                                f"train.max_steps={steps}", f"train.warmup_steps={min(cfg.train.warmup_steps, steps // 10)}",
                                "train.lr_schedule=constant", "train.weight_decay=0.0", "model.dropout=0.0",
                                "train.eval_interval=0", "train.anomaly=null", "parallel_config.data_parallel=null",
                                "monitor.summary=false"])


def next_token_loss(logits, ids):
    """Mean cross-entropy of logits[:, t] against ids[:, t + 1], in float64 numpy."""
    x = logits.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    logp = x - np.log(np.exp(x).sum(-1, keepdims=True))
    targets = ids[:, 1:]
    return float(-np.take_along_axis(logp, targets[..., None], -1).mean())


def overfit(cfg, samples=32, steps=300, threshold=0.1, echo=print):
    import mindspore as ms

    from ms_llm.data.loader import TrainBatches
    from ms_llm.train.setup.dataset import prepared_runtime
    from ms_llm.train.session import open_session
    from ms_llm.train.step_runner import StepRunner

    cfg = overfit_config(cfg, samples, steps)
    s = open_session(cfg, echo, purpose="overfit", rt=prepared_runtime(cfg, echo))
    fixed = TrainBatches(s.cfg.data.dataset_dir, s.manifest, "train", s.cfg.train.micro_batch_size,
                         seq_length=s.cfg.model.seq_length, shuffle=False)
    batches = [next(fixed) for _ in range(s.accum)]
    runner = StepRunner(s)
    before = {p.name: p.asnumpy().copy() for p in s.model.trainable_params()}
    losses = []
    for step in range(steps):
        losses.append(float(runner.step(list(batches))[0].asnumpy()))
        if not math.isfinite(losses[-1]):
            break
    s.model.set_train(False)
    ids = np.concatenate([b.asnumpy() for b in batches])
    logits = s.model(ms.Tensor(ids[:, :-1])).asnumpy()
    reference = next_token_loss(logits, ids)
    copies = float((logits.argmax(-1) == ids[:, :-1]).mean())
    frozen = [p.name for p in s.model.trainable_params() if np.array_equal(before[p.name], p.asnumpy())]
    return report(losses, reference, copies, frozen, threshold, s.cfg.train.lr, s.cfg.model.vocab_size)


def report(losses, reference, copies, frozen, threshold, lr, vocab):
    first, last = losses[0], losses[-1]
    fell = math.isfinite(last) and last < threshold * first
    consistent = abs(reference - last) < max(0.5, 0.5 * last)
    suspects = []
    if copies > 0.5:
        suspects.append(f"labels: the model predicts its own input token at {100 * copies:.0f}% of positions — the "
                        f"targets are not shifted (the step trains on ids[:, :-1] → ids[:, :-1])")
    if fell and not consistent or not fell and reference > last + 0.5:
        suspects.append(f"labels: the optimised loss ({last:.3f}) is not the next-token loss of the same logits "
                        f"({reference:.3f}) — targets shifted wrongly (not shifted, or shifted twice) or misaligned "
                        f"with the logits")
    if not math.isfinite(last) or (len(losses) > 10 and last > first):
        suspects.append(f"learning rate too high (train.lr = {lr:g}): the loss rose or became non-finite")
    elif not fell and first - last < 0.1 * first:
        suspects.append(f"learning rate too low or gradients not reaching the weights (train.lr = {lr:g}): the loss "
                        f"moved {first - last:.3f} in {len(losses)} steps")
    if frozen:
        suspects.append(f"parameters that never changed ({len(frozen)}): {', '.join(frozen[:6])}"
                        + (" ..." if len(frozen) > 6 else "") + " — detached from the loss, or frozen")
    start = judge_start(first, vocab)  # the same judgement as `ms-llm diagnose`'s
    if start is not None and start.verdict != "ok":
        suspects.append(start.text())
    passed = fell and consistent and copies <= 0.5 and not frozen
    return {"passed": passed, "initial_loss": first, "final_loss": last, "reference_loss": reference,
            "threshold": threshold * first, "copy_rate": copies, "frozen": frozen, "suspects": suspects,
            "curve": [(i + 1, losses[i]) for i in range(0, len(losses), max(1, len(losses) // 15))]}


def format_report(r):
    verdict = "PASSED" if r["passed"] else "FAILED"
    lines = [f"overfit check {verdict}: loss {r['initial_loss']:.4f} → {r['final_loss']:.4f} "
             f"(threshold {r['threshold']:.4f}); independent next-token loss of the final logits "
             f"{r['reference_loss']:.4f}",
             "  curve: " + ", ".join(f"{s}:{v:.3f}" for s, v in r["curve"])]
    if not r["passed"]:
        lines.append("  likely causes:")
        lines += [f"    - {x}" for x in r["suspects"] or ["none of the usual suspects; inspect the model code"]]
    return "\n".join(lines)
