"""The `eval` command: lm-evaluation-harness tasks on a run, a checkpoint or a Hugging Face folder; prints lm-eval's
table and writes its results JSON. `add_parsers(subparsers)` registers it."""
import datetime
import os
import time

from ms_llm.errors import UserError


def cmd_eval(args):
    from ms_llm.eval.harness import require_lm_eval

    require_lm_eval()
    from ms_llm.eval.run import check_limit, evaluate, table, write_results
    from ms_llm.eval.tasks import task_manager

    limit = check_limit(args.limit)
    if args.num_fewshot is not None and args.num_fewshot < 0:
        raise UserError(f"--num-fewshot = {args.num_fewshot} must be 0 or more.")
    if args.bootstrap_iters < 0:
        raise UserError(f"--bootstrap-iters = {args.bootstrap_iters} must be 0 (no standard errors) or more.")
    names = [t.strip() for t in (args.tasks or "").split(",") if t.strip()]
    manager, names = task_manager(names, args.include_path or ())  # a bad task name is refused before the model loads
    from ms_llm.eval.harness import MsLLM

    t0 = time.perf_counter()
    lm = MsLLM(batch_size=args.batch_size, seed=args.seed, run_dir=args.run_dir, hf=args.hf,
               checkpoint=args.checkpoint, config=args.config, tokenizer=args.tokenizer, max_length=args.max_length)
    print(f"model: {lm.loaded.name}, context {lm.max_length} tokens, batch {lm.batch_size}", flush=True)
    results = evaluate(lm, names, manager, limit, args.num_fewshot, args.bootstrap_iters, log_samples=True,
                       seed=args.seed)
    results["ms_llm"] = {"model": lm.loaded.name, "context": lm.max_length, "batch_size": lm.batch_size,
                         "truncated_requests": lm.truncated, "seconds": round(time.perf_counter() - t0, 2)}
    if not args.log_samples:
        results.pop("samples", None)
    print(table(results), flush=True)
    if lm.truncated:
        print(f"note: {lm.truncated} request(s) were cut from the left to the context of {lm.max_length} tokens",
              flush=True)
    path = write_results(results, args.output or default_output(args))
    print(f"results: {path}", flush=True)
    return 0


def default_output(args):
    """<run>/eval/<time>.json for a run (it records what was done to it); ./eval_results/<model>_<time>.json else."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    if args.run_dir:
        return os.path.join(args.run_dir, "eval", f"{stamp}.json")
    name = os.path.basename(os.path.normpath(args.hf or os.path.dirname(os.path.abspath(args.checkpoint))))
    return os.path.join("eval_results", f"{name}_{stamp}.json")


def add_parsers(subparsers):
    p = subparsers.add_parser("eval", help="lm-evaluation-harness tasks on a run, a checkpoint or a Hugging Face "
                                           "folder (local task files; docs/evaluation.md)")
    p.add_argument("--run-dir", help="a training run: its newest checkpoint (or --checkpoint) and its tokenizer")
    p.add_argument("--hf", metavar="HF_DIR", help="a Hugging Face model folder (config.json, *.safetensors, "
                                                 "tokenizer.json), converted in memory")
    p.add_argument("--checkpoint", help="a .ckpt/.safetensors file: one of --run-dir's, or a converted model's with "
                                        "its config.yaml beside it (or --config) and --tokenizer")
    p.add_argument("--config", help="with --checkpoint alone: the model's config.yaml")
    p.add_argument("--tokenizer", help="a tokenizer.json / tokenizer.model in place of the model's own")
    p.add_argument("--tasks", required=True, help="comma-separated lm-eval task names, groups, globs or YAML paths; "
                                                  "shakespeare_cloze is the bundled demo task")
    p.add_argument("--include-path", action="append", metavar="DIR",
                   help="a folder of task YAML files (repeatable), e.g. local tasks with dataset_path: json")
    p.add_argument("--limit", type=float, help="documents per task (or a share of them, below 1)")
    p.add_argument("--num-fewshot", type=int, help="few-shot examples per prompt (default: the task's)")
    p.add_argument("--batch-size", type=int, help="requests per model call (default: as many as keep a batch's "
                                                  "float32 logits within 1 GiB, at most 32)")
    p.add_argument("--max-length", type=int, help="the context in tokens (default: the model's seq_length; longer "
                                                  "requests are cut from the left, as lm-eval's hf model does)")
    p.add_argument("--output", metavar="FILE.json", help="where the results JSON goes (default: RUN/eval/<time>.json, "
                                                         "else ./eval_results/<model>_<time>.json)")
    p.add_argument("--log-samples", action="store_true", help="keep every document's requests and answers in the JSON")
    p.add_argument("--bootstrap-iters", type=int, default=100000,
                   help="bootstrap resamples for the standard errors lm-eval bootstraps (default 100000, lm-eval's; "
                        "0: none)")
    p.add_argument("--seed", type=int, default=0, help="seed of few-shot sampling and of sampled generation")
    p.set_defaults(func=cmd_eval)
