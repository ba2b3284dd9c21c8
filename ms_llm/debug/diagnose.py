"""`ms-llm diagnose RUN`: symptoms in a run's metrics → evidence → likely causes → actions.

Each rule below reads the parsed run (`ms_llm.debug.runs.Run`) and returns a `Finding` or None. The
thresholds are module constants, each documented (with the reason for its value) in docs/debugging.md; they
were set so that healthy runs — the quickstart's 2,000 steps, whose grad norm doubles and whose loss scale
grows as it should, and fp16 runs with the usual occasional overflow — produce no finding at all.
"""
import math
import statistics
from dataclasses import asdict, dataclass, field

from ms_llm.debug.runs import load_run
from ms_llm.errors import UserError

MIN_RECORDS = 4          # loss-curve rules need at least this many log records
EXPLODE_FACTOR = 10.0    # grad norm > 10x its early median = exploding
DIVERGE_ABS, DIVERGE_REL, DIVERGE_SUSTAIN = 0.25, 0.15, 3  # above best + max(0.25, 15%) for 3 records
UNIFORM_MARGIN = 1.05    # interval-mean loss above 1.05 x ln(vocab): worse than the uniform start
STUCK_VAL, STUCK_TRAIN_DROP = 0.95, 0.2  # val never below 95% of ln(vocab) while train fell 20%: labels
SMOOTH = 5               # divergence compares trailing medians of 5 records (noise-proof minimum)
FLAT_MIN_STEPS, FLAT_REL_DROP, UNIFORM_FRAC = 100, 0.02, 0.95
ZERO_LOSS, VAL_GAP_ABS, VAL_GAP_REL = 0.1, 1.0, 0.5
SPIKE_WINDOW, SPIKE_MIN_WINDOW, SPIKE_Z, SPIKE_REL = 50, 8, 5.0, 0.10
DATA_WAIT_FRAC = 0.10
SLOW_FRAC, SLOW_SHARE, SLOW_MIN_RECORDS = 0.7, 0.2, 6
LOW_MFU, LOW_MFU_MIN_HIDDEN = 0.10, 1024
OVERFLOW_SHARE, OVERFLOW_MIN = 0.05, 10
SCALE_DROPS_MIN, SCALE_DROPS_SHARE = 4, 0.25
COMM_FRAC = 0.2
MEMORY_FRAC = 0.9
CLIP_SHARE, CLIP_RATIO = 0.9, 2.0
CPU_RAM_SHARE = 0.9      # default memory limit of a CPU run: 0.9 x this machine's RAM
SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


@dataclass
class Finding:
    id: str
    severity: str  # error | warning | info (info never fails the exit code)
    symptom: str
    evidence: list
    causes: list  # most likely first
    actions: list
    steps: list = field(default_factory=list)  # the steps the evidence cites

    def to_dict(self):
        return asdict(self)


def diagnose(run_dir, device_memory=None):
    """(run, findings) for the run in `run_dir`; findings sorted errors first. Bad input is a UserError."""
    run = load_run(run_dir)
    if not run.train and not run.evals:
        raise UserError(f"'{run_dir}/metrics.jsonl' holds no training records ({run.bad_lines} unreadable line(s)). "
                        f"The run stopped before its first log interval (train.log_interval = "
                        f"{run.cfg('train.log_interval', '?')} steps) or the file is damaged; look at the run's "
                        f"logs/ and the console output of 'ms-llm train' for the error.")
    limit = memory_limit_gib(device_memory, run)
    found = {}
    for rule in RULES:
        for f in rule(run, found, limit) or []:
            found[f.id] = f
    return run, sorted(found.values(), key=lambda f: SEVERITY_ORDER[f.severity])


def exit_code(findings):
    return 1 if any(f.severity != "info" for f in findings) else 0


# --- helpers ---------------------------------------------------------------------------------------------

def finite(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def nonfinite(v):
    """NaN/Inf (read back from the "nan"/"inf" strings); a missing or null value is not a NaN."""
    return isinstance(v, float) and not math.isfinite(v)


def points(records, key):
    return [(r["step"], r[key]) for r in records if finite(r.get(key))]


def first_nonfinite_step(run):
    return next((r["step"] for r in run.train if nonfinite(r.get("loss"))), None)


def curve(run):
    """Finite (step, loss) points before the first non-finite loss: what the shape rules look at."""
    stop = first_nonfinite_step(run)
    return [(s, v) for s, v in points(run.train, "loss") if stop is None or s < stop]


def early_median(vals):
    """Median of records 2-4: the first interval mixes in initialisation transients."""
    return statistics.median(vals[1:4] if len(vals) > 2 else vals)


def g(x):
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def quoted(path):
    """A path as it can be pasted into a shell command (actions quote the run directory)."""
    return f"'{path}'" if any(c in path for c in " \t'\"$") else path


def steps_text(steps, limit=10):
    more = f" (+{len(steps) - limit} more)" if len(steps) > limit else ""
    return ", ".join(str(s) for s in steps[:limit]) + more


def lr_actions(run):
    lr, warm, n = run.cfg("train.lr", 1e-3), run.cfg("train.warmup_steps", 0), run.max_steps or 0
    return [f"--set train.lr={lr / 3:.2g} (a third of {g(lr)})",
            f"--set train.warmup_steps={max(2 * warm, n // 10, 100)} (now {warm})"]


def memory_limit_gib(text, run):
    """--device-memory, else context.max_device_memory on an accelerator, else 0.9 x RAM on CPU, else None."""
    if text:
        return parse_size_gib(text, "--device-memory")
    target = (run.info.get("device") or {}).get("target") or run.cfg("context.device_target")
    if target != "CPU" and run.cfg("context.max_device_memory"):
        return parse_size_gib(run.cfg("context.max_device_memory"), "context.max_device_memory")
    if target == "CPU":
        total = ram_gib()
        return CPU_RAM_SHARE * total if total else None
    return None


def parse_size_gib(text, what):
    """'64GB', '58G', '64GiB', '512MB', '1TB' or a bare number (GiB) → GiB (MindSpore's GB is 1024^3)."""
    s = str(text).strip().upper().replace("IB", "B")
    units = {"TB": 1024, "T": 1024, "GB": 1, "G": 1, "MB": 1 / 1024, "M": 1 / 1024}
    unit = next((u for u in units if s.endswith(u)), "")
    try:
        value = float(s[: len(s) - len(unit)]) * units.get(unit, 1)
    except ValueError:
        value = -1
    if value <= 0:
        raise UserError(f"{what} = '{text}' is not a memory size. Write it like 64GB, 58GB or 512MB.")
    return value


def ram_gib():
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 1024 ** 2
    except (OSError, ValueError, IndexError):
        pass
    return None


# --- 1. NaN / Inf --------------------------------------------------------------------------------------

def rule_nonfinite(run, found, _):
    bad = [r for r in run.train if nonfinite(r.get("loss"))]
    if not bad:
        return rule_nonfinite_val(run)
    s, rd = bad[0]["step"], quoted(run.path)
    before = [r for r in run.train if r["step"] < s]
    last = points(before, "loss")
    ev = [f"loss = {bad[0]['loss']} at step {s}, the first non-finite of {len(bad)} log record(s)"
          + (f"; the last finite loss was {g(last[-1][1])} at step {last[-1][0]}" if last else "")]
    later = [st for st, _ in points([r for r in run.train if r["step"] > s], "loss")]
    if later:
        ev.append(f"the loss was finite again at step {later[0]}: the run went on (a dynamic loss scale skips the "
                  f"updates of overflowing steps)")
    gn = [v for _, v in points(before + bad[:1], "grad_norm")]
    exploding = len(gn) >= 3 and gn[-1] > EXPLODE_FACTOR * early_median(gn)
    if len(gn) >= 3:
        ev.append(f"grad_norm before it: {g(early_median(gn))} early, {g(gn[-1])} last"
                  + (f" ({gn[-1] / early_median(gn):.0f}x: exploding)" if exploding else " (not exploding)"))
    skipped = sum(r.get("skipped_interval") or 0 for r in before + bad[:1])
    overflowing = skipped >= 3 and skipped >= OVERFLOW_SHARE * s
    ev.append(f"{skipped} of {s} steps up to {s} overflowed and were skipped by the loss scale")
    fp16 = run.cfg("precision.compute_dtype") == "float16"
    causes = []
    if exploding:
        causes.append(f"exploding gradients: the LR is too high or clipping too loose "
                      f"(train.lr = {g(run.cfg('train.lr'))}, train.clip_grad = {run.cfg('train.clip_grad')})")
    if fp16:
        causes.append("float16 overflow: activations or gradients above 65504"
                      + (" (overflows were frequent before the NaN)" if overflowing else ""))
    if not fp16 and overflowing:
        causes.append("non-finite gradients in float32/bfloat16 are not a range problem: a NaN source in the graph")
    causes.append("a NaN/Inf source: bad input ids or a numerically unsafe op (log of 0, division by zero, "
                  "a softmax row masked entirely)")
    if not exploding:
        causes.append(f"exploding gradients (LR too high: train.lr = {g(run.cfg('train.lr'))})")
    actions = [f"ms-llm debug nan --run-dir {rd} (finds the first op and layer producing NaN/Inf)"]
    if fp16:
        actions.append("--set precision.compute_dtype=bfloat16 (float32's range at float16's cost)")
    actions += lr_actions(run)[:1] + (["--set train.clip_grad=1.0"] if not run.cfg("train.clip_grad") else [])
    actions.append(f"restart from the last checkpoint before step {s} (checkpoint.save_interval keeps them)")
    return [Finding("loss_nonfinite", "error", f"loss became NaN/Inf at step {s}", ev, causes, actions, [s])]


def rule_nonfinite_val(run):
    bad = [r["step"] for r in run.evals if nonfinite(r.get("val_loss"))]
    if not bad:
        return None
    return [Finding("loss_nonfinite", "error", f"validation loss NaN/Inf at step {bad[0]} while the training loss "
                    f"is finite", [f"val_loss non-finite at steps {steps_text(bad)}"],
                    ["evaluation overflows in float16 (no loss scale protects the forward pass)",
                     "an empty or padded-only validation batch (division by zero tokens)",
                     "validation ids outside the vocabulary (dataset built with another tokenizer)"],
                    [f"ms-llm debug nan --run-dir {quoted(run.path)}",
                     "check data.dataset_dir's manifest.json: vocab_size and tokenizer match the model"], bad[:1])]


# --- 2. divergence -------------------------------------------------------------------------------------

def smoothed(pts):
    """Trailing median of SMOOTH records: the minimum of a noisy curve is itself noise, a median's is not."""
    return [(s, statistics.median(v for _, v in pts[max(0, i - SMOOTH + 1):i + 1])) for i, (s, _) in enumerate(pts)]


def rule_divergence(run, found, _):
    raw = curve(run)
    pts = smoothed(raw)
    onset = best = None
    for i in range(1, len(pts) - DIVERGE_SUSTAIN + 1):
        best = pts[i - 1] if best is None or pts[i - 1][1] < best[1] else best  # running minimum
        line = best[1] + max(DIVERGE_ABS, DIVERGE_REL * best[1])
        if all(v > line for _, v in pts[i:i + DIVERGE_SUSTAIN]):
            # the median lags the rise: report the first raw record above the line
            onset = next((st for st, v in raw if st > best[0] and v > line), pts[i][0])
            break
    stop = first_nonfinite_step(run)
    gn = [(s, v) for s, v in points(run.train, "grad_norm") if stop is None or s < stop]
    vals = [v for _, v in gn]
    blowup = len(gn) >= 6 and statistics.median(vals[-3:]) > EXPLODE_FACTOR * early_median(vals)
    # A model initialised as GPT-2 is (init_std 0.02) predicts about uniformly: its loss starts at ln(vocab).
    # An interval mean well above that means the updates made it worse than uniform: overshooting.
    vocab = run.cfg("model.vocab_size")
    uniform = math.log(vocab) if vocab else None
    above = [(st, v) for st, v in raw if uniform and v > UNIFORM_MARGIN * uniform]
    if onset is None and not blowup and not above:
        return None
    ev = []
    if above:
        ev.append(f"loss {g(above[0][1])} at step {above[0][0]} is above ln(vocab) = {g(uniform)}, the loss of a "
                  f"uniform prediction the model starts from: the first updates made it worse")
    if onset is not None:
        peak = max((p for p in pts if p[0] >= onset), key=lambda p: p[1])
        ev.append(f"loss (median of {SMOOTH} records) fell to {g(best[1])} at step {best[0]}, then stayed above "
                  f"{g(best[1] + max(DIVERGE_ABS, DIVERGE_REL * best[1]))} from step {onset} on, up to {g(peak[1])} "
                  f"at step {peak[0]}")
    if vals:
        top = max(gn, key=lambda p: p[1])
        ev.append(f"grad_norm: median {g(early_median(vals))} early, {g(top[1])} at step {top[0]} "
                  f"({top[1] / early_median(vals):.1f}x)")
    ev.append(f"train.lr = {g(run.cfg('train.lr'))}, train.warmup_steps = {run.cfg('train.warmup_steps')}, "
              f"train.clip_grad = {run.cfg('train.clip_grad')}")
    clip = run.cfg("train.clip_grad", 0)
    loose = not clip or clip > 1
    causes = [f"learning rate (LR) too high for this model and batch (train.lr = {g(run.cfg('train.lr'))})",
              f"LR warmup too short (train.warmup_steps = {run.cfg('train.warmup_steps')})"]
    causes += [f"gradient clipping off or loose (train.clip_grad = {clip})"] if loose else []
    causes += ["float16 range: growing activations overflow"] if run.cfg("precision.compute_dtype") == "float16" else []
    causes.append("a run of bad batches around the onset (duplicated or corrupt documents)")
    actions = lr_actions(run) + (["--set train.clip_grad=1.0"] if loose else []) + [
        "--set train.beta2=0.95 (faster-adapting second moment, the usual LLM setting)",
        "--set monitor.tensor_stats.every=50 (which layers' gradients grow)"]
    if onset is not None:
        return [Finding("divergence", "error", f"training diverges from step {onset}", ev, causes, actions, [onset])]
    if above:
        return [Finding("divergence", "error", f"loss rose above the uniform-prediction loss at step {above[0][0]} "
                        f"(overshooting updates)", ev, causes, actions, [above[0][0]])]
    top = max(gn, key=lambda p: p[1])
    return [Finding("divergence", "error", f"gradient norm exploding: {top[1] / early_median(vals):.0f}x its early "
                    f"value by step {top[0]}", ev, causes, actions, [top[0]])]


# --- 3. loss not falling -------------------------------------------------------------------------------

def rule_not_falling(run, found, _):
    if "loss_nonfinite" in found or "divergence" in found:
        return None  # those explain the curve better
    pts = curve(run)
    if len(pts) < MIN_RECORDS or pts[-1][0] < max(FLAT_MIN_STEPS, run.cfg("train.warmup_steps", 0)):
        return None
    first, late = pts[0][1], statistics.median(v for _, v in pts[-3:])
    vocab = run.cfg("model.vocab_size")
    uniform = math.log(vocab) if vocab and vocab > 1 else None
    at_uniform = uniform is not None and late >= UNIFORM_FRAC * uniform
    if not at_uniform and first - late >= FLAT_REL_DROP * first:
        return None
    ev = [f"loss {g(first)} at step {pts[0][0]}, {g(late)} (median of the last 3 records) at step {pts[-1][0]}: "
          f"{100 * (first - late) / first:.1f}% lower"]
    causes = []
    if uniform is not None:
        ev.append(f"ln(vocab_size = {vocab}) = {g(uniform)}: the loss of a uniform guess")
    skipped = run.train[-1].get("skipped") or 0
    if skipped >= 0.5 * pts[-1][0]:
        ev.append(f"{skipped} of {pts[-1][0]} steps were skipped as overflows")
        causes.append("most optimizer steps are skipped (loss-scale overflow): the weights barely change")
    if at_uniform:
        causes.append("nothing is learned: the model predicts uniformly (frozen/zero gradients, LR ≈ 0, "
                      "or targets unrelated to the inputs)")
    causes += [f"LR too low (train.lr = {g(run.cfg('train.lr'))}), or too high so the loss bounces on a plateau",
               "a label bug: targets misaligned with inputs (not shifted by one, or shuffled separately)",
               "a fine-tuned model already at its plateau (checkpoint.load_weights) — then this is expected"]
    actions = ["ms-llm debug overfit (a correct model drives one batch's loss to ~0; if it cannot, the bug is in "
               "the model, labels or optimizer, not the LR)",
               f"--set train.lr={run.cfg('train.lr', 1e-3) * 3:.2g} (3x) and --set train.lr="
               f"{run.cfg('train.lr', 1e-3) / 3:.2g} (1/3) for a few hundred steps each"]
    return [Finding("loss_not_falling", "error", f"loss not falling after {pts[-1][0]} steps", ev, causes, actions,
                    [pts[0][0], pts[-1][0]])]


# --- 4. suspicious labels ------------------------------------------------------------------------------

def rule_labels(run, found, _):
    pts, evals = curve(run), points(run.evals, "val_loss")
    zero = next(((s, v) for s, v in pts if v < ZERO_LOSS), None)
    ev, causes, steps = [], [], []
    if zero:
        near_val = [v for s, v in evals if s >= zero[0]] or [v for _, v in evals[-1:]]
        ev.append(f"training loss {g(zero[1])} at step {zero[0]} ({100 * zero[0] / (run.max_steps or zero[0]):.0f}% "
                  f"into the run): natural text never gets this low"
                  + (f"; val_loss {g(near_val[0])} after it" if near_val else "; no evaluation to compare"))
        steps.append(zero[0])
        if near_val and near_val[0] < 2 * ZERO_LOSS:
            causes.append("the future is visible to the model: targets equal inputs (not shifted by one) or the "
                          "causal mask is missing — train and val loss both collapse")
        else:
            causes.append("the training step's targets are not shifted (or shifted twice) while evaluation's are: "
                          "the model learns to copy its input")
    half = (run.max_steps or math.inf) / 2
    first_eval = evals[0] if evals and evals[0][0] <= half else None
    train_at = [v for s, v in pts if first_eval and s <= first_eval[0]]
    if first_eval and train_at:
        gap = first_eval[1] - train_at[-1]
        if gap > max(VAL_GAP_ABS, VAL_GAP_REL * train_at[-1]):
            ev.append(f"first evaluation at step {first_eval[0]}: val_loss {g(first_eval[1])} vs training loss "
                      f"{g(train_at[-1])} (+{g(gap)}) — too early in the run for overfitting")
            steps.append(first_eval[0])
            if not zero:  # with a collapsed training loss the cause above already says this
                causes.append("training and evaluation build targets differently (one shifts, the other does not, "
                              "or shifts twice)")
            causes.append("the validation split comes from another tokenizer or distribution (data.dataset_dir)")
    vocab = run.cfg("model.vocab_size")
    if len(evals) >= 2 and len(pts) >= MIN_RECORDS and vocab and not steps:
        uniform, fell = math.log(vocab), (pts[0][1] - pts[-1][1]) / pts[0][1]
        if min(v for _, v in evals) > STUCK_VAL * uniform and fell > STUCK_TRAIN_DROP:
            ev.append(f"training loss fell {100 * fell:.0f}% ({g(pts[0][1])} → {g(pts[-1][1])}) while val_loss never "
                      f"left the uniform-prediction level ln(vocab) = {g(uniform)} (best {g(min(v for _, v in evals))}):"
                      f" what the step learns does not transfer to next-token prediction")
            steps.append(evals[-1][0])
            causes.append("the training step's targets are not the next tokens (not shifted, or shifted twice) while "
                          "evaluation's are")
            causes.append("the validation split comes from another tokenizer or distribution (data.dataset_dir)")
    if not ev:
        return None
    causes.append("memorising a tiny dataset over many epochs (then val_loss rises while train falls)")
    actions = ["ms-llm debug overfit (checks model + labels on one batch)",
               "decode one training batch and check targets == inputs shifted by one token (ids[:, 1:] vs "
               "ids[:, :-1]), in the training step and in evaluation",
               "check data.dataset_dir/manifest.json: tokenizer and vocab_size match config.yaml"]
    return [Finding("labels", "error", "suspicious labels: loss too low to be real or val far above train", ev,
                    causes, actions, steps)]


# --- 5. loss spikes ------------------------------------------------------------------------------------

def noise_scale(values, centre):
    """Standard deviation of `values` that ignores their 10% largest deviations (earlier spikes, the steep first
    records): RMS of the closest 90%, divided by 0.789, its value for Gaussian noise of unit deviation."""
    dev = sorted(abs(v - centre) for v in values)[:max(1, math.ceil(0.9 * len(values)))]
    return math.sqrt(sum(d * d for d in dev) / len(dev)) / 0.789


def rule_spikes(run, found, _):
    pts = curve(run)
    if "divergence" in found:
        pts = [p for p in pts if p[0] < found["divergence"].steps[0]]
    # z-score of the jump from the previous record against the previous jumps: the trend of a falling loss
    # cancels out
    jumps = [pts[i][1] - pts[i - 1][1] for i in range(1, len(pts))]
    spikes = []
    for i in range(SPIKE_MIN_WINDOW, len(jumps)):
        window = jumps[max(0, i - SPIKE_WINDOW):i]
        centre = statistics.median(window)
        prev = pts[i][1]
        scale = max(noise_scale(window, centre), 0.01 * prev)  # floor: a flat tail's tiny noise is no spike
        z = (jumps[i] - centre) / scale
        s, v = pts[i + 1]
        if z > SPIKE_Z and v > (1 + SPIKE_REL) * prev:
            spikes.append((s, v, prev, z))
    if not spikes:
        return None
    ev = [f"step {s}: loss {g(v)}, up from {g(m)} at the record before (+{100 * (v - m) / m:.0f}%; z = {z:.1f} "
          f"against up to {SPIKE_WINDOW} previous changes)" for s, v, m, z in spikes[:10]]
    causes = ["bad batches at those steps (corrupt, duplicated or very long/repetitive documents)",
              f"LR near the edge of stability (train.lr = {g(run.cfg('train.lr'))})",
              f"Adam's second moment adapting too slowly (train.beta2 = {run.cfg('train.beta2')})"]
    if run.cfg("precision.compute_dtype") == "float16":
        causes.append("float16 precision loss in attention logits or norms")
    actions = [f"inspect the batches of steps {steps_text([s for s, *_ in spikes])} (data position = step x "
               f"global_batch_size samples)", "--set train.beta2=0.95", lr_actions(run)[0],
               "--set train.clip_grad=1.0" if not run.cfg("train.clip_grad") else "--set monitor.tensor_stats.every=50"]
    return [Finding("loss_spikes", "warning", f"{len(spikes)} loss spike(s) at steps "
                    f"{steps_text([s for s, *_ in spikes])}", ev, causes, actions, [s for s, *_ in spikes])]


# --- 6. throughput -------------------------------------------------------------------------------------

def steady(run, key):
    """(step, value) of `key` without the first log record, which carries the warm-up."""
    pts = points(run.train, key)
    return pts[1:] if len(pts) > 1 else pts


def rule_data_wait(run, found, _):
    pts = steady(run, "data_wait_frac")
    if not pts or statistics.median(v for _, v in pts) <= DATA_WAIT_FRAC:
        return None
    med = statistics.median(v for _, v in pts)
    high = [s for s, v in pts if v > DATA_WAIT_FRAC]
    workers = run.cfg("data.num_workers", 1)
    ev = [f"median data wait {100 * med:.0f}% of step time (max {100 * max(v for _, v in pts):.0f}%); above "
          f"{100 * DATA_WAIT_FRAC:.0f}% in {len(high)} of {len(pts)} records (steps {steps_text(high)})",
          f"data.num_workers = {workers}"]
    causes = [f"too few reader threads (data.num_workers = {workers})",
              "the dataset on slow or network storage (OBS/NFS mount): reads stall each step",
              "tokenizing on the fly instead of reading preprocessed MindRecord",
              "CPU contention on the host (other jobs, too many ranks per host)"]
    actions = [f"--set data.num_workers={max(2, 2 * workers)}", "copy the dataset to local disk (or cache it)",
               "ms-llm preprocess --config <config> (packed MindRecord once, read fast afterwards)"]
    return [Finding("data_wait", "warning", f"input pipeline stalls: {100 * med:.0f}% of step time waiting for data",
                    ev, causes, actions, high[:10])]


def rule_uneven(run, found, _):
    pts = steady(run, "tokens_per_s")
    if len(pts) < SLOW_MIN_RECORDS:
        return None
    med = statistics.median(v for _, v in pts)
    slow = [(s, v) for s, v in pts if v < SLOW_FRAC * med]
    if len(slow) < 2 or len(slow) < SLOW_SHARE * len(pts):
        return None
    waits = dict(points(run.train, "data_wait_frac"))
    slow_wait = statistics.median(waits.get(s, 0.0) for s, _ in slow)
    ev = [f"median {med:,.0f} tokens/s; {len(slow)} of {len(pts)} records below {100 * SLOW_FRAC:.0f}% of it: "
          + ", ".join(f"step {s}: {v:,.0f}" for s, v in slow[:8]),
          f"median data wait in the slow records: {100 * slow_wait:.0f}%"]
    causes = (["data stalls (the slow records wait for data)"] if slow_wait > DATA_WAIT_FRAC else []) + [
        "host contention: other processes, CPU frequency scaling, swapping",
        "a straggler rank or shared network in multi-card runs",
        "recompilation (changing shapes) or synchronous checkpoint writes"]
    actions = ["--set checkpoint.async_save=true", "profile a slow window: --set monitor.profile.start_step=<step> "
               "--set monitor.profile.stop_step=<step+10>", "check the host: top / npu-smi info for other jobs"]
    return [Finding("throughput_uneven", "warning", "uneven (saw-toothed) throughput", ev, causes, actions,
                    [s for s, _ in slow[:10]])]


def rule_low_mfu(run, found, _):
    pts = steady(run, "mfu")
    hidden = run.cfg("model.hidden_size", 0)
    if not pts or hidden < LOW_MFU_MIN_HIDDEN:
        return None  # small models cannot fill a device: low MFU is expected, not actionable
    med = statistics.median(v for _, v in pts)
    if med <= 0 or med >= LOW_MFU:
        return None
    ev = [f"median MFU {100 * med:.1f}% (hidden {hidden}, micro batch {run.cfg('train.micro_batch_size')}, "
          f"mode {run.cfg('context.mode')})"]
    for op in (run.final.get("profile_top_ops") or [])[:3]:
        ev.append(f"profile: {op.get('op')} {g(op.get('ms_per_step'))} ms/step ({100 * (op.get('share') or 0):.0f}%)")
    causes = ["micro batch too small to keep the device busy", "pynative mode or jit_level O0 (no graph fusion)",
              "full recompute where select_recompute would do", "data waits or communication (see those findings)"]
    actions = [f"--set train.micro_batch_size={2 * run.cfg('train.micro_batch_size', 1)} (if memory allows)",
               "--set context.mode=graph", "--set recompute_config.select_recompute=true instead of full recompute",
               "ms-llm benchmark --config <config> and a profile window (monitor.profile) for the top ops"]
    return [Finding("low_mfu", "warning", f"low MFU: {100 * med:.1f}%", ev, causes, actions)]


# --- 7. loss-scale overflows ---------------------------------------------------------------------------

def rule_loss_scale(run, found, _):
    recs = run.train
    if len(recs) < 2:
        return None
    # the first interval holds the dynamic scale's initial calibration (a few overflows by design)
    skipped = sum(r.get("skipped_interval") or 0 for r in recs[1:])
    span = recs[-1]["step"] - recs[0]["step"]
    scales = [v for _, v in points(recs, "loss_scale")]
    drops = [recs[i]["step"] for i in range(1, len(recs)) if finite(recs[i].get("loss_scale")) and
             finite(recs[i - 1].get("loss_scale")) and recs[i]["loss_scale"] < recs[i - 1]["loss_scale"]]
    frequent = skipped >= OVERFLOW_MIN and span and skipped >= OVERFLOW_SHARE * span
    collapsed = bool(scales) and min(scales) <= 1 and run.cfg("precision.loss_scale") == "dynamic"
    oscillating = len(drops) >= SCALE_DROPS_MIN and len(drops) >= SCALE_DROPS_SHARE * (len(recs) - 1)
    if not (frequent or collapsed or oscillating):
        return None
    ev = [f"{skipped} of {span} steps after the first log interval overflowed and were skipped "
          f"({100 * skipped / max(span, 1):.1f}%)",
          f"loss scale {scales[0]:,.0f} → {scales[-1]:,.0f} (min {min(scales):,.0f}); it dropped at {len(drops)} of "
          f"{len(recs) - 1} records (steps {steps_text(drops)})"]
    fp16 = run.cfg("precision.compute_dtype") == "float16"
    causes = (["float16 range: gradients or activations exceed 65504 or underflow"] if fp16 else
              ["non-finite gradients outside float16: a NaN source in the graph, not a range problem"])
    causes += [f"LR too high: weights and activations grow (train.lr = {g(run.cfg('train.lr'))})",
               f"loss-scale settings: init_scale {g(run.cfg('precision.init_scale'))}, scale_window "
               f"{run.cfg('precision.scale_window')}"]
    actions = (["--set precision.compute_dtype=bfloat16 (no loss scale needed)"] if fp16 else []) + [
        lr_actions(run)[0], f"ms-llm debug nan --run-dir {quoted(run.path)}",
        f"--set precision.scale_window={2 * run.cfg('precision.scale_window', 1000)} (fewer growth attempts)"]
    return [Finding("loss_scale", "warning", "frequent loss-scale overflows", ev, causes, actions, drops[:10])]


# --- 8. communication ----------------------------------------------------------------------------------

def rule_comm(run, found, _):
    pts = steady(run, "comm_frac")
    if not pts or statistics.median(v for _, v in pts) <= COMM_FRAC:
        return None
    med = statistics.median(v for _, v in pts)
    par = run.info.get("parallel") or {}
    ev = [f"median {100 * med:.0f}% of step time in communication over {len(pts)} records (rule of thumb: above "
          f"{100 * COMM_FRAC:.0f}% is a problem)",
          "layout: " + ", ".join(f"{k} {v}" for k, v in par.items()) if par else "layout: unknown"]
    causes = ["gradient all-reduce not hidden behind compute: too little compute per step (small micro batch)",
              "tensor (model) parallel across nodes: its per-layer collectives need the in-node links",
              f"small fusion buckets (parallel_config.gradient_aggregation_group = "
              f"{run.cfg('parallel_config.gradient_aggregation_group')})",
              "slow inter-node network (RoCE misconfigured, falling back to TCP)"]
    actions = [f"--set train.micro_batch_size={2 * run.cfg('train.micro_batch_size', 1)} or more accumulation "
               f"(more compute per all-reduce)", "keep parallel_config.model_parallel within one node (<= 8)",
               "--set parallel_config.gradient_aggregation_group=8", "ms-llm plan (estimated communication per device)"]
    return [Finding("communication", "warning", f"multi-card slowdown: {100 * med:.0f}% of step time communicating",
                    ev, causes, actions)]


# --- 9. memory -----------------------------------------------------------------------------------------

def rule_memory(run, found, limit):
    mems = points(run.train, "mem_gib")
    peak = max([v for _, v in mems] + ([run.final["peak_mem_gib"]] if finite(run.final.get("peak_mem_gib")) else []),
               default=None)
    if peak is None or not limit or peak < MEMORY_FRAC * limit:
        return None
    at = max(mems, key=lambda p: p[1])[0] if mems else None
    micro = run.cfg("train.micro_batch_size", 1)
    ev = [f"peak memory {peak:.2f} GiB" + (f" (step {at})" if at else "") + f" = {100 * peak / limit:.0f}% of the "
          f"{limit:.1f} GiB limit"]
    recompute = run.cfg("recompute_config.recompute") or run.cfg("recompute_config.select_recompute")
    sharded = run.cfg("parallel_config.optimizer_shard")
    causes = ["activations of the micro batch (grow with micro_batch_size x seq_length x hidden x layers)"
              + (" — recompute is already on" if recompute else ""),
              "weights, gradients and AdamW states (16 bytes per parameter in float32)"
              + (", already sharded" if sharded else ", replicated on every data-parallel rank"),
              "memory fragmentation close to the limit"]
    actions = ([] if recompute else
               ["recompute_config.recompute: true (or select_recompute: true for a cheaper partial recompute)"])
    actions += [] if sharded else ["parallel_config.optimizer_shard: true (AdamW states split over data-parallel "
                                   "ranks)"]
    actions.append(f"--set train.micro_batch_size={max(1, micro // 2)} (global batch kept: more accumulation)")
    return [Finding("memory", "warning", f"memory near the limit: {100 * peak / limit:.0f}%", ev, causes, actions,
                    [at] if at else [])]


# --- 10. gradients always clipped ----------------------------------------------------------------------

def rule_always_clipped(run, found, _):
    clip = run.cfg("train.clip_grad", 0)
    # only the stretch before a divergence or NaN: norms that grow with it are that finding's evidence
    stops = [found[k].steps[0] for k in ("divergence", "loss_nonfinite") if k in found and found[k].steps]
    gn = [v for s, v in points(run.train, "grad_norm") if not stops or s < min(stops)]
    if not clip or len(gn) < MIN_RECORDS:
        return None
    share = sum(v > clip for v in gn) / len(gn)
    med = statistics.median(gn)
    if share < CLIP_SHARE or med < CLIP_RATIO * clip:
        return None
    accum = run.accumulation
    ev = [f"grad_norm above train.clip_grad = {g(clip)} in {100 * share:.0f}% of {len(gn)} records; median "
          f"{g(med)} = {med / clip:.1f}x the clip",
          f"accumulation steps = global {run.cfg('train.global_batch_size')} / (micro "
          f"{run.cfg('train.micro_batch_size')} x data-parallel {run.data_parallel}) = {accum}"]
    causes = [f"clip_grad too small for this model: every update is rescaled (norms are routinely {g(med)})",
              "LR too high keeps the gradients large"]
    actions = [f"--set train.clip_grad={med:.2g} (about the typical norm) if the run is otherwise healthy"]
    if accum > 1:
        causes.insert(0, f"gradient accumulation without dividing the loss by the accumulation steps: norms come out "
                         f"{accum}x too large (accumulation = {accum})")
        actions.insert(0, f"compare with accumulation 1: --set train.global_batch_size="
                          f"{run.cfg('train.global_batch_size') // accum} for a few steps; a grad_norm about "
                          f"{accum}x smaller means the loss is not divided by the accumulation steps")
    return [Finding("always_clipped", "warning", "gradients always clipped", ev, causes, actions)]


# --- 11. stats.jsonl -----------------------------------------------------------------------------------

FLAG_TEXT = {
    "vanishing": ("vanishing gradients/activations", ["too small init or post-norm without residual scaling",
                                                      "dead activations (zero_frac high)", "LR far too low"],
                  ["check model.init_std and the layers named", "--set monitor.tensor_stats.every=50 to follow them"]),
    "exploding": ("exploding gradients/activations", ["LR too high", "no clipping", "float16 range"],
                  ["--set train.clip_grad=1.0", "lower train.lr", "--set train.anomaly=true to skip spikes"]),
    "dtype_mismatch": ("dtype mismatch", ["a parameter, gradient or optimizer state in an unexpected dtype "
                                          "(float16 master weights lose small updates)"],
                       ["keep master weights and optimizer states float32; check precision.compute_dtype casts"]),
    "grad_scale_mismatch": ("gradient scale mismatch", ["the loss is not divided by the accumulation steps "
                                                        "(gradient norm = accumulation x the mean loss's)",
                                                        "a custom loss that is not the mean over tokens"],
                            ["divide the loss by train.global_batch_size / (micro_batch_size x data_parallel)",
                             "compare with a run at accumulation 1"]),
}


def rule_stats(run, found, _):
    out = []
    for flag, (what, causes, actions) in FLAG_TEXT.items():
        recs = [r for r in run.stats if r.get("kind") == "flag" and r.get("flag") == flag]
        if recs:
            names = sorted({r.get("name", "?") for r in recs})
            ev = [f"{r.get('name')} at step {r.get('step')}: {r.get('detail', '')}".rstrip(": ") for r in recs[:10]]
            out.append(Finding(f"stats_{flag}", "warning", f"{what} in {len(names)} layer(s): "
                               f"{', '.join(names[:5])}" + (" ..." if len(names) > 5 else ""), ev, causes,
                               actions, sorted({r.get("step") for r in recs if isinstance(r.get("step"), int)})[:10]))
    bad = [r for r in run.stats if r.get("kind") != "flag" and finite(r.get("nonfinite")) and r["nonfinite"] > 0]
    if bad:
        first = min(bad, key=lambda r: r.get("step", 0))
        out.append(Finding("stats_nonfinite", "error", f"non-finite values first in {first.get('name')} "
                           f"({first.get('kind')}) at step {first.get('step')}",
                           [f"{r.get('name')} ({r.get('kind')}) step {r.get('step')}: {g(r['nonfinite'])} non-finite"
                            for r in bad[:10]], ["the first layer listed is where NaN/Inf enter"],
                           [f"ms-llm debug nan --run-dir {quoted(run.path)}"], [first.get("step")]))
    return out


# --- 12. events ----------------------------------------------------------------------------------------

def rule_events(run, found, _):
    out = []
    stops = [e for e in run.events if e.get("event") in ("preempted", "stop_at_step")]
    if stops:
        out.append(Finding("preemptions", "info", f"{len(stops)} stop(s): preemption or train.stop_at_step",
                           [f"step {e['step']}: {e['event']}" + (f" (signal {e.get('signal')})" if e.get("signal")
                                                                 else "") for e in stops],
                           ["a SIGTERM/SIGINT from the scheduler, or a planned time-boxed stop"],
                           ["resume with --resume (or checkpoint.auto_resume: true)"], [e["step"] for e in stops]))
    guard = [e for e in run.events if e.get("event") in ("anomaly_skip", "rollback")]
    if guard:
        out.append(Finding("anomalies", "warning", f"the anomaly guard acted {len(guard)} time(s)",
                           [f"step {e['step']}: {e['event']}" + (f" ({e.get('reason')})" if e.get("reason") else "")
                            for e in guard[:10]],
                           ["non-finite or spiking losses the guard skipped or rolled back (see the reasons)"],
                           [f"ms-llm debug nan --run-dir {quoted(run.path)}",
                            "inspect the batches at those steps"], [e["step"] for e in guard]))
    if not run.final:
        last = run.steps_done
        out.append(Finding("unfinished", "info", f"no final summary: still running, or crashed after step {last}",
                           [f"run_info.json has no 'final'; last logged step {last} of {run.max_steps}"],
                           ["the process is still running", "a crash or kill -9 (look at logs/)"],
                           ["resume with --resume once you know why it stopped"], [last]))
    if run.bad_lines:
        out.append(Finding("unreadable_lines", "info", f"{run.bad_lines} unreadable line(s) in metrics/stats",
                           ["a truncated last line is normal after a crash"], ["the process was killed mid-write"],
                           ["nothing to do unless many lines are affected"]))
    return out


RULES = [rule_nonfinite, rule_divergence, rule_not_falling, rule_labels, rule_spikes, rule_data_wait, rule_uneven,
         rule_low_mfu, rule_loss_scale, rule_comm, rule_memory, rule_always_clipped, rule_stats, rule_events]


def format_report(run_dir, run, findings):
    head = (f"diagnose {run_dir}: {len(run.train)} log records, {len(run.evals)} evaluations, "
            f"{len(run.events)} events, steps {run.steps_done}/{run.max_steps or '?'}")
    if not findings:
        return head + "\nno findings"
    lines = [head]
    for f in findings:
        lines += [f"\n[{f.severity}] {f.symptom}", "  evidence:"] + [f"    - {e}" for e in f.evidence]
        lines += ["  likely causes:"] + [f"    {i}. {c}" for i, c in enumerate(f.causes, 1)]
        lines += ["  actions:"] + [f"    - {a}" for a in f.actions]
    return "\n".join(lines)
