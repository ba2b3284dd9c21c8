"""`ms-llm sweep` (registered by `add_parsers(sub)` from ms_llm/cli.py), `ms-llm debug lr-find` and
`ms-llm debug ladder` (registered under the debug tools by `add_lr_find_parser(dsub)` and `add_ladder_parser(dsub)`
from ms_llm/debug/cli.py)."""
import sys

from ms_llm.errors import UserError
from ms_llm.config.cli_args import add_config_arguments


def cmd_sweep(args):
    from ms_llm.tune.sweep import cluster
    from ms_llm.tune.sweep.space import build_spec
    from ms_llm.tune.sweep.run import default_sweep_dir, run_sweep

    if args.collect:
        if args.config or args.vary:
            raise UserError("--collect DIR reads the results of runs that already exist; it takes no --config or "
                            "--vary (the sweep's own sweep.json, or the configs of the runs, say what was varied).")
        return cluster.collect(args.collect, args.metric)
    if not args.config:
        raise UserError("sweep needs --config C and at least one --vary KEY=VALUES (or --collect DIR).")
    spec = build_spec(args.config, args.overrides, args.vary, args.strategy, args.steps, args.metric or "val_loss",
                      args.rounds, args.halving)
    sweep_dir = args.sweep_dir or default_sweep_dir(args.config)
    if args.print_commands:
        return cluster.print_commands(spec, sweep_dir, args.launcher, args.workers, args.remote_root)
    return run_sweep(spec, sweep_dir, args.parallel, argv=sys.argv[1:])


def cmd_lr_find(args):
    from ms_llm.tune.lr_find import lr_find

    lr_find(args.config, args.overrides, args.steps, args.start_lr, args.end_lr, args.output_dir)
    return 0


def cmd_ladder(args):
    from ms_llm.tune.ladder.run import ladder

    return ladder(args.config, args.steps, args.rtol, args.ladder_dir, args.print_commands)


def cmd_bisect(args):
    from ms_llm.tune.bisect import bisect

    bisect(args.good, args.bad, args.metric, args.steps, args.set_good, args.set_bad, args.output,
           echo=lambda line: print(line, flush=True), together=args.together)
    return 0


def add_bisect_parser(debug):
    p = debug.add_parser("bisect", help="which of the settings two runs (or configs) differ in explains the "
                                        "difference in a metric: short runs with halves of the difference applied, "
                                        "about log2(k) + 2 runs for k settings; bisect.json and a table")
    p.add_argument("good", metavar="GOOD", help="a run directory or a config file: the run with the good metric")
    p.add_argument("bad", metavar="BAD", help="a run directory or a config file: the run with the bad metric")
    p.add_argument("--metric", default="val_loss",
                   help="what the runs are compared on: val_loss (default; at the end of each run), loss (the last "
                        "training loss), tokens_per_s, grad_norm, mfu or mem_gib (medians over the records)")
    p.add_argument("--steps", type=int, help="optimizer steps of every run (default: BAD's train.max_steps)")
    p.add_argument("--set-good", action="append", default=[], metavar="KEY=VALUE",
                   help="override a value of GOOD (repeatable), e.g. the published value of a suspect setting")
    p.add_argument("--set-bad", action="append", default=[], metavar="KEY=VALUE", help="override a value of BAD")
    p.add_argument("--together", action="append", default=[], metavar="KEY1,KEY2",
                   help="keys that make a valid config only with each other (e.g. model.num_heads,model.num_kv_heads): "
                        "applied as one (repeatable)")
    p.add_argument("--output", metavar="DIR", help="where the runs and bisect.json go (default: BAD's run directory, "
                                                   "else runs/bisect-<time>); the same command again resumes")
    p.set_defaults(func=cmd_bisect)


def add_parsers(sub, debug):
    """`sweep`, and `lr-find`, `ladder` and `bisect` in the `debug` group (`debug`: its subparsers)."""
    add_lr_find_parser(debug)
    add_ladder_parser(debug)
    add_bisect_parser(debug)
    p = sub.add_parser("sweep", help="hyperparameter sweep: one-at-a-time from the golden config (or a grid), each "
                                     "trial an ordinary run; table, sweep.json, page, best config")
    add_config_arguments(p, required=False, help="the golden config (YAML); trials change only the --vary keys",
                         set_help="override a config value for every trial (part of the golden config)")
    p.add_argument("--vary", action="append", default=[], metavar="KEY=VALUES",
                   help="a key and its values (repeatable; one-at-a-time tunes them in this order): "
                        "train.lr=1e-4,3e-4,1e-3 | train.lr=log:1e-4..1e-2:5 | train.weight_decay=lin:0..0.2:3")
    p.add_argument("--strategy", default="one-at-a-time", choices=("one-at-a-time", "grid"),
                   help="one-at-a-time (default): one key at a time, the others at their best so far; grid: every "
                        "combination")
    p.add_argument("--steps", type=int, help="optimizer steps per trial (default: the config's train.max_steps)")
    p.add_argument("--metric", choices=("val_loss", "best_val_loss", "loss"),
                   help="what ranks the trials (lower is better): val_loss (default, at the end of the trial), "
                        "best_val_loss, or loss (the final training loss)")
    p.add_argument("--sweep-dir", help="where trials and results go (default: runs/sweep-<config>-<time>); run the "
                                       "same command with the same --sweep-dir to resume an interrupted sweep")
    p.add_argument("--rounds", type=int, default=3,
                   help="one-at-a-time: at most this many passes over the keys (it stops when a pass changes "
                        "nothing; default 3)")
    p.add_argument("--parallel", type=int, default=1, metavar="K",
                   help="run K trials at once, each pinned to 1/K of the cores (and, on Ascend/GPU, its own device)")
    p.add_argument("--halving", action="store_true",
                   help="successive halving: stop a trial clearly behind the others at 1/4 and 1/2 of its steps")
    p.add_argument("--print-commands", action="store_true",
                   help="print the trials' commands instead of running them (for msrun / ModelArts); run it again "
                        "after they finish for the next ones (one-at-a-time)")
    p.add_argument("--launcher", default="local", choices=("local", "msrun", "modelarts"),
                   help="with --print-commands: a local 'ms-llm train', an msrun line, or a ModelArts boot command")
    p.add_argument("--workers", type=int, default=8, help="with --launcher msrun: ranks per trial (default 8)")
    p.add_argument("--remote-root", metavar="obs://BUCKET/PATH",
                   help="with --launcher modelarts: each trial's --train_url is REMOTE_ROOT/<trial>")
    p.add_argument("--collect", metavar="DIR", help="build the table, sweep.json, page and best config from the run "
                                                    "directories under DIR, however they were run")
    p.set_defaults(func=cmd_sweep)


def add_lr_find_parser(dsub):
    q = dsub.add_parser("lr-find", help="LR range test: LR rising exponentially from 1e-7 to 1 from the initial "
                                        "weights; steepest descent, blow-up, suggested peak LR, loss-vs-LR page")
    add_config_arguments(q)
    q.add_argument("--steps", type=int, default=200, help="steps of the test (default 200)")
    q.add_argument("--start-lr", type=float, default=1e-7, help="first LR (default 1e-7)")
    q.add_argument("--end-lr", type=float, default=1.0, help="last LR (default 1)")
    q.add_argument("--output-dir", help="where the test writes (default: runs/lr_find-<config>-<time>); never a run's "
                                        "own directory")
    q.set_defaults(func=cmd_lr_find)


def add_ladder_parser(dsub):
    q = dsub.add_parser("ladder", help="plain first, then the target's optimisations one at a time: each rung an "
                                       "ordinary run, judged against the rung before (exact / within noise / PARTS)")
    q.add_argument("--config", required=True, help="the target config: the optimised setup to check")  # no --set: the
    # ladder's rungs are the config's own settings, one at a time
    q.add_argument("--steps", type=int, default=100, help="optimizer steps per rung (default 100), logged every step")
    q.add_argument("--rtol", type=float, default=0.0,
                   help="widen the noise tolerance to band(t) + RTOL x |loss| (default 0: the seed-to-seed band "
                        "alone)")
    q.add_argument("--ladder-dir", help="where the rungs go (default: runs/ladder-<config>); the same command with "
                                        "the same --ladder-dir resumes an interrupted ladder")
    q.add_argument("--print-commands", action="store_true",
                   help="print every rung's training command (msrun for multi-rank rungs) instead of running them")
    q.set_defaults(func=cmd_ladder)
