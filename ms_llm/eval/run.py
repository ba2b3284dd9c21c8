"""One evaluation through lm-eval's own evaluator: tasks resolved (ms_llm.eval.tasks), the model's requests answered
by ms_llm.eval.harness, lm-eval's table printed and its results JSON written. Used by `ms-llm eval` and by the
in-training hook (ms_llm.eval.hook)."""
import json
import math
import os

from ms_llm.errors import UserError


def check_limit(limit, name="--limit"):
    """lm-eval's limit: a number of documents per task (>= 1), or a share of them (0 < limit < 1)."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not math.isfinite(limit) or limit <= 0:
        raise UserError(f"{name} = {limit} evaluates nothing: give a number of documents per task (e.g. {name} 100), "
                        f"a share of them below 1 (e.g. 0.1), or leave it out for every document.")
    if limit >= 1:
        if limit != int(limit):
            raise UserError(f"{name} = {limit}: a number of documents is whole (e.g. 100); a share is below 1.")
        return int(limit)
    return float(limit)


def evaluate(lm, names, manager, limit=None, num_fewshot=None, bootstrap_iters=100000, log_samples=True, seed=0):
    """lm-eval's results dict for `names` on the MsLLM `lm` (simple_evaluate: with the environment report)."""
    import lm_eval

    try:
        results = lm_eval.simple_evaluate(model=lm, tasks=list(names), task_manager=manager, limit=limit,
                                          num_fewshot=num_fewshot, bootstrap_iters=bootstrap_iters,
                                          log_samples=log_samples, random_seed=seed, numpy_random_seed=seed,
                                          torch_random_seed=seed, fewshot_random_seed=seed)
    except FileNotFoundError as e:
        raise UserError(f"a task's data could not be read: {e}. Check the data_files of its YAML (relative paths "
                        f"are relative to {os.getcwd()}).") from None
    except ConnectionError as e:
        raise UserError(f"a task's dataset is on the Hugging Face Hub and the Hub cannot be reached ({e}). Download "
                        f"its files and point a local task YAML at them (docs/evaluation.md).") from None
    return results


def load_tasks(manager, names, num_fewshot=None):
    """lm-eval's task dict for `names`, few-shot counts set as simple_evaluate sets them: built once by the
    in-training hook, which evaluates the same tasks many times."""
    loaded = manager.load(list(names))
    for task in loaded["tasks"].values():
        default = task.get_config("num_fewshot")
        if num_fewshot is not None and default != 0:  # a task that pins 0 keeps it, as in lm-eval
            task.set_config(key="num_fewshot", value=num_fewshot)
        elif default is None:
            task.set_config(key="num_fewshot", value=0)
    return loaded


def evaluate_loaded(lm, loaded, limit=None, seed=0):
    """lm-eval's evaluator on a loaded task dict (no environment report: it runs nvidia-smi and git, seconds each
    time); the few-shot samplers reseeded, so every evaluation of a run draws the same examples."""
    from lm_eval.evaluator import evaluate as lm_evaluate

    for task in loaded["tasks"].values():
        task.set_fewshot_seed(seed=seed)
    return lm_evaluate(lm=lm, task_dict=loaded, limit=limit, bootstrap_iters=0, log_samples=True, verbosity="WARNING")


def chance_levels(results):
    """{task: expected accuracy of a uniform guess} for multiple-choice tasks whose samples were logged."""
    out = {}
    for task, samples in (results.get("samples") or {}).items():
        cfg = (results.get("configs") or {}).get(task) or {}
        if cfg.get("output_type") != "multiple_choice" or not samples:
            continue
        metrics = [m.get("metric") for m in cfg.get("metric_list") or []]
        per_choice = 2 if "acc_mutual_info" in metrics else 1  # that metric asks each choice twice
        out[task] = sum(per_choice / len(s["arguments"]) for s in samples) / len(samples)
    return out


def flat_scores(results):
    """{task: {metric: value}}: lm-eval's "acc,none" as acc, "exact_match,strict-match" as exact_match/strict-match;
    standard errors and aliases left out."""
    out = {}
    for task, values in (results.get("results") or {}).items():
        row = {}
        for key, value in values.items():
            metric, _, filt = key.partition(",")
            if "_stderr" in metric or metric == "sample_len" or not isinstance(value, (int, float)) \
                    or isinstance(value, bool):
                continue
            row[metric if filt in ("", "none") else f"{metric}/{filt}"] = float(value)
        out[task] = row
    return out


def table(results):
    """lm-eval's own table (and its groups table)."""
    from lm_eval.utils import make_table

    text = make_table(results)
    if results.get("groups"):
        text += "\n" + make_table(results, "groups")
    return text


def write_results(results, path):
    from lm_eval.utils import handle_non_serializable

    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1, default=handle_non_serializable, ensure_ascii=False)
        f.write("\n")
    os.replace(tmp, path)
    return path
