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
        bisect_suspects(args.run)
    elif not args.no_measure:
        measure_cost_suspects(args.run)
        bisect_suspects(args.run, budget_s=BISECT_BUDGET_S)
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


def measure_cost_suspects(path):
    """Plain `diagnose` measures what it can cheaply: a setting far from every published value that may cost speed
    (a head width of 1, pynative mode) is timed beside the run's own settings, when this is the run's host and the
    run's step is short enough that the measurement takes about a minute (MEASURE_BUDGET_S)."""
    from ms_llm.diagnose.measure import measure, on_run_host, suspect_variants, unmeasured
    from ms_llm.errors import UserError
    from ms_llm.rundir.names import run_config_path
    from ms_llm.rundir.reader import load_run

    try:
        run = load_run(path)
    except UserError:
        return  # the diagnosis itself says what is wrong with the run directory
    import os

    wanted = unmeasured(run, suspect_variants(run))
    if not wanted or not on_run_host(run) or not os.path.isfile(run_config_path(run.path)):
        return
    # each setting twice (startup and ~2 s of steps), each new setting's graph compiled once (the run's own is cached)
    compile_s = (run.info.get("final") or {}).get("compile_s") or 10.0
    if 2 * (1 + len(wanted)) * (BENCH_STARTUP_S + 2.0) + len(wanted) * compile_s > MEASURE_BUDGET_S:
        return  # the finding gives the command instead (ms-llm diagnose RUN --measure)
    print(f"diagnose: {len(wanted)} setting(s) far from every published value may cost speed; measuring them "
          f"beside the run's own (--no-measure to skip)", flush=True)
    measure(run, echo=lambda line: print(line, flush=True), chosen=wanted)


MEASURE_BUDGET_S = 120.0
BENCH_STARTUP_S = 6.0    # a benchmark process: import, dataset, a cached graph
BISECT_MAX_STEPS = 2000  # the bisect's runs train at most this many steps (a long run is bisected on its start)
BISECT_BUDGET_S = 90.0   # plain diagnose proves a strong suspect itself when one run of it takes about this long


def bisect_suspects(path, budget_s=None):
    """The settings far from every published value that may slow or destabilise training, proven or cleared by
    experiment: `ms-llm debug bisect` (a process of its own: diagnose does not import the tuning tools) between the
    run and the run with those settings at their published values; RUN/bisect.json is read by the diagnosis that
    follows (rules/bisected.py). `diagnose --measure` bisects every such suspect; plain diagnose (`budget_s`) only
    of a finished run on this host whose own training took at
    most `budget_s` (one more run of it proves them), and never twice."""
    import os
    import subprocess
    import sys

    from ms_llm.diagnose.measure import on_run_host
    from ms_llm.diagnose.rules.bisected import load_bisect
    from ms_llm.diagnose.rules.schedule import suspects
    from ms_llm.diagnose.rules.suspect import COST
    from ms_llm.errors import UserError
    from ms_llm.rundir.names import run_config_path
    from ms_llm.rundir.reader import load_run
    from ms_llm.rundir.walltime import account

    try:
        run = load_run(path)
    except UserError:
        return  # the diagnosis itself says what is wrong with the run directory
    chosen = [s for s in suspects(run) if s.sets and set(s.effects) - {COST}]
    finished = run.status == "finished"
    if budget_s is not None:
        wall = (account(run) or {}).get("wall_s")
        if (not chosen or load_bisect(run) or not finished or not on_run_host(run) or wall is None or wall > budget_s
                or not os.path.isfile(run_config_path(run.path))):
            return
        print(f"diagnose: {len(chosen)} setting(s) far from every published value; proving them with a run of the "
              f"published value{'s' if len(chosen) > 1 else ''} (about {wall:.0f} s, as long as the run itself; "
              f"--no-measure to skip)", flush=True)
    if not chosen:
        print("diagnose: no setting far from the published values to bisect", flush=True)
        return
    steps = min(BISECT_MAX_STEPS, run.max_steps if finished else run.steps_done or run.max_steps)
    cmd = [sys.executable, "-m", "ms_llm.cli", "debug", "bisect", run_config_path(run.path), run.path,
           "--steps", str(steps), "--output", run.path] + [x for s in chosen for v in s.sets for x in ("--set-good", v)]
    cmd += [x for s in chosen if len(s.sets) > 1 for x in ("--together", ",".join(v.split("=")[0] for v in s.sets))]
    print(f"diagnose: bisecting {len(chosen)} suspect setting(s) against their published values: "
          + " ".join(cmd[2:]), flush=True)
    code = subprocess.call(cmd, env=dict(os.environ, GLOG_v=os.environ.get("GLOG_v", "3")))
    if code != 0:
        print(f"diagnose: the bisect stopped (exit {code}); the diagnosis below is without it", flush=True)


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
    p.add_argument("--no-measure", action="store_true",
                   help="never measure (by default a setting far from every published value that may cost speed is "
                        "timed beside the run's own settings when that takes about a minute on this host)")
    p.add_argument("--measure-steps", type=int, metavar="N", help="timed steps of each --measure benchmark "
                                                                     "(default: about 2 s of the run's steps)")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.set_defaults(func=cmd_diagnose)
