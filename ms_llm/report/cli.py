"""The `report` and `compare-curves` subcommands; `add_parsers(subparsers, diagnose)` registers them on ms_llm.cli's
parser.

Exit codes: report 0; compare-curves 0 = within tolerance, 1 = the curves part (a CI gate), 2 = bad input
(a UserError, printed by the caller as one paragraph).
"""
import json
import math
import os
import time

from ms_llm.errors import UserError


def cmd_report(args):
    from ms_llm.rundir.reader import log_format

    with log_format(args.format):
        return _report(args)


def _report(args):
    from ms_llm.report.report import write_report
    from ms_llm.rundir.reader import is_foreign_path

    t0 = time.perf_counter()
    path = write_report(args.runs, args.output, args.align, args.title,
                        diagnose=None if args.no_diagnose else args.diagnose)
    size = os.path.getsize(path)
    for run in args.runs:  # how each log was read, before the page's name
        if is_foreign_path(run):
            from ms_llm.rundir.foreign import describe
            from ms_llm.rundir.reader import load_run

            print(f"{run}: {describe(load_run(run))}", flush=True)
    print(f"report: {path} ({size / 1e6:.2f} MB, {time.perf_counter() - t0:.1f} s); open it in a browser, it "
          f"needs no network", flush=True)
    return 0


def _tolerance(name, value):
    if not math.isfinite(value) or value < 0:
        raise UserError(f"--{name} {value}: a tolerance must be a finite number >= 0, e.g. --{name} 0.02.")
    return value


def cmd_compare_curves(args):
    from ms_llm.rundir.reader import log_format

    with log_format(args.format):
        return _compare_curves(args)


def _compare_curves(args):
    from ms_llm.rundir import curves

    rtol, atol = _tolerance("rtol", args.rtol), _tolerance("atol", args.atol)
    if args.save_golden and args.align != "step":
        raise UserError("--save-golden writes a step → value curve: use it with --align step (the default).")
    a = curves.load_curve(args.a, args.metric, args.align)
    if args.save_golden:
        curves.save_golden(a, args.a, args.save_golden)
        print(f"saved the golden {args.metric} curve of {args.a} ({len(a.values)} points) to {args.save_golden}; "
              f"gate a run on it with 'ms-llm compare-curves RUN {args.save_golden}'", flush=True)
        if args.b is None:
            return 0
    if args.b is None:
        raise UserError("compare-curves needs two curves: A B (run directories or a golden JSON), or A with "
                        "--save-golden FILE to write A's curve as a golden.")
    c = curves.compare(a, curves.load_curve(args.b, args.metric, args.align), rtol, atol)
    print(curves.format_comparison(c), flush=True)
    if args.json:
        print(json.dumps(curves.to_dict(c)), flush=True)
    if c.parted:
        return 1
    return 0


def add_parsers(subparsers, diagnose=None):
    """`diagnose`: run dir → its findings, for the report's diagnosis section (handed in by ms_llm/cli.py)."""
    from ms_llm.rundir.curves import DEFAULT_ATOL, DEFAULT_RTOL
    from ms_llm.rundir.foreign.detect import FORMATS

    log_help = "the reader for a log (default: auto, detected and named in the first line)"

    p = subparsers.add_parser("report", help="one self-contained HTML page of a run's curves, events, diagnosis, "
                                             "profile and config; several runs are overlaid")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories (the --run-dir of 'ms-llm train'), or "
                                                          "other frameworks' training logs / folders of worker logs")
    p.add_argument("--format", choices=FORMATS, default="auto", help=log_help)
    p.add_argument("--output", "-o", metavar="FILE.html",
                   help="where to write (default: RUN/report.html for one run, ./report.html for several)")
    p.add_argument("--align", choices=("step", "tokens"), default="step",
                   help="x axis of the curves: step (default) or tokens (step × global batch × sequence length)")
    p.add_argument("--title", help="page title (default: the run names)")
    p.add_argument("--no-diagnose", action="store_true", help="leave out ms-llm diagnose's findings")
    p.set_defaults(func=cmd_report, diagnose=diagnose)

    p = subparsers.add_parser("compare-curves", help="largest difference and first parting step of two runs' "
                                                     "curves (exit 1 when they part: a regression gate)")
    p.add_argument("a", metavar="A", help="run directory, golden JSON, or another framework's training log or "
                                           "folder of worker logs")
    p.add_argument("b", metavar="B", nargs="?", help="the same kinds: the reference")
    p.add_argument("--format", choices=FORMATS, default="auto", help=log_help)
    p.add_argument("--align", choices=("step", "tokens"), default="step",
                   help="compare at the same step (default) or the same tokens consumed (step x global batch x "
                        "sequence length, or the tokens a log counts); B is interpolated where they do not meet")
    p.add_argument("--metric", default="loss", help="metrics.jsonl field to compare (default: loss; val_loss for "
                                                    "the evaluations; TASK/acc for an lm-eval task evaluated during "
                                                    "training)")
    p.add_argument("--rtol", type=float, default=DEFAULT_RTOL,
                   help=f"relative tolerance against B (default {DEFAULT_RTOL:g})")
    p.add_argument("--atol", type=float, default=DEFAULT_ATOL,
                   help=f"absolute tolerance (default {DEFAULT_ATOL:g}); a step parts when |A-B| > atol + rtol*|B|")
    p.add_argument("--save-golden", metavar="FILE", help="write A's curve (step → value) to FILE as a golden")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.set_defaults(func=cmd_compare_curves)
