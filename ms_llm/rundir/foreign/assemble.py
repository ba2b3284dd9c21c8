"""One run out of a framework reader's records: the rank that logged the loss is read, the lines other ranks
repeated are counted and dropped, a process that started again is a resume, and the fields ms_llm derives
(tokens per second for the whole job, skipped steps so far) are computed where the log has what they need."""
import math

from ms_llm.rundir.foreign.needs import lacking

USED = ("training lines", "validation lines", "memory reports", "timer lines")  # counted, not left out


def _real_loss(rec):
    return isinstance(rec.get("loss"), float)


def _rank_key(rank):
    return -1 if rank is None else rank


def choose_rank(train):
    """The rank whose records to read: the one with the most real losses (a pipeline stage without the loss has
    placeholders), then the lowest rank."""
    by = {}
    for rank, _, rec in train:
        n = by.setdefault(rank, [0, 0])
        n[0] += _real_loss(rec)
        n[1] += 1
    if not by:
        return None
    return max(by, key=lambda r: (by[r][0], -_rank_key(r)))


def ordered_records(p, counts):
    """The primary rank's records in log order, one per step and process, with the steps only other ranks
    logged (with a real loss) merged in; (records, resume steps found from the steps going back)."""
    primary = choose_rank(p.train)
    mine = sorted((x for x in p.train if x[0] == primary), key=lambda x: x[1])
    restarts = sorted(o for r, o, _ in p.restarts if r == primary or r is None or primary is None)
    out, seen_steps, resumes = [], set(), []
    prev_step, prev_order = None, None
    for _, order, rec in mine:
        restarted = any(prev_order is not None and prev_order < o <= order for o in restarts)
        if prev_step is not None and not restarted:
            if rec["step"] == prev_step:
                counts["lines repeated by several ranks (or printed twice)"] += 1
                continue
            if rec["step"] < prev_step:
                resumes.append(rec["step"])  # the step went back: a new process from an earlier checkpoint
        out.append(dict(rec))
        seen_steps.add(rec["step"])
        prev_step, prev_order = rec["step"], order
    others = [x for x in p.train if x[0] != primary]
    extra = {}
    for rank, _, rec in others:
        if rec["step"] in seen_steps:
            counts["lines repeated by several ranks (or printed twice)"] += 1
        elif _real_loss(rec) and rec["step"] not in extra:
            extra[rec["step"]] = dict(rec, from_rank=rank)
        else:
            counts["lines of other ranks without the loss"] += 1
    if extra:
        counts["steps only other ranks logged (merged in)"] += len(extra)
        out = sorted(out + list(extra.values()), key=lambda r: r["step"]) if not resumes else out + sorted(
            extra.values(), key=lambda r: r["step"])
    return out, resumes, primary


def unique(items, key):
    out, seen = [], set()
    for _, _, rec in sorted(items, key=lambda x: x[1]):
        k = key(rec)
        if k in seen:
            continue
        seen.add(k)
        out.append(dict(rec))
    return out


def derive(records, config, world):
    """skipped (so far), tokens_per_s for the whole job, tokens consumed, interval_s: ms_llm's fields from the ones
    the log printed, where the config gives the batch and sequence length."""
    train = config.get("train") or {}
    seq = (config.get("model") or {}).get("seq_length")
    gbs = train.get("global_batch_size")
    skipped, prev = 0, None
    for rec in records:
        n = rec["step"] - prev if prev is not None and rec["step"] > prev else (
            train.get("log_interval") or 1 if prev is None else 1)
        prev = rec["step"]
        if isinstance(rec.get("skipped_interval"), int):
            skipped += rec["skipped_interval"]
            rec["skipped"] = skipped
        ms = rec.get("ms_per_step")
        per_step = (rec.get("global_batch_size") or gbs or 0) * (seq or 0)
        if "tokens_per_s" not in rec:
            if isinstance(ms, float) and ms > 0 and per_step:
                rec["tokens_per_s"] = per_step / (ms / 1000)
            elif isinstance(rec.get("tokens_per_s_per_device"), float) and world:
                rec["tokens_per_s"] = rec["tokens_per_s_per_device"] * world
            elif isinstance(rec.get("samples_per_s_per_device"), float) and world and seq:
                rec["tokens_per_s"] = rec["samples_per_s_per_device"] * world * seq
        if "ms_per_step" not in rec and per_step and isinstance(rec.get("tokens_per_s"), float) \
                and rec["tokens_per_s"] > 0:
            rec["ms_per_step"] = 1000 * per_step / rec["tokens_per_s"]
        if "interval_s" not in rec and isinstance(rec.get("ms_per_step"), float):
            rec["interval_s"] = round(rec["ms_per_step"] * n / 1000, 6)
        if "tokens" not in rec and per_step and "global_batch_size" not in rec:
            rec["tokens"] = rec["step"] * per_step
        for k, v in list(rec.items()):
            if isinstance(v, float) and math.isnan(v) and k != "loss" and k not in ("grad_norm", "loss_scale"):
                rec.pop(k)  # a NaN throughput or memory is a value the log could not compute, not a symptom
    return records


def world_size(p, ranks, config):
    w = p.info.get("world_size")
    if isinstance(w, int) and w > 0:
        return w
    pc = config.get("parallel_config") or {}
    if pc.get("data_parallel"):
        return pc["data_parallel"] * (pc.get("model_parallel") or 1) * (pc.get("pipeline_stage") or 1)
    named = [r for r in ranks if r is not None]
    return len(named) if len(named) > 1 else None


def checked(config):
    """(config, notes): each value that the section's schema refuses (a value the log garbled, a name ms_llm uses
    differently) left out, with a note."""
    from ms_llm.config.loader import SECTIONS, build_section
    from ms_llm.errors import UserError

    out, notes = {}, []
    for name, values in (config or {}).items():
        if name not in SECTIONS or not isinstance(values, dict):
            continue
        keep = {}
        for key, value in values.items():
            try:
                build_section(name, SECTIONS[name], {key: value})
                keep[key] = value
            except (UserError, TypeError, ValueError):
                notes.append(f"{name}.{key} = {value!r} left out: not a valid ms_llm value")
        if keep:
            out[name] = keep
    return out, notes


def build(p, run, files):
    """Fill `run` (a ms_llm.rundir.reader.Run) from the Parsed `p`."""
    counts = p.counts
    p.config, bad = checked(p.config)
    p.config_notes += bad
    records, resumes, primary = ordered_records(p, counts)
    ranks = sorted({r for r, _, _ in p.train + p.evals + p.events}, key=_rank_key)
    world = world_size(p, ranks, p.config)
    run.train = derive(records, p.config, world)
    run.evals = unique(p.evals, lambda r: (r["step"], r.get("split")))
    events = unique(p.events, lambda r: (r["step"], r["event"], r.get("detail", "")[:40] if r["event"] !=
                                         "nonfinite" else ""))
    have = {e["step"] for e in events if e["event"] == "resume"}
    events += [{"step": s, "event": "resume", "detail": "the logged step went back: a new process"}
               for s in resumes if s not in have]
    run.events = sorted(events, key=lambda e: e["step"])
    run.config = p.config
    notes = list(p.config_notes)
    if not p.config:
        notes.insert(0, f"no config: the {p.framework} log has no argument dump and no config file was found "
                        f"beside it, so the settings rules have nothing to judge")
    run.config_note = "; ".join(notes)
    steps = [r["step"] for r in run.train]
    info = {"framework": p.framework, "format": p.info.get("format"), "version": p.info.get("version") or "",
            "files": files, "ranks": [r for r in ranks if r is not None], "rank_read": primary,
            "config_source": p.config_source}
    if p.info.get("max_steps"):
        info["max_steps"] = p.info["max_steps"]
    if world:
        info["parallel"] = {"world_size": world}
        dp = (p.config.get("parallel_config") or {}).get("data_parallel")
        if dp:
            info["parallel"]["data_parallel"] = dp
    if p.ended and steps:
        info["final"] = {"steps": max(steps)}
    for key in ("pipeline_stages", "mesh", "args"):
        if key in p.info:
            info[key] = p.info[key]
    run.info = info
    run.lacks = lacking(run, p.absent)
    run.skipped = {k: v for k, v in counts.items() if v and k not in USED}
    info["lines_read"] = {k: counts[k] for k in USED if counts[k]}
    return run
