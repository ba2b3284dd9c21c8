"""`ms-llm <command>`: the command-line entry point. Each command parses its arguments and calls one
function of the framework; a `UserError` becomes one paragraph on stderr and exit code 2."""
import argparse
import sys

from ms_llm.errors import UserError
from ms_llm.config.cli_args import add_config_arguments


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad argument exits 2 with one line naming it and the usage (no traceback)."""

    def error(self, message):
        self.print_usage(sys.stderr)
        self.exit(2, f"error: {message}. Run '{self.prog} --help' for the options.\n")


def add_train_args(p):
    add_config_arguments(p)
    p.add_argument("--run-dir", help="where the run is written (default: runs/<config>-<time>); must not exist "
                                     "unless --resume")
    p.add_argument("--resume", action="store_true", help="continue the run in --run-dir from its newest checkpoint")
    p.add_argument("--dry-run", action="store_true",
                   help="check config, data and parallel layout and compile the step, then stop (no run dir)")
    p.add_argument("--weights-only", action="store_true",
                   help="with --resume: accept a checkpoint without optimizer state (AdamW restarts from zero)")


def cmd_train(args):
    from ms_llm.config import load_config

    cfg = load_config(args.config, args.overrides)  # a bad config is refused before MindSpore is imported
    from ms_llm import env

    env.cache_root()  # and a cache folder that cannot be one, before the dataset or the run directory is written
    if args.dry_run:
        from ms_llm.train.trainer import dry_run

        dry_run(cfg)
        return
    if args.weights_only and not args.resume:
        raise UserError("--weights-only only applies with --resume. To start a new run from weights, use "
                        "--set checkpoint.load_weights=<file>.")
    from ms_llm.run_hooks import hooks_for
    from ms_llm.train.trainer import run

    run(cfg, run_dir=args.run_dir, resume=args.resume, config_path=args.config, weights_only=args.weights_only,
        hooks=hooks_for(cfg))


def cmd_preprocess(args):
    from ms_llm.data.preprocess import keep_large_arrays_off_the_heap, preprocess

    if args.config:
        from ms_llm.config import load_config

        cfg = load_config(args.config, args.overrides)
        d = cfg.data
        args.input = args.input or ([d.source] if d.source else None)
        args.output_dir = args.output_dir or d.dataset_dir
        args.seq_length = args.seq_length or cfg.model.seq_length
        args.tokenizer = args.tokenizer or d.tokenizer
        args.val_fraction = args.val_fraction if args.val_fraction is not None else d.val_fraction
        args.text_field = args.text_field or d.text_field
        args.format = args.format or d.format
    missing = [f"--{n.replace('_', '-')}" for n in ("input", "output_dir", "seq_length") if not getattr(args, n)]
    if missing:
        raise UserError(f"preprocess needs {', '.join(missing)} (or --config with data.source, data.dataset_dir and "
                        f"model.seq_length).")
    if args.seq_length <= 0:
        raise UserError(f"--seq-length = {args.seq_length} must be a positive integer.")
    val = 0.1 if args.val_fraction is None else args.val_fraction
    if not 0 <= val < 1:
        raise UserError(f"--val-fraction = {val} must be at least 0 and below 1 (e.g. 0.1; 0: no validation split).")
    if args.workers is not None and args.workers < 1:
        raise UserError(f"--workers = {args.workers} must be at least 1 (default: the number of CPU cores).")
    if args.shard_size_mb < 1:
        raise UserError(f"--shard-size-mb = {args.shard_size_mb} must be at least 1.")
    keep_large_arrays_off_the_heap()  # this process only preprocesses: its peak memory then stays flat
    fmt = args.format or "text"
    if fmt != "text":  # conversations: rendered with the chat template, loss mask and segment ids (docs/finetuning.md)
        from ms_llm.data.chat_preprocess import preprocess_conversations

        preprocess_conversations(args.input, args.output_dir, args.seq_length, args.tokenizer or "char", fmt, val,
                                 args.overwrite, workers=args.workers, skip_bad=args.skip_bad,
                                 shard_mb=args.shard_size_mb, pack=not args.no_pack, refuse_long=args.refuse_long,
                                 chat_template=args.chat_template)
        return
    if args.no_pack or args.refuse_long or args.chat_template:
        raise UserError("--no-pack, --refuse-long and --chat-template apply to --format chat or instruction only "
                        "(plain text is one continuous stream of tokens).")
    preprocess(args.input, args.output_dir, args.seq_length, args.tokenizer or "char", val, args.text_field or "text",
               overwrite=args.overwrite, workers=args.workers, skip_bad=args.skip_bad, shard_mb=args.shard_size_mb)


def cmd_sample(args):
    from ms_llm.train.generate import sample

    for text in sample(args.run_dir, args.prompt, args.max_new_tokens, args.temperature, args.top_k, args.seed,
                       args.num_samples, args.checkpoint, args.chat):
        print(text)
        print("-" * 40)


def cmd_benchmark(args):
    from ms_llm.config import load_config

    steps = args.steps if args.steps is not None else (3 if args.memory else 50)
    if steps <= 0 or args.warmup < 0:
        raise UserError(f"--steps = {steps} must be positive and --warmup = {args.warmup} non-negative.")
    overrides = ["monitor.summary=false", "monitor.progress_bar=false"] + args.overrides
    if args.memory:
        from ms_llm.benchmark_memory import main as memory

        return memory(args.config, overrides, steps, args.json)
    from ms_llm.benchmark import main as benchmark

    benchmark(load_config(args.config, overrides), steps, args.warmup, args.json, output=args.output,
              about={"config": args.config, "overrides": args.overrides})


def build_parser():
    parser = ArgumentParser(prog="ms-llm", description="Train, debug and tune LLMs with MindSpore.")
    sub = parser.add_subparsers(dest="command", metavar="command", parser_class=ArgumentParser)
    sub.required = True

    p = sub.add_parser("train", help="train a model (also: msrun ... train.py --config C)")
    add_train_args(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("preprocess", help="text/JSONL → tokenized, packed, sharded MindRecord + manifest")
    p.add_argument("--input", nargs="+", action="extend",
                   help="files, folders or globs: .txt (one document per file), .jsonl / .jsonl.gz (one per line)")
    p.add_argument("--output-dir", help="dataset folder to create")
    p.add_argument("--seq-length", type=int, help="model context length; samples hold seq_length + 1 tokens")
    p.add_argument("--tokenizer", help="char (default) | byte | path/to/tokenizer.json | path/to/tokenizer.model")
    p.add_argument("--val-fraction", type=float,
                   help="share kept for validation (default 0.1): of the documents, by a hash of their text; of the "
                        "tokens (the tail) for a single document")
    p.add_argument("--text-field", help="JSONL key holding the text (default: text)")
    p.add_argument("--workers", type=int, help="tokenizing processes (default: the number of CPU cores); the output "
                                               "is identical whatever the number")
    p.add_argument("--skip-bad", action="store_true",
                   help="count and skip invalid JSON lines / undecodable bytes instead of stopping at the first")
    p.add_argument("--shard-size-mb", type=int, default=256, help="MindRecord shard size in MB of samples (default 256)")
    p.add_argument("--format", choices=("text", "chat", "instruction", "preference"),
                   help="text (default): documents; chat: JSONL of {\"messages\": [{\"role\", \"content\"}, ...]}; "
                        "instruction: JSONL of {\"prompt\", \"response\"}; preference: JSONL of {\"prompt\" | "
                        "\"messages\", \"chosen\", \"rejected\"} (docs/preference.md). Conversations are rendered "
                        "with the tokenizer's chat template and get a loss mask (docs/finetuning.md)")
    p.add_argument("--no-pack", action="store_true", help="chat/instruction: one conversation per sample, padded "
                                                          "(default: several per sample, kept apart by the model)")
    p.add_argument("--refuse-long", action="store_true",
                   help="chat/instruction: stop at a conversation longer than a sample (default: cut it, counted)")
    p.add_argument("--chat-template", help="chat/instruction: a Jinja template file (default: the one beside the "
                                           "tokenizer.json, in tokenizer_config.json or chat_template.jinja)")
    add_config_arguments(p, required=False, help="take the defaults above from a training config's data/model "
                                                 "sections")
    p.add_argument("--overwrite", action="store_true", help="replace an existing dataset in --output-dir")
    p.set_defaults(func=cmd_preprocess)

    p = sub.add_parser("benchmark", help="tokens/s, ms/step, compile time, MFU, memory, data wait of the real step")
    add_config_arguments(p)
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 50; with --memory, steps per "
                                                           "measuring process, default 3)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps after compilation (default 5)")
    p.add_argument("--memory", action="store_true",
                   help="where the peak memory goes: runtime, weights, gradients, optimizer states, compiled graphs, "
                        "activations, logits and loss, the rest; measured in 2-3 fresh processes (difference runs) "
                        "and printed beside ms-llm plan's prediction")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.add_argument("--output", metavar="FILE", help="also write the result as JSON to FILE (e.g. RUN/benchmark.json: "
                                                    "ms-llm diagnose RUN compares the run's speed with it)")
    p.set_defaults(func=cmd_benchmark)


    # every other command is registered by the package it belongs to
    from ms_llm.data import cli as data_cli
    from ms_llm.debug import cli as debug_cli
    from ms_llm.diagnose import cli as diagnose_cli
    from ms_llm.diagnose import engine as diagnose_engine
    from ms_llm.eval import cli as eval_cli
    from ms_llm.interop import cli as interop_cli
    from ms_llm.parallel import cli as parallel_cli
    from ms_llm.report import cli as report_cli
    from ms_llm.rundir import cli as rundir_cli
    from ms_llm.tune import cli as tune_cli

    interop_cli.add_parsers(sub)
    parallel_cli.add_parsers(sub)
    diagnose_cli.add_parsers(sub)
    rundir_cli.add_parsers(sub)
    debug = debug_cli.add_parsers(sub)
    data_cli.add_parsers(sub)
    report_cli.add_parsers(sub, diagnose=diagnose_engine.findings)
    tune_cli.add_parsers(sub, debug)
    eval_cli.add_parsers(sub)

    p = sub.add_parser("sample", help="generate text from a trained run")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--prompt", default="\n")
    p.add_argument("--max-new-tokens", type=int, default=500)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-samples", type=int, default=1)
    p.add_argument("--checkpoint", help="a .ckpt file (default: the run's newest)")
    p.add_argument("--chat", action="store_true", help="the prompt is the user's message, rendered with the chat "
                                                       "template of the run's chat/instruction data; prints the reply")
    p.set_defaults(func=cmd_sample)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        code = args.func(args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        from ms_llm.train.setup.context import refusal_exit_code

        return refusal_exit_code(e)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
