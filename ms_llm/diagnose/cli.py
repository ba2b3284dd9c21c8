"""The `diagnose` subcommand; `add_parsers(subparsers)` registers it on ms_llm.cli's parser.

Exit codes: 0 = no findings (info notes allowed), 1 = findings (so `ms-llm diagnose` can gate CI),
2 = bad input (a UserError, printed by the caller as one paragraph).
"""
import json

from ms_llm.rundir.foreign.detect import FORMATS


def cmd_diagnose(args):
    from ms_llm.rundir.reader import log_format

    with log_format(args.format):
        return _diagnose(args)


def _diagnose(args):
    from ms_llm.diagnose.engine import diagnose, exit_code, format_report
    from ms_llm.rundir.foreign import describe
    from ms_llm.rundir.foreign.needs import lines as lacking_lines

    if args.measure:
        from ms_llm.diagnose.measure import measure
        from ms_llm.rundir.reader import load_run

        if args.measure_steps is not None and args.measure_steps < 5:
            from ms_llm.errors import UserError

            raise UserError(f"--measure-steps = {args.measure_steps}: each benchmark needs at least 5 timed steps "
                            f"(default: about 2 s of the run's steps).")
        measure(load_run(args.run), echo=lambda line: print(line, flush=True), steps=args.measure_steps)
    run, findings = diagnose(args.run, args.device_memory, args.logs, args.benchmark)
    code = exit_code(findings)
    if run.foreign:
        print(describe(run), flush=True)
    print(format_report(args.run, run, findings), flush=True)
    if run.foreign and run.lacks:  # each once: the rules that had nothing to read
        print("\nnot judged, for want of what this log does not print:\n" + "\n".join(
            f"  - {line}" for line in lacking_lines(run)), flush=True)
    if args.json:
        print(json.dumps({"run": args.run, "exit_code": code, "findings": [f.to_dict() for f in findings]},
                         default=str), flush=True)
    return code


def add_parsers(subparsers):
    p = subparsers.add_parser("diagnose", help="symptoms in a run's metrics → likely causes → actions "
                                               "(exit 1 when something is found)")
    p.add_argument("run", metavar="RUN", help="a run directory (holds metrics.jsonl), or another framework's "
                                               "training log or folder of worker logs (Megatron-LM, MindSpeed-LLM, "
                                               "MindFormers, torchtitan)")
    p.add_argument("--format", choices=FORMATS, default="auto",
                   help="the reader for a log (default: auto, detected and named in the first line)")
    p.add_argument("--device-memory", metavar="SIZE",
                   help="per-device memory limit for the memory rule, e.g. 64GB (default: "
                        "context.max_device_memory; 0.9 x this machine's RAM for CPU runs)")
    p.add_argument("--logs", metavar="DIR", help="another folder of the run's logs, e.g. msrun's --log_dir (read "
                                                 "besides RUN/logs and RUN_logs)")
    p.add_argument("--benchmark", metavar="FILE", help="an 'ms-llm benchmark --output FILE' result of the run's "
                                                       "config on this machine, to compare the run's speed with "
                                                       "(default: RUN/benchmark.json when present)")
    p.add_argument("--measure", action="store_true",
                   help="first measure the run's step under other settings of the same computation (micro-batch "
                        "vs accumulation, threads, CPU kernels, monitors, readers; a short benchmark each, in "
                        "RUN/measure.json) and name the faster one")
    p.add_argument("--measure-steps", type=int, metavar="N", help="timed steps of each --measure benchmark "
                                                                     "(default: about 2 s of the run's steps)")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.set_defaults(func=cmd_diagnose)
