"""Task evaluation during training: the `eval:` config section as a trainer hook (handed to the loop by
ms_llm.run_hooks; the loop knows nothing of lm-eval).

It evaluates the training model itself (no checkpoint round trip) beside validation: at every `eval.interval` steps
and at the end, inside the loop's pause (so tokens/s stays the steps'), and once before the first step of a run
that starts at step 0 (`eval.at_start`: the chance baseline). Each evaluation writes one record to metrics.jsonl:

    {"step": 500, "tasks": ["shakespeare_cloze"], "shakespeare_cloze/acc": 0.41, "shakespeare_cloze/acc_norm": 0.41,
     "shakespeare_cloze/chance": 0.25, "shakespeare_cloze/docs": 200, "duration_s": 3.2, "time": ..., "elapsed_s": ...}

which the report draws, `compare-curves --metric shakespeare_cloze/acc` compares, `diagnose` reads and the wall-time
accounting counts (its duration_s). The global random states (Python, NumPy, torch) are restored after each
evaluation, since lm-eval seeds them: evaluating does not change what training draws.
"""
import contextlib
import io
import logging
import random
import sys
import time

from ms_llm.train.loop.hooks import Hook


class TaskEval(Hook):
    def __init__(self, eval_cfg, log=print):
        from ms_llm.eval.harness import require_lm_eval
        from ms_llm.eval.run import check_limit
        from ms_llm.eval.tasks import task_manager

        require_lm_eval()
        self.cfg = eval_cfg
        self.limit = check_limit(eval_cfg.limit, "eval.limit")
        # unknown tasks and missing data files are refused here, before the run starts
        self.manager, self.names = task_manager(list(eval_cfg.tasks), list(eval_cfg.include_path), log)
        self.lm, self.tasks = None, None

    def before_step(self, run, step, batches):
        if step == 0 and self.cfg.at_start:  # (the compile cache is on only around the step's own compile)
            self.evaluate(run, 0)

    def after_eval(self, run, step, val_loss):
        last = step == run.session.cfg.train.max_steps
        if last or (self.cfg.interval and step % self.cfg.interval == 0):
            self.evaluate(run, step)

    def model(self, run):
        """lm-eval's model over the session's own (a session reopened without the compile cache has a new one)."""
        s = run.session
        if self.lm is None or self.lm.loaded.model is not s.model:
            from ms_llm.data.tokenizers import from_spec
            from ms_llm.eval.harness import MsLLM
            from ms_llm.eval.source import LoadedModel
            from ms_llm.eval.tokenizer import EvalTokenizer

            tok = EvalTokenizer(from_spec(s.manifest["tokenizer"]), source=s.cfg.data.dataset_dir)
            loaded = LoadedModel(s.model, tok, s.cfg.model.seq_length, run.run_dir)
            self.lm = MsLLM(loaded, batch_size=self.cfg.batch_size, log=run.log, progress=False)
        return self.lm

    def evaluate(self, run, step):
        from ms_llm.eval.run import chance_levels, evaluate_loaded, flat_scores, load_tasks

        lm, t0 = self.model(run), time.perf_counter()
        states = random_states()
        run.session.model.set_train(False)
        logging.getLogger("lm_eval").setLevel(logging.WARNING)
        try:  # lm-eval's progress bars (one per task and request type) would bury the log lines
            with contextlib.redirect_stderr(io.StringIO()):
                if self.tasks is None:  # datasets read once, the same documents at every evaluation
                    self.tasks = load_tasks(self.manager, self.names, self.cfg.num_fewshot)
                results = evaluate_loaded(lm, self.tasks, self.limit)
        finally:
            run.session.model.set_train(True)
            restore_random_states(states)
        duration = time.perf_counter() - t0
        record = {"step": step, "tasks": sorted(flat_scores(results))}
        chance = chance_levels(results)
        for task, scores in sorted(flat_scores(results).items()):
            record.update({f"{task}/{metric}": round(v, 6) for metric, v in scores.items()})
            if task in chance:
                record[f"{task}/chance"] = round(chance[task], 6)
            docs = ((results.get("n-samples") or {}).get(task) or {}).get("effective")
            if docs is not None:
                record[f"{task}/docs"] = docs
        record["duration_s"] = round(duration, 4)
        run.writer.write(record)  # rank 0 writes it; every rank prints its line (monitor.metrics.format_line)


def random_states():
    torch = sys.modules.get("torch")
    import numpy as np

    return random.getstate(), np.random.get_state(), torch.get_rng_state() if torch is not None else None


def restore_random_states(states):
    import numpy as np

    random.setstate(states[0])
    np.random.set_state(states[1])
    torch = sys.modules.get("torch")
    if torch is not None and states[2] is not None:
        torch.set_rng_state(states[2])
