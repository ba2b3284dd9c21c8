"""The `runs` subcommand (list the run directories under a folder, or diff two); `add_parsers(subparsers)`
registers it on ms_llm.cli's parser."""
import json


def cmd_runs(args):
    from ms_llm.rundir import reader

    if args.diff:
        d = reader.diff_runs(*args.diff)
        print(reader.format_diff(d), flush=True)
        if args.json:
            print(json.dumps({k: ([dict(zip(("key", "a", "b"), row)) for row in v] if isinstance(v, list) else v)
                              for k, v in d.items()}, default=str), flush=True)
        return 0
    rows = reader.list_runs(args.dir)
    print(reader.format_table(rows) if rows else f"no runs under '{args.dir}' (a run directory holds config.yaml "
                                                f"or run_info.json)", flush=True)
    if args.json:
        print(json.dumps({"dir": args.dir, "runs": rows}, default=str), flush=True)
    return 0


def add_parsers(subparsers):
    p = subparsers.add_parser("runs", help="list the runs under DIR, or --diff two runs")
    p.add_argument("dir", nargs="?", default="runs", metavar="DIR", help="folder holding run directories "
                                                                         "(default: runs)")
    p.add_argument("--diff", nargs=2, metavar=("A", "B"), help="config and environment differences of two runs")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.set_defaults(func=cmd_runs)
