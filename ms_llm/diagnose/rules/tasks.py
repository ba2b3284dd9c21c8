"""Task accuracy against the validation loss (`ms-llm diagnose`), from the lm-eval records of the eval: section
(ms_llm.eval.hook): `task_at_chance` when the validation loss fell while a multiple-choice task's accuracy stayed at
chance at every evaluation. The loss then improved at what it measures (the next token of the validation text) and
not at what the task asks, and the run's loss curve is no evidence that the model does the task.

"At chance" allows for sampling noise: within max(AT_CHANCE_ABS, 2 binomial standard errors) of the task's chance
level (1 / choices, averaged over its documents), with the documents each evaluation scored.
"""
import math

from ms_llm.diagnose.common import Finding, cause, finite, g, points
from ms_llm.diagnose.registry import EVAL, rule

MIN_TASK_EVALS = 2   # evaluations of the task (the at-start one counts): one alone shows no trend
VAL_FALL = 0.05      # the validation loss fell by at least 5% (relative) between its first and last evaluation
AT_CHANCE_ABS = 0.02


@rule(finds=('task_at_chance_*',), reads=('loss_nonfinite', 'divergence'), live=EVAL)
def rule_tasks(run, found, _):
    if not run.task_evals or any(k in found for k in ("loss_nonfinite", "divergence")):
        return None
    vals = points(run.evals, "val_loss")
    start = next((r.get("initial_loss") for r in run.train if finite(r.get("initial_loss"))), None)
    first = (vals[0][0], vals[0][1]) if len(vals) >= 2 else ((0, start) if vals and start is not None else None)
    if first is None or not vals or vals[-1][1] > (1 - VAL_FALL) * first[1]:
        return None
    out = []
    for task in sorted({t for r in run.task_evals for t in r.get("tasks") or ()}):
        rows = [(r["step"], r.get(f"{task}/acc"), r.get(f"{task}/chance"), r.get(f"{task}/docs"))
                for r in run.task_evals if finite(r.get(f"{task}/acc")) and finite(r.get(f"{task}/chance"))]
        if len(rows) < MIN_TASK_EVALS or not all(at_chance(acc, c, n) for _, acc, c, n in rows):
            continue
        out.append(finding(run, task, rows, first, vals[-1]))
    return out


def margin(chance, docs):
    """How far from chance an accuracy over `docs` documents may land by luck alone."""
    se = math.sqrt(chance * (1 - chance) / docs) if finite(docs) and docs > 0 else 0.0
    return max(AT_CHANCE_ABS, 2 * se)


def at_chance(acc, chance, docs):
    return abs(acc - chance) <= margin(chance, docs)


def finding(run, task, rows, first, last):
    chance, docs = rows[-1][2], rows[-1][3]
    what = "the loss before any update" if first[0] == 0 else f"step {first[0]}"
    ev = [f"val_loss {g(first[1])} ({what}) → {g(last[1])} at step {last[0]} "
          f"({100 * (1 - last[1] / first[1]):.0f}% lower)",
          f"{task} acc: " + ", ".join(f"{acc:.3f} at step {s}" for s, acc, _, _ in rows)
          + f"; chance {chance:.3f} (1 / choices), ±{margin(chance, docs):.3f} by luck"
          + (f" over {docs} documents" if finite(docs) else "")]
    causes = [cause("the model has learned what the loss measures (the statistics of the next token of text like "
                    "its training data) but not what the task asks: too small or too early in training for it, or "
                    "the task's text is unlike its training data (another language, domain or format)", "medium"),
              cause("the evaluation does not see the model as trained: another tokenizer than the model's, prompts "
                    "cut to the model's context (ms-llm eval says when requests are cut), or the task's answer key "
                    "(doc_to_target / doc_to_choice) wrong", "low")]
    actions = [f"look at what the model answers: ms-llm eval --run-dir {run.path} --tasks {task} --limit 20 "
               f"--log-samples (the JSON lists each document's choices and log-likelihoods)",
               f"check the task itself on a model known to do it (ms-llm eval --hf <released model> --tasks {task})",
               "judge the run by the task, not by the loss: train longer or larger, or on data like the task's"]
    return Finding(f"task_at_chance_{task}", "warning",
                   f"validation loss fell but {task} stayed at chance at every evaluation: the loss improved at "
                   f"predicting text, not at the task", ev, causes, actions, steps=[s for s, *_ in rows])
