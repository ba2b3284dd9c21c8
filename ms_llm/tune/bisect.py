"""`ms-llm debug bisect GOOD BAD`: which of the settings two runs differ in explains the difference in a metric,
proven by experiment.

GOOD and BAD are run directories or configs (`--set-good` / `--set-bad` change them further). The resolved configs
are flattened to dotted keys and compared; every short run trains GOOD's config with some of BAD's values, for
`--steps` steps (train.max_steps is set to that in every run, GOOD's and BAD's included). A run "reproduces BAD"
when its metric lies at least BAD_SIDE of the way from GOOD's to BAD's:

    1. GOOD and BAD themselves (reused when a run directory already trained exactly that config for those steps);
    2. the first half of the differing keys applied to GOOD: it reproduces BAD → the cause is in that half; it stays
       at GOOD → the cause is in the other half; in between → both halves contribute, each is bisected;
    3. down to one key; the set found is confirmed by a run of exactly it. When neither half alone reproduces BAD,
       the cause needs parts of both (two keys acting together, or each explaining a part): the part of each half
       needed with the other applied is searched, and every key of such a set is also run alone, to say how far
       each goes by itself.

That is about ceil(log2 k) + 2 runs for k differing keys. The plan and its cost are printed before anything runs,
each run shows progress and the bisect's ETA (the ladder's launcher, ladder/launch.py), runs go under
OUT/bisect/runs/ and are reused when the bisect is run again (an interrupted bisect resumes), and OUT/bisect.json holds
the keys found (each with both values), the metric of every run and the runs' directories. OUT is BAD's run
directory when BAD is one, else runs/bisect-<time>. The last line names the key(s):

    bisect: model.ffn_hidden_size (512 → 16) explains val_loss 2.39 → 2.54 (5 runs)
"""
import json
import math
import os
import statistics
import time

import yaml

from ms_llm.errors import UserError
from ms_llm.rundir import names
from ms_llm.rundir.reader import flatten, is_run_dir, load_run

FORMAT = "ms_llm.tune.bisect/1"
BAD_SIDE = 0.75      # a run at least 75% of the way from GOOD's metric to BAD's reproduces BAD
GOOD_SIDE = 0.25     # ... at most 25% of the way stays at GOOD; in between, both halves contribute
MIN_GAP = {"val_loss": 0.005, "loss": 0.005}  # a smaller difference between GOOD and BAD is nothing to explain
MIN_REL_GAP = 0.05   # other metrics (tokens/s, grad norm): 5% of GOOD's
METRICS = ("val_loss", "loss", "tokens_per_s", "grad_norm", "mfu", "mem_gib")


def side(spec, sets, label):
    """(config dict, run dir or None, description) of GOOD or BAD: a run directory or a config file, with `sets`."""
    from ms_llm.config import load_config, to_dict

    if os.path.isdir(spec):
        if not is_run_dir(spec):
            raise UserError(f"{label} '{spec}' is a folder but not a run directory (no config.yaml). Pass a run "
                            f"directory 'ms-llm train' wrote, or a config file.")
        path, run_dir = names.run_config_path(spec), spec
    elif os.path.isfile(spec):
        path, run_dir = spec, None
    else:
        raise UserError(f"{label} '{spec}' does not exist. Pass a run directory or a config file (YAML).")
    cfg = to_dict(load_config(path, list(sets)))
    return cfg, (run_dir if not sets else None), spec + "".join(f" --set {s}" for s in sets)


def differing(good, bad, fixed=("train.max_steps",)):
    """[(key, GOOD's value, BAD's value)] of the flattened configs, in the schema's order."""
    fg, fb = flatten(good), flatten(bad)
    return [(k, fg.get(k), fb.get(k)) for k in dict.fromkeys(list(fg) + list(fb))
            if k not in fixed and fg.get(k) != fb.get(k)]


def nested(flat):
    out = {}
    for key, value in flat.items():
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return out


def metric_of(run, metric):
    """The run's value of `metric`: the last validation loss, the last training loss, or the median of a per-record
    rate over the records after the first (the first holds the compile); None when the run has none."""
    if metric == "val_loss":
        vals = [r["val_loss"] for r in run.evals if finite(r.get("val_loss"))]
        return vals[-1] if vals else None
    if metric == "loss":
        vals = [r["loss"] for r in run.train if finite(r.get("loss"))]
        return vals[-1] if vals else None
    vals = [r[metric] for r in run.train[1:] or run.train if finite(r.get(metric))]
    return statistics.median(vals) if vals else None


def finite(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def shown(v):
    if isinstance(v, float):
        return f"{v:.6g}"
    return "null" if v is None else str(v)


class Bisect:
    def __init__(self, good, bad, metric, steps, out, echo, together=()):
        self.good_cfg, self.good_dir, self.good_label = good
        self.bad_cfg, self.bad_dir, self.bad_label = bad
        self.metric, self.steps, self.out, self.echo = metric, steps, out, echo
        self.diff = differing(self.good_cfg, self.bad_cfg)
        self.units = units(self.diff, together)
        self.runs = []          # {"label", "applied", "metric", "run_dir", "seconds"}
        self.seconds = []
        self.planned = 0
        from ms_llm.tune.ladder.launch import Launcher

        self.work = os.path.join(out, names.BISECT_DIR)
        self.launcher = Launcher(os.path.join(self.work, "logs"), echo, what="bisect", unit="run")

    # --- one short run ---------------------------------------------------------------------------------------

    def config(self, applied):
        flat = flatten(self.good_cfg)
        bad = flatten(self.bad_cfg)
        for k in applied:
            flat[k] = bad.get(k)
        flat["train.max_steps"] = self.steps
        return nested(flat)

    def reusable(self, run_dir, applied):
        """A run directory (the user's, or an earlier run of this bisect) that trained exactly this config for --steps
        steps: every value the trial's config states is the run's (a null the run's config.yaml resolved, such as
        the vocabulary taken from the data, matches what it resolved to)."""
        if not run_dir or not os.path.isfile(os.path.join(run_dir, names.METRICS)):
            return None
        run = load_run(run_dir)
        if run.status != "finished" or run.max_steps != self.steps:
            return None
        mine = flatten(run.config)
        same = all(v is None or mine.get(k) == v for k, v in flatten(self.config(applied)).items())
        return run if same else None

    def trial(self, label, applied, reuse=None):
        applied = tuple(applied)
        for r in self.runs:
            if set(r["applied"]) == set(applied):
                return r["metric"]
        run = self.reusable(reuse, applied)
        t0 = time.monotonic()
        if run is None:
            k = len(self.runs) + 1
            run_dir = os.path.join(self.work, "runs", f"{k:02d}-{label}")
            run = self.reusable(run_dir, applied) if os.path.isdir(run_dir) else None
            if run is None:
                config_path = os.path.join(self.work, "configs", f"{k:02d}-{label}.yaml")
                os.makedirs(os.path.dirname(config_path), exist_ok=True)
                with open(config_path, "w", encoding="utf-8") as f:
                    yaml.safe_dump(self.config(applied), f, sort_keys=False)
                if os.path.isdir(run_dir):  # an attempt that did not finish: kept aside, never deleted
                    from ms_llm.tune.ladder.launch import move_aside

                    move_aside(run_dir, os.path.join(self.work, "interrupted"), self.echo)
                what = ", ".join(applied) if applied else "none"
                self.echo(f"bisect [{len(self.runs) + 1}/~{self.planned}] {label}: GOOD + BAD's {what}")
                code, wall, log, error = self.launcher.run(f"{k:02d}-{label}", config_path, run_dir, 1, False,
                                                           self.steps, self.eta)
                if code != 0:
                    raise UserError(f"bisect: the run '{label}' ({run_dir}) failed: {error or 'see ' + log}. Fix it "
                                    f"and run the same command again: the runs that finished are reused.")
                self.seconds.append(wall)
                if len(self.seconds) == 1 and self.per_run_estimate() is None:  # the plan could not say the time
                    left = max(0, self.planned - len(self.runs) - 1)
                    self.echo(f"  the first run took {clock(wall)}: the remaining ~{left} run(s) about "
                              f"{clock(wall * left)}")
                run = load_run(run_dir)
        value = metric_of(run, self.metric)
        if value is None:
            raise UserError(f"bisect: the run '{label}' ({run.path}) logged no {self.metric}. "
                            + ("Validation runs at the end of every run; check its log." if self.metric == "val_loss"
                               else f"Choose --metric from {', '.join(METRICS)}."))
        self.runs.append({"label": label, "applied": list(applied), "metric": value, "run_dir": run.path,
                          "seconds": round(time.monotonic() - t0, 1)})
        self.echo(f"  {label}: {self.metric} {value:.6g}" + (f" ({self.verdict(value)})" if len(self.runs) > 2
                                                             else ""))
        return value

    def eta(self, rung_left, elapsed):
        per = statistics.median(self.seconds) if self.seconds else None
        left_runs = max(0, self.planned - len(self.runs) - 1)
        if per is None:
            return None
        return (rung_left if rung_left is not None else max(0.0, per - elapsed)) + left_runs * per

    # --- the search ------------------------------------------------------------------------------------------

    def fraction(self, value):
        return (value - self.m_good) / self.gap

    def verdict(self, value):
        f = self.fraction(value)
        return "BAD" if f >= BAD_SIDE else "GOOD" if f <= GOOD_SIDE else f"between ({100 * f:.0f}% of the way)"

    def share(self, applied):
        """How far a run with `applied` (units: BAD's values of those keys on GOOD) lies from GOOD toward BAD."""
        keys = self.valid([k for u in applied for k in u])
        return self.fraction(self.trial(self.name(keys), keys))

    def valid(self, keys):
        """`keys` with the keys a valid config needs beside them: when BAD's values of `keys` on GOOD fail
        validation and the refusal names other differing keys (train.lr below train.min_lr), those go with them."""
        from ms_llm.config import config_from_dict

        keys = list(keys)
        for _ in range(len(self.diff)):
            try:
                config_from_dict(self.config(keys))
                return keys
            except UserError as e:
                partners = [k for k, _, _ in self.diff if k not in keys and k in str(e)]
                if not partners:
                    raise UserError(f"bisect: BAD's {', '.join(keys)} on GOOD is not a valid config ({e}) and names no "
                                    f"other differing key: give the keys that only work together with --together "
                                    f"KEY1,KEY2.") from None
                keys += partners
        return keys

    def minimal(self, keys, base=(), assume=True):
        """The smallest part of `keys` that, with `base` applied too, reproduces BAD (base + keys does; base alone
        does not). Halves: the first reproduces BAD → search it; it stays at GOOD → (`assume`: the cause is in the
        second half, checked once at the end by search) search the second; otherwise the second is run too, and
        when neither alone reproduces BAD the cause needs parts of both: the part of each half needed with the
        other applied."""
        keys = list(keys)
        if len(keys) == 1:
            return keys
        half, rest = keys[:len(keys) // 2], keys[len(keys) // 2:]
        f1 = self.share(list(base) + half)
        if f1 >= BAD_SIDE:
            return self.minimal(half, base, assume)
        if f1 <= GOOD_SIDE and assume:
            return self.minimal(rest, base, assume)
        if self.share(list(base) + rest) >= BAD_SIDE:
            return self.minimal(rest, base, assume)
        first = self.minimal(half, list(base) + rest, assume)
        return first + self.minimal(rest, list(base) + first, assume)

    def search(self, keys):
        """The smallest set of units (keys that change together) that reproduces BAD, confirmed by a run of exactly
        that set; its keys."""
        found = self.minimal(keys)
        if self.share(found) < BAD_SIDE:  # the shortcut assumed a half that did nothing held no part of the cause
            found = self.minimal(keys, assume=False)
        keys = self.valid([k for u in found for k in u])
        if len(keys) > sum(len(u) for u in found):  # it needed keys beside it to be a valid config: one unit
            found = [tuple(keys)]
        if len(found) > 1:  # what each explains alone
            for u in found:
                self.share([u])
        self.found_units = found
        return keys

    @staticmethod
    def name(keys):
        tail = keys[0].split(".")[-1]
        return tail if len(keys) == 1 else f"{tail}+{len(keys) - 1}"

    def plan(self):
        k = len(self.units)
        self.planned = 2 + (math.ceil(math.log2(k)) + (1 if k > 1 else 0) if k else 0)
        per = self.per_run_estimate()
        grouped = len(self.diff) - k
        lines = [f"bisect: {len(self.diff)} setting(s) differ between GOOD ({self.good_label}) and BAD "
                 f"({self.bad_label})" + (f", bisected as {k} (keys that change together are one)" if grouped else "")
                 + ":"]
        lines += [f"  {key}: {shown(a)} → {shown(b)}" for key, a, b in self.diff]
        lines.append(f"plan: {self.metric} after {self.steps} steps (train.max_steps = {self.steps} in every run); GOOD "
                     f"and BAD, then about {self.planned - 2} run(s) with halves of the difference applied to GOOD: "
                     f"~{self.planned} runs" + (f", about {clock(per * self.planned)} at ~{clock(per)} each" if per
                                                 else ", the time known after the first") + f"; runs in {os.path.join(self.work, 'runs')}")
        return "\n".join(lines)

    def per_run_estimate(self):
        """Seconds per run from a run directory the user gave: its steps' time scaled to --steps, plus compile."""
        for d in (self.bad_dir, self.good_dir):
            if not d or not os.path.isfile(os.path.join(d, names.METRICS)):
                continue
            run = load_run(d)
            ms = [r["ms_per_step"] for r in run.train[1:] if finite(r.get("ms_per_step"))]
            if ms:
                compile_s = run.final.get("compile_s") if finite(run.final.get("compile_s")) else 10.0
                return statistics.median(ms) / 1000 * self.steps + compile_s + 10.0
        return None

    def run(self):
        self.echo(self.plan())
        if not self.diff:
            raise UserError("bisect: GOOD and BAD resolve to the same config (besides train.max_steps): there is no "
                            "setting to bisect. Give --set-good or --set-bad, or two runs that differ.")
        self.m_good = self.trial("good", (), reuse=self.good_dir)
        all_keys = [k for k, _, _ in self.diff]
        self.m_bad = self.trial("bad", all_keys, reuse=self.bad_dir)
        self.gap = self.m_bad - self.m_good
        need = MIN_GAP.get(self.metric, MIN_REL_GAP * abs(self.m_good))
        if abs(self.gap) < need:
            found = []
            self.echo(f"bisect: GOOD and BAD differ by {abs(self.gap):.3g} in {self.metric} (less than {need:.3g}): "
                      f"none of the {len(all_keys)} settings changes it measurably at {self.steps} steps")
        else:
            found = self.search(self.units) if len(self.units) > 1 else list(all_keys)
            if len(self.units) == 1:
                self.found_units = list(self.units)
        return self.write(found)

    def write(self, found):
        diff = {k: (a, b) for k, a, b in self.diff}
        rows = []
        if found:
            alone = [(u, self.alone_metric(list(u))) for u in self.found_units] if len(self.found_units) > 1 else []
            rows = [{"keys": list(found), "values": [{"key": k, "good": diff[k][0], "bad": diff[k][1]} for k in found],
                     "metric": self.alone_metric(found),
                     "alone": [{"key": k, "keys": list(u), "metric": m, "share": self.fraction(m)}
                               for u, m in alone if m is not None for k in u]}]
        last = self.last_line(found)
        doc = {"format": FORMAT, "good": self.good_label, "bad": self.bad_label, "metric": self.metric,
               "steps": self.steps, "differing": [{"key": k, "good": a, "bad": b} for k, a, b in self.diff],
               "good_metric": self.m_good, "bad_metric": self.m_bad, "found": rows, "runs": self.runs,
               "verdict": last, "time": round(time.time(), 3)}
        from ms_llm.fileio import atomic_write_bytes

        atomic_write_bytes(os.path.join(self.out, names.BISECT), json.dumps(doc, indent=1, default=str).encode())
        self.echo(table(doc))
        self.echo(last)
        return doc

    def alone_metric(self, keys):
        for r in self.runs:
            if set(r["applied"]) == set(keys):
                return r["metric"]
        return None

    def last_line(self, found):
        change = f"{self.metric} {self.m_good:.4g} → {self.m_bad:.4g} ({len(self.runs)} runs)"
        if not found:
            return f"bisect: no setting explains {change}"
        diff = {k: (a, b) for k, a, b in self.diff}
        named = [f"{k} ({shown(diff[k][0])} → {shown(diff[k][1])})" for k in found]
        if len(self.found_units) == 1:
            return f"bisect: {' with '.join(named)} explain{'s' if len(named) == 1 else ''} {change}"
        alone = ", ".join(f"{' + '.join(u)} {100 * self.fraction(self.alone_metric(list(u))):.0f}%"
                          for u in self.found_units)
        return f"bisect: {' and '.join(named)} together explain {change}; alone, each goes this far: {alone}"


def units(diff, together=()):
    """The differing keys as units for the search: each group of `together` (keys that only make a valid config
    with each other, e.g. model.num_heads with model.num_kv_heads) as one, every other key alone."""
    keys = [k for k, _, _ in diff]
    out, seen = [], set()
    for group in together:
        unit = tuple(k for k in keys if k in group and k not in seen)
        if unit:
            out.append(unit)
            seen.update(unit)
    return out + [(k,) for k in keys if k not in seen]


def table(doc):
    """The runs of a bisect as a table (also what the report shows)."""
    good, bad = doc["good_metric"], doc["bad_metric"]
    gap = (bad - good) or 1.0
    rows = [("run", "BAD's settings applied to GOOD", doc["metric"], "verdict")]
    for i, r in enumerate(doc["runs"]):
        f = (r["metric"] - good) / gap
        verdict = "" if i < 2 else "BAD" if f >= BAD_SIDE else "GOOD" if f <= GOOD_SIDE else f"{100 * f:.0f}% of the way"
        applied = ", ".join(r["applied"]) if r["applied"] else "(none)"
        if len(r["applied"]) == len(doc["differing"]) and r["applied"]:
            applied = f"all {len(r['applied'])}"
        rows.append((r["label"], applied, f"{r['metric']:.6g}", verdict))
    widths = [max(len(str(row[i])) for row in rows) for i in range(4)]
    return "\n".join("  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip() for row in rows)


def clock(seconds):
    m, s = divmod(int(round(seconds)), 60)
    return f"{m}:{s:02d}"


def default_out(bad_dir):
    if bad_dir:
        return bad_dir
    return os.path.join("runs", time.strftime("bisect-%Y%m%d-%H%M%S"))


def bisect(good, bad, metric="val_loss", steps=None, set_good=(), set_bad=(), out=None, echo=print, together=()):
    if metric not in METRICS:
        raise UserError(f"--metric {metric}: choose one of {', '.join(METRICS)}.")
    g, b = side(good, set_good, "GOOD"), side(bad, set_bad, "BAD")
    if steps is None:
        steps = flatten(b[0]).get("train.max_steps")
    if not isinstance(steps, int) or steps < 1:
        raise UserError(f"--steps {steps}: give the optimizer steps of every run, a positive whole number.")
    out = out or default_out(bad if os.path.isdir(bad) else None)
    os.makedirs(out, exist_ok=True)
    return Bisect(g, b, metric, steps, out, echo, together=[tuple(x.split(",")) if isinstance(x, str) else tuple(x)
                                                             for x in together]).run()
