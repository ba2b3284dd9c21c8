"""`ms-llm debug ladder --config TARGET.yaml`: get the target's model training plain first, then add its
optimisations one at a time, each rung checked against the rung before by its curves.

The rungs are derived in ms_llm/tune/ladder/plan.py (plain config, options, order) and judged in
verdict.py (the seed-to-seed band; exact / within noise / PARTS). The ladder directory holds

    ladder.json         the target, every rung (option added, status, verdict, speed, memory), the band
    ladder.html         every rung's curves overlaid, the differences to the rung before, the table
    configs/<rung>.yaml each rung's whole config (what `ms-llm train --config` trains)
    rungs/<rung>/       one ordinary run directory per rung (runs / report / diagnose / compare-curves work on it)
    logs/<rung>.log     each rung's console output (and <rung>-msrun/ for a multi-rank rung)
    interrupted/        attempts that stopped before their first checkpoint (kept, not deleted)

Running the same command again resumes: finished rungs are not rerun, an interrupted one continues from its
checkpoint, a failed one is tried again. The ladder directory is tied to its target: another config (or the same
one edited, or another --steps) is refused.
"""
import hashlib
import json
import math
import os
import shlex
import shutil
import statistics

import yaml

from ms_llm.errors import UserError
from ms_llm.tune import folder_lock
from ms_llm.tune.ladder import output as out
from ms_llm.tune.sweep import trial as tr
from ms_llm.tune.ladder.launch import Interrupted, Launcher, clock, move_aside
from ms_llm.tune.ladder.plan import Machine, missing_hardware, plan_rungs, seed_rung, train_command, world_size
from ms_llm.tune.ladder.verdict import TREND, Curves, judge, seed_band, skipped_note
from ms_llm.rundir import names

LOCK = "ladder.lock"
MIN_STEPS = 5  # a verdict on fewer log records says little; the band needs a few steps to open


def default_ladder_dir(config):
    return os.path.join("runs", f"ladder-{os.path.splitext(os.path.basename(config))[0]}")


def plan(config, steps):
    """(target as nested sections, rungs, seed rung, notes) of the target config; bad input is a UserError."""
    from ms_llm.config import load_config, to_dict

    target = to_dict(load_config(config))
    rungs, notes = plan_rungs(target, steps)
    if len(rungs) == 1:
        raise UserError(f"the target config '{config}' is already the plain rung: float32 compute, no loss scaling, "
                        f"no fused CPU kernels (context.cpu_kernels: false), no recompute, no compile cache, one "
                        f"data-parallel rank and no tensor or pipeline parallelism, no optimizer sharding, synchronous "
                        f"checkpoints. There is no optimisation to add one at a time. Train it with 'ms-llm train', or "
                        f"point --config at the optimised config you want to check.")
    seed = seed_rung(rungs[0])
    for r in [rungs[0], seed] + rungs[1:]:
        check_rung(r)
    return target, rungs, seed, notes


def check_rung(rung):
    """Every rung must be a config the trainer accepts (an intermediate combination included)."""
    from ms_llm.config import config_from_dict
    from ms_llm.parallel.layout import build_plan

    try:
        cfg = config_from_dict(rung.config)
        build_plan(cfg, world_size(rung.flat))
    except UserError as e:
        raise UserError(f"rung {rung.index} ({rung.name}, adding {rung.label()}) is not a config the trainer "
                        f"accepts: {e} The ladder adds one option at a time; an option that is only valid together "
                        f"with another belongs in one rung with it (ms_llm/tune/ladder/plan.py, OPTIONS).") from None


def identity(config, target, rungs, seed, steps):
    def sha(obj):
        return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()

    return {"config": os.path.abspath(config), "target_sha256": sha(target),
            "plan_sha256": sha([r.config for r in [seed] + rungs]), "steps": steps}


def open_ladder_dir(ladder_dir, ident, echo):
    """Create the ladder directory, or check that it holds this same ladder (then it resumes)."""
    path = os.path.join(ladder_dir, "ladder.json")
    if os.path.isfile(path):
        doc = out.read_doc(path)
        if doc is None:
            raise UserError(f"--ladder-dir {ladder_dir}: its ladder.json is unreadable or not an ms_llm ladder. Nothing "
                            f"was changed; choose another --ladder-dir.")
        old = doc.get("identity") or {}
        if old.get("target_sha256") != ident["target_sha256"]:
            raise UserError(f"--ladder-dir {ladder_dir} holds the ladder of another target ({old.get('config')}, "
                            f"resolved config sha256 {str(old.get('target_sha256'))[:12]}; now {ident['config']}, "
                            f"{ident['target_sha256'][:12]}; a config edited since counts as another). Its finished "
                            f"rungs are kept; choose a new --ladder-dir for this target.")
        if old.get("steps") != ident["steps"]:
            raise UserError(f"--ladder-dir {ladder_dir} was run with --steps {old.get('steps')}, now --steps "
                            f"{ident['steps']}: rungs of different lengths cannot be compared. Run it with --steps "
                            f"{old.get('steps')} to resume, or choose a new --ladder-dir.")
        if old.get("plan_sha256") != ident["plan_sha256"]:
            raise UserError(f"--ladder-dir {ladder_dir} holds this target's ladder, but its rungs were derived "
                            f"differently (another version of ms_llm's plain config or option table). Its finished "
                            f"rungs are kept; choose a new --ladder-dir to ladder it again.")
        done = sum(1 for r in doc.get("rungs") or [] if r.get("status") in ("finished", "halted"))
        echo(f"resuming the ladder in {ladder_dir}: {done} rung(s) already trained are not run again")
        return doc
    if os.path.isdir(ladder_dir) and os.listdir(ladder_dir):
        raise UserError(f"--ladder-dir {ladder_dir} exists and is not a ladder directory (no ladder.json). Nothing was "
                        f"changed; choose a new or empty folder.")
    os.makedirs(ladder_dir, exist_ok=True)
    return None


def this_machine():
    from ms_llm.config.schema import ContextConfig
    from ms_llm.train.setup.context import device_target

    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return Machine(device_target(ContextConfig()), cores, shutil.which("msrun") is not None)


def records(rungs, seed, ladder_dir, machine):
    """The ladder.json record of every rung, in the order they run: plain, the seed rung, then the options."""
    recs = []
    for r in [rungs[0], seed] + rungs[1:]:
        config_path = os.path.join(ladder_dir, "configs", f"{r.dir_name}.yaml")
        run_dir = os.path.join(ladder_dir, "rungs", r.dir_name)
        ranks = world_size(r.flat)
        recs.append({"index": r.index, "name": r.name, "dir": r.dir_name, "run_dir": run_dir,
                     "config_path": config_path, "option": r.option, "keys": list(r.keys),
                     "added": {k: list(v) for k, v in r.added.items()}, "label": r.label(), "expect": r.expect,
                     "why": r.why, "unknown": r.unknown, "ranks": ranks, "status": "pending",
                     "reason": missing_hardware(r.flat, machine), "error": None, "log": None,
                     "batch": batch_split(r.flat), "seed": r.flat["train.seed"],
                     "cluster_command": shlex.join(train_command(
                         config_path, run_dir, ranks, local=False,
                         log_dir=os.path.join(ladder_dir, "logs", f"{r.dir_name}-msrun"))),
                     "wall_s": None, "tokens_per_s": None, "peak_mem_gib": None, "speedup": None, "verdict": None,
                     "skipped_note": "", "localise": None})
    return recs


def batch_split(flat):
    """How the rung carries the global batch: micro batch x accumulation x data-parallel ranks."""
    dp = flat.get("parallel_config.data_parallel") or 1
    micro, glob = flat["train.micro_batch_size"], flat["train.global_batch_size"]
    return f"global {glob} = micro {micro} x accumulation {glob // (micro * dp)} x data-parallel {dp}"


def write_configs(rungs, seed, ladder_dir):
    os.makedirs(os.path.join(ladder_dir, "configs"), exist_ok=True)
    for r in [rungs[0], seed] + rungs[1:]:
        head = (f"# ladder rung {r.index if r.index >= 0 else 'seed'}: {r.name}"
                + (f" (adds {r.label()}; expected: {r.expect})" if r.added and r.index > 0 else f" ({r.label()})")
                + "\n# written by ms-llm debug ladder; train it with ms-llm train --config THIS_FILE\n")
        text = head + yaml.safe_dump(r.config, sort_keys=False, default_flow_style=False)
        path = os.path.join(ladder_dir, "configs", f"{r.dir_name}.yaml")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)


def document(ident, state, recs, notes, rtol, band):
    return {"format": out.FORMAT, "identity": ident, "state": state, "rtol": rtol, "notes": notes, "band": band,
            "rungs": recs, "order": "plain, the seed rung (noise band), then one option per rung (docs/ladder.md)"}


def say(msg):
    print(msg, flush=True)  # progress lines reach a log file (nohup, CI) as they are written


def ladder(config, steps=100, rtol=0.0, ladder_dir=None, print_commands=False, echo=say, launcher_cls=Launcher):
    """Plan, run (or resume) and judge the ladder of `config`. Returns the exit code: 0 every rung exact or within
    noise, 1 a rung parts or failed to train, 130 interrupted (run the same command to resume)."""
    if steps < MIN_STEPS:
        raise UserError(f"--steps {steps}: a rung needs at least {MIN_STEPS} steps for its curves to say anything "
                        f"(default 100).")
    if not (rtol >= 0 and rtol != float("inf")):
        raise UserError(f"--rtol {rtol}: a tolerance must be a finite number >= 0 (default 0: the seed-to-seed band "
                        f"alone decides).")
    target, rungs, seed, notes = plan(config, steps)
    ladder_dir = ladder_dir or default_ladder_dir(config)
    ident = identity(config, target, rungs, seed, steps)
    previous = open_ladder_dir(ladder_dir, ident, echo)
    write_configs(rungs, seed, ladder_dir)
    recs = records(rungs, seed, ladder_dir, this_machine())
    before = {r.get("dir"): r for r in (previous or {}).get("rungs") or []}
    for r in recs:  # a rung trained by an earlier invocation keeps its wall time and log
        r.update({k: before.get(r["dir"], {}).get(k) for k in ("wall_s", "log")})
    doc_path = os.path.join(ladder_dir, "ladder.json")
    for n in notes:
        echo(f"note: {n}")
    if print_commands:
        if previous is None:  # a record of the plan; an existing ladder.json keeps its results
            out.write_doc(doc_path, document(ident, "planned", recs, notes, rtol, None))
        return print_all(recs, config, ladder_dir, steps, echo)
    with folder_lock.held(ladder_dir, LOCK, "--ladder-dir", "its rung saves a checkpoint"):
        return run_all(recs, ident, notes, rtol, ladder_dir, doc_path, config, echo, launcher_cls)


def print_all(recs, config, ladder_dir, steps, echo):
    echo(f"# the ladder of {config}: {len(recs) - 2} option rung(s) after plain and its seed rung; each command "
         f"trains one rung into {os.path.join(ladder_dir, 'rungs')}")
    for r in recs:
        what = ("plain" if r["index"] == 0 else "the noise band" if r["index"] < 0 else
                f"adds {r['label']}; expected: {r['expect']}")
        state = rung_state(r["run_dir"], steps)
        if state in ("finished", "halted"):
            echo(f"# {r['dir']}: {what}: trained already")
            continue
        echo(f"# {r['dir']}: {what}" + (f" (not on this machine: {r['reason']})" if r["reason"] else ""))
        echo(r["cluster_command"] + (" --resume" if state == "resumable" else ""))
    echo(f"# when they are done (run directories under {os.path.join(ladder_dir, 'rungs')}), judge them here: "
         f"ms-llm debug ladder --config {shlex.quote(config)} --steps {steps} --ladder-dir {shlex.quote(ladder_dir)} "
         f"(finished rungs are not rerun)")
    return 0


def run_all(recs, ident, notes, rtol, ladder_dir, doc_path, config, echo, launcher_cls):
    runnable = [r for r in recs if not r["reason"]]
    echo(f"ladder of {config}: {len(recs) - 2} option rung(s) after plain and its seed rung, {recs[0]['ranks']} "
         f"rank(s) plain; {len(runnable)} of {len(recs)} runnable here; directory {ladder_dir}")
    walls = []

    def eta(rung_left, elapsed, after):
        if not walls:
            return None
        per = statistics.mean(walls)
        now = rung_left if rung_left is not None else max(0.0, per - elapsed)
        return now + per * after

    state = "done"
    with launcher_cls(os.path.join(ladder_dir, "logs"), echo) as launcher:
        for k, rec in enumerate(recs):
            after = sum(1 for r in recs[k + 1:] if not r["reason"])
            try:
                ran = run_one(rec, k, len(recs), launcher, ladder_dir, lambda left, el: eta(left, el, after), echo,
                              ident["steps"])
            except Interrupted:
                rec["status"] = "interrupted"
                state = "interrupted"
                break
            if ran is not None:
                walls.append(ran)
            judge_all(recs, rtol, ladder_dir)
            report_rung(rec, echo)
            rest = eta(0.0, 0.0, after)
            if rest and after:
                echo(f"  ladder: {k + 1}/{len(recs)} rungs through, ETA ~{clock(rest)} for {after} more")
            out.write_doc(doc_path, document(ident, "running", recs, notes, rtol, band_summary(recs)))
    judge_all(recs, rtol, ladder_dir)
    doc = document(ident, state, recs, notes, rtol, band_summary(recs))
    out.write_doc(doc_path, doc)
    if state == "interrupted":
        echo(f"ladder interrupted; finished rungs are kept and the running one saved a checkpoint. Resume with:\n"
             f"  ms-llm debug ladder --config {shlex.quote(config)} --steps {ident['steps']} --ladder-dir "
             f"{shlex.quote(ladder_dir)}")
        return 130
    page = None
    try:
        from ms_llm.tune.page import write_ladder_page

        page = write_ladder_page(doc, os.path.join(ladder_dir, "ladder.html"))
    except Exception as e:  # noqa: BLE001 (the page is a view of ladder.json, written already: keep the table)
        echo(f"warning: ladder.html not written ({type(e).__name__}: {e}); ladder.json holds every result")
    echo("")
    echo(out.format_table(recs))
    for line in out.summary_lines(doc):
        echo(line)
    echo(f"ladder.json: {doc_path}" + (f"; page: {page}" if page else ""))
    bad = [r for r in recs if r["status"] in ("failed", "halted") or (r.get("verdict") or {}).get("verdict") == "PARTS"]
    return 1 if bad else 0


def run_one(rec, k, total, launcher, ladder_dir, eta, echo, steps):
    """Train one rung unless it is done or needs other hardware; returns its wall time when it ran, else None."""
    head = f"ladder [{k + 1}/{total}] {rec['dir']}"
    what = ("plain" if rec["index"] == 0 else "plain at train.seed + 1: the noise band" if rec["index"] < 0
            else f"adds {rec['label']} (expected: {rec['expect']})")
    if rec["reason"]:
        rec["status"] = "skipped"
        echo(f"{head}: {what}: skipped: {rec['reason']}. On the cluster: {rec['cluster_command']}")
        return None
    st = rung_state(rec["run_dir"], steps)
    if st in ("finished", "halted"):
        rec["status"] = st
        echo(f"{head}: {what}: {'trained' if st == 'finished' else 'halted'} earlier, not run again")
        return None
    if st == "partial":
        move_aside(rec["run_dir"], os.path.join(ladder_dir, "interrupted"), echo)
    resume = st == "resumable"
    echo(f"{head}: {what}: {'resuming from its checkpoint' if resume else 'training'} {steps} steps, "
         f"{rec['batch']}" + (f", {rec['ranks']} msrun ranks" if rec["ranks"] > 1 else "")
         + f" (log logs/{rec['dir']}.log)")
    code, wall, log, error = launcher.run(rec["dir"], rec["config_path"], rec["run_dir"], rec["ranks"], resume, steps,
                                          eta)
    rec.update(wall_s=round(wall, 1), log=log, status=rung_state(rec["run_dir"], steps))
    if rec["status"] == "finished":
        rec["error"] = None
    elif rec["status"] == "halted":
        rec["error"] = error
    else:
        rec.update(status="failed", error=error or f"exit code {code}")
    return wall


def rung_state(run_dir, steps):
    """new | finished | halted (the trainer stopped it: every update skipped) | resumable | partial."""
    from ms_llm.checkpoint import store
    from ms_llm.rundir.reader import read_json

    if not os.path.isdir(run_dir) or not os.listdir(run_dir):
        return "new"
    final = read_json(os.path.join(run_dir, names.RUN_INFO)).get("final") or {}
    if (final.get("steps") or 0) >= steps:
        return "finished"
    if tr.halted(run_dir):
        return "halted"
    return "resumable" if store.list_checkpoints(store.rank_dir(run_dir, 0)) else "partial"


def report_rung(rec, echo):
    v = rec.get("verdict") or {}
    took = f" in {clock(rec['wall_s'])}" if rec.get("wall_s") else ""
    if rec["status"] == "failed":
        echo(f"  FAILED{took}: {rec['error']} (log {rec['log']}); the ladder goes on")
    elif rec["status"] == "halted":
        echo(f"  halted by the trainer{took}: {rec.get('error') or 'every update was skipped'}")
    if rec["status"] in ("finished", "halted"):
        speed = f"{rec['tokens_per_s']:,.0f} tokens/s" if rec.get("tokens_per_s") else "tokens/s n/a"
        if rec.get("speedup"):
            speed += f" (x{rec['speedup']:.2f} the rung before)"
        if rec["index"] <= 0:
            echo(f"  trained{took}: {speed}")
        elif v:
            echo(f"  {v['verdict']}{took}: {v.get('reason')}; {speed}")


# --- judging, from the run directories (the same whether the rungs ran now, earlier, or on a cluster) ----------

def rung_curves(rec):
    from ms_llm.rundir.reader import read_jsonl

    if rec["status"] not in ("finished", "halted"):
        return None
    records, _ = read_jsonl(os.path.join(rec["run_dir"], names.METRICS))
    c = Curves.from_records(records)
    return c if c.loss else None


def rung_stats(rec):
    """(tokens/s, peak memory GiB): the median of the per-step tokens/s without the first record (it includes
    warm-up), as `ms-llm runs` reports it, and the trainer's peak memory of rank 0."""
    from ms_llm.rundir.reader import read_json, read_jsonl

    records, _ = read_jsonl(os.path.join(rec["run_dir"], names.METRICS))
    tok = [r["tokens_per_s"] for r in records if "loss" in r and isinstance(r.get("tokens_per_s"), (int, float))
           and math.isfinite(r["tokens_per_s"])]
    final = read_json(os.path.join(rec["run_dir"], names.RUN_INFO)).get("final") or {}
    return (statistics.median(tok[1:] or tok) if tok else None), final.get("peak_mem_gib")


def judge_all(recs, rtol, ladder_dir):
    """Verdicts, speed-ups and localisation commands of every rung that can be judged now."""
    plain, seed = recs[0], recs[1]
    cp, cs = rung_curves(plain), rung_curves(seed)
    band = seed_band(cp.loss, cs.loss) if cp and cs else None
    chain = [plain] + recs[2:]
    curves = [rung_curves(r) for r in chain]
    for rec in recs:
        if rec["status"] in ("finished", "halted") and rec["tokens_per_s"] is None and os.path.isdir(rec["run_dir"]):
            rec["tokens_per_s"], rec["peak_mem_gib"] = rung_stats(rec)
    for i in range(1, len(chain)):
        rec, before = chain[i], chain[i - 1]
        if curves[i] is None:
            rec["verdict"] = None
            continue
        if curves[i - 1] is None:
            rec["verdict"] = {"verdict": "unverified", "reason": f"the rung before ({before['name']}) is "
                                                                  f"{before['status']}: nothing to compare with"}
            continue
        v = judge(curves[i - 1], curves[i], rec["expect"], band, rtol)
        rec["verdict"] = v.to_dict()
        rec["skipped_note"] = skipped_note(v) if v.parts else ""
        if before.get("tokens_per_s") and rec.get("tokens_per_s"):
            rec["speedup"] = rec["tokens_per_s"] / before["tokens_per_s"]
        rec["localise"] = (out.localisation(before, rec, v.first_part or v.first_diff,
                                            os.path.join(ladder_dir, "localise", rec["dir"])) if v.parts else None)
    return band


def band_summary(recs):
    """The band as ladder.json keeps it: its definition, both envelopes at every step, and three readings."""
    cp, cs = rung_curves(recs[0]), rung_curves(recs[1])
    band = seed_band(cp.loss, cs.loss) if cp and cs else None
    if not band:
        return None
    steps = sorted(band.step)
    mid = steps[len(steps) // 2]
    seeds = [recs[0]["seed"], recs[1]["seed"]]
    fin = lambda v: v if math.isfinite(v) else None  # noqa: E731 (JSON has no inf)
    return {"definition": f"with g = loss at seed {seeds[0]} - loss at seed {seeds[1]} (plain config): per-step "
                          f"band(t) = max over s <= t of |g(s)|; trend band(t) = max over s <= t of |mean of g over "
                          f"the {TREND} logged steps up to s|",
            "seeds": seeds, "trend_steps": TREND, "mid": mid, "last": steps[-1],
            "at_first": fin(band.step[steps[0]]), "at_mid": fin(band.step[mid]), "final": fin(band.step[steps[-1]]),
            "trend_at_mid": fin(band.trend[mid]), "trend_final": fin(band.trend[steps[-1]]),
            "steps": steps, "values": [fin(band.step[s]) for s in steps],
            "trend_values": [fin(band.trend[s]) for s in steps]}
