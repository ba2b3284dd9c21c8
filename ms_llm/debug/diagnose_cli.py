"""The `diagnose` and `runs` subcommands; `add_parsers(subparsers)` registers them on ms_llm.cli's parser.

Exit codes: 0 = no findings (info notes allowed), 1 = findings (so `ms-llm diagnose` can gate CI),
2 = bad input (a UserError, printed by the caller as one paragraph).
"""
import json


def cmd_diagnose(args):
    from ms_llm.debug.diagnose import diagnose, exit_code, format_report

    run, findings = diagnose(args.run, args.device_memory, args.logs)
    code = exit_code(findings)
    print(format_report(args.run, run, findings), flush=True)
    if args.json:
        print(json.dumps({"run": args.run, "exit_code": code, "findings": [f.to_dict() for f in findings]},
                         default=str), flush=True)
    return code


def cmd_runs(args):
    from ms_llm.debug import runs

    if args.diff:
        d = runs.diff_runs(*args.diff)
        print(runs.format_diff(d), flush=True)
        if args.json:
            print(json.dumps({k: ([dict(zip(("key", "a", "b"), row)) for row in v] if isinstance(v, list) else v)
                              for k, v in d.items()}, default=str), flush=True)
        return 0
    rows = runs.list_runs(args.dir)
    print(runs.format_table(rows) if rows else f"no runs under '{args.dir}' (a run directory holds config.yaml "
                                                f"or run_info.json)", flush=True)
    if args.json:
        print(json.dumps({"dir": args.dir, "runs": rows}, default=str), flush=True)
    return 0


def add_parsers(subparsers):
    p = subparsers.add_parser("diagnose", help="symptoms in a run's metrics → likely causes → actions "
                                               "(exit 1 when something is found)")
    p.add_argument("run", metavar="RUN", help="a run directory (holds metrics.jsonl)")
    p.add_argument("--device-memory", metavar="SIZE",
                   help="per-device memory limit for the memory rule, e.g. 64GB (default: "
                        "context.max_device_memory; 0.9 x this machine's RAM for CPU runs)")
    p.add_argument("--logs", metavar="DIR", help="another folder of the run's logs, e.g. msrun's --log_dir (read "
                                                 "besides RUN/logs and RUN_logs)")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.set_defaults(func=cmd_diagnose)

    p = subparsers.add_parser("runs", help="list the runs under DIR, or --diff two runs")
    p.add_argument("dir", nargs="?", default="runs", metavar="DIR", help="folder holding run directories "
                                                                         "(default: runs)")
    p.add_argument("--diff", nargs=2, metavar=("A", "B"), help="config and environment differences of two runs")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.set_defaults(func=cmd_runs)
