"""MindFormers' training log (MFLossMonitor in mindformers/core/callback/callback.py), read into ms_llm's records.

The line, after the logger's prefix ('2025-06-04 10:00:00,123 - mindformers[mindformers/core/callback/callback.py:
485] - INFO - ' on the console and msrun's worker_K.log; '[INFO] 2025-06-04 10:00:00,123 [mindformers/core/callback/
callback.py:485] print_output_info: ' in output/log/rank_K/info.log), one per logged step and rank:

  2023-09 on:  { Epoch:[  1/  2], step:[   10/  500], loss: 10.123, per_step_time: 1234ms, lr: 5e-05,
               overflow cond: False, loss_scale: 65536.0        (sink mode; 'loss:[10.123/10.456]' is the step's
                                                                  loss / the mean so far, outside sink mode)
  2024-06 on:  ..., global_norm: [1.2345]
  2024-10 on:  ..., train_throughput_per_npu: 123.456T            (when the model's FLOPs can be computed)
  2023-03 to 2023-09:  Epoch:[  0/  2], step:[   10/  500], loss:[10.123/10.456], time:1234.567 ms, lr:5e-05,
               overflow cond: False, loss_scale: 65536.0        (the epoch counted from 0 before 2023-03-28)
followed by the progress line '  2.0% |█         | 1.2345 samples/s/p  0:10:00 }'.

The step printed is the step within the epoch: the global step is step + (epoch - 1) x steps per epoch.
What a field means:
  loss           the logged step's loss, divided by the micro-batches and accumulation steps; under pipeline
                 parallelism only the last stage computes it ('pipeline stages: N > 1, the loss on the last card is
                 valid'): the other stages print 0.000, a placeholder.
  overflow cond  True: the step's gradients overflowed and the update was skipped (dynamic loss scale).
  loss_scale     'unavailable' without a loss-scale cell.
  lr             left out when the learning rate cannot be computed (a schedule on CPU, a custom function).
  global_norm    None (2024-06 on) when the wrapper returns no norm.
The skip-on-global-norm monitor (TrainingStateMonitor, 2025-04 on) logs 'opt_global_step: S,
skip_data_grad_norm_threshold: T, is_skip: True', 'Current global norm G of step N has been K consecutive times
greater than threshold: T' and stops with '... has been K consecutive times greater than threshold T, stop
training...'; check_for_global_norm logs '... is greater equal than threshold T, stop training...'; the NaN check
stops with 'device_accum_local_loss is ..., loss is nan, ..., terminate training.'
"""
import os
import re

from ms_llm.rundir.foreign.logtext import begins_any, number
from ms_llm.rundir.foreign.parsed import Parsed

NAME, TITLE = "mindformers", "MindFormers"
HEAD = re.compile(r"\{?\s*Epoch:\[\s*(\d+)/\s*(\d+)\],\s*step:\[\s*(\d+)/\s*(\d+)\],\s*")
LOSS = re.compile(r"^loss:\s*(?:\[\s*([^\s/\],]+)\s*/\s*([^\s\],]+)\s*\]|([^\s,]+))\s*(?:,|$)")
KEYS = ("per_step_time", "time", "lr", "overflow cond", "loss_scale", "global_norm", "train_throughput_per_npu")
KEY = re.compile(r"(?:^|,\s*)(" + "|".join(re.escape(k) for k in KEYS) + r"):\s*")
PROGRESS = re.compile(r"^\s*([\d.]+)% \|.*?\|\s*([\d.]+) samples/s/p\s+(\S+)\s*\}?\s*$")
PIPELINE = re.compile(r"pipeline stages: (\d+) > 1, the loss on the last card is valid")
SKIP_AT = re.compile(r"opt_global_step: (\d+), skip_data_grad_norm_threshold: (\S+), is_skip: (.*)$")
SPIKE = re.compile(r"Current global norm (\[?[^\]]*?\]?) of step (\d+) has been (\d+) consecutive times "
                   r"(?:greater|smaller) than threshold:? ([\d.eE+-]+)(,? stop training)?")
NORM_STOP = re.compile(r"Current global norm (\[?[^\]]*?\]?) is greater equal than threshold ([\d.eE+-]+), stop")
NORM_GOON = re.compile(r"The global norm (\[?[^\]]*?\]?) of step (\d+) is still greater or equal than threshold "
                       r"([\d.eE+-]+), continue training")
NAN_STOP = re.compile(r"device_accum_local_loss is .*?, loss is (\S+?), .*terminate training")
RESUME = re.compile(r"Start resume training from checkpoint|dataset skip (\d+) steps|resume(?:d)? .*step[: ]+(\d+)",
                    re.I)
OVER = re.compile(r"\.{3,}Training Over!")
VERSION = re.compile(r"mindformers(?: version|==|\s+)\s*v?(\d+\.\d+(?:\.\d+)?\S*)", re.I)
SIGNATURES = (HEAD, re.compile(r"per_step_time: \d+ms"))
ABSENT = {
    "tokens_per_s": "the log does not carry the sequence length and global batch (give the YAML beside the log)",
    "mfu": "MindFormers prints the model's TFLOPS per NPU (train_throughput_per_npu), not the share of its peak",
    "mem_gib": "MindFormers' loss line has no memory field",
    "data_wait_frac": "MindFormers' loss line has no data-wait field",
    "val_loss": "no evaluation line (do_eval off)",
    "grad_norm": "this MindFormers version prints no global_norm (2024-06 on), or the wrapper returned none",
    "lr": "MindFormers could not compute the LR on this device (it prints none then)",
}


def starts(text):
    return bool(HEAD.search(text))


def complete(text):
    m = HEAD.search(text)
    if not m:
        return True
    tail = text[m.end():].rstrip()
    if tail.endswith(","):
        return False
    return bool(re.search(r"(loss_scale: \S+|global_norm: \S+|train_throughput_per_npu: [\d.]+T|\})$", tail)) and \
        "loss_scale:" in tail


def begins_line(text):
    return begins_any(text) or bool(HEAD.search(text)) or bool(PROGRESS.match(text))


def parse_train(text, whole):
    """(record, epoch, epochs, step in epoch, steps per epoch) of a loss line."""
    m = HEAD.search(text)
    epoch, epochs, step, per_epoch = (int(x) for x in m.groups())
    body = text[m.end():].rstrip().rstrip("}").rstrip()
    rec = {}
    lm = LOSS.match(body)
    if lm and not whole and lm.end() >= len(body):
        lm = None  # the loss is the cut line's last field: it may be partial ('6.04' of '6.049')
    if lm:
        rec["loss"] = number(lm.group(1) or lm.group(3))
        if lm.group(2):
            rec["loss_mean_so_far"] = number(lm.group(2))
        body = body[lm.end():].lstrip()
    parts = [(mm.group(1), mm.end(), mm.start()) for mm in KEY.finditer(body)]
    values = {}
    for i, (key, start, _) in enumerate(parts):
        end = parts[i + 1][2] if i + 1 < len(parts) else len(body)
        if i + 1 == len(parts) and not whole:
            break  # the last field of a cut line may be partial
        values[key] = body[start:end].strip().rstrip(",")
    if "per_step_time" in values:
        rec["ms_per_step"] = number(values["per_step_time"].rstrip("ms"))
    elif "time" in values:
        rec["ms_per_step"] = number(values["time"].replace("ms", ""))
    if "lr" in values:
        rec["lr"] = number(values["lr"])
    if "overflow cond" in values:
        rec["skipped_interval"] = int("true" in values["overflow cond"].lower())
    if "loss_scale" in values and number(values["loss_scale"]) is not None:
        rec["loss_scale"] = number(values["loss_scale"])
    if "global_norm" in values and number(values["global_norm"]) is not None:
        rec["grad_norm"] = number(values["global_norm"])
    if "train_throughput_per_npu" in values:
        rec["tflops"] = number(values["train_throughput_per_npu"].rstrip("T"))
    return {k: v for k, v in rec.items() if v is not None}, epoch, epochs, step, per_epoch, set(values)


def read(lines, counts):
    p = Parsed(TITLE, counts=counts, absent=dict(ABSENT))
    order = 0
    last = {}
    pipeline = False
    zero_based = False
    for line in lines:
        text = line.text
        order += 1
        m = HEAD.search(text)
        if m and ("loss" in text[m.end():m.end() + 6]):
            rec, epoch, epochs, step, per_epoch, keys = parse_train(text, not line.last)
            p.features.update(keys)
            if epoch == 0:
                zero_based = True
            e = epoch + 1 if zero_based else epoch
            rec = {"step": step + (e - 1) * per_epoch, "epoch": e, **rec}
            p.info["max_steps"] = epochs * per_epoch
            p.info["steps_per_epoch"] = per_epoch
            p.train.append((line.rank, order, rec))
            last[line.rank] = rec
            counts["training lines"] += 1
            continue
        m = PROGRESS.match(text)
        if m:
            rec = last.get(line.rank)
            if rec is not None and "samples_per_s_per_device" not in rec:
                rec["samples_per_s_per_device"] = float(m.group(2))
            continue
        if PIPELINE.search(text):
            pipeline = True
            p.info["pipeline_stages"] = int(PIPELINE.search(text).group(1))
            continue
        m = SPIKE.search(text)
        if m:
            norm, thr, n = number(m.group(1)), m.group(4), int(m.group(3))
            reason = (f"MindFormers skipped the step: global norm {norm:g} >= {thr} (use_skip_data_by_global_norm), "
                      f"{n} in a row")
            if m.group(5):
                reason += "; it stopped training there"
            p.events.append((line.rank, order, {"step": int(m.group(2)), "event": "anomaly_skip", "reason": reason,
                                                "global_norm": norm}))
            if m.group(5):
                p.events.append((line.rank, order, {"step": int(m.group(2)), "event": "halted", "reason": reason}))
            continue
        m = SKIP_AT.search(text)
        if m:  # the step's own line follows ('Current global norm ... of step N'); the optimizer's count is N-1
            continue
        m = NORM_STOP.search(text)
        if m:
            rec = last.get(line.rank)
            p.events.append((line.rank, order, {"step": (rec["step"] if rec else 0), "event": "halted",
                                                "reason": f"global norm {m.group(1)} above the threshold "
                                                          f"{m.group(2)} (check_for_global_norm)",
                                                "detail": text.strip()[:300]}))
            continue
        m = NORM_GOON.search(text)
        if m:
            p.events.append((line.rank, order, {"step": int(m.group(2)), "event": "anomaly_skip",
                                                "reason": f"global norm {m.group(1)} >= {m.group(3)} again after "
                                                          f"MindFormers' restart (check_for_global_norm)"}))
            continue
        m = NAN_STOP.search(text)
        if m:
            rec = last.get(line.rank)
            p.events.append((line.rank, order, {"step": (rec["step"] if rec else 0), "event": "nonfinite",
                                                "detail": text.strip()[:300]}))
            p.events.append((line.rank, order, {"step": (rec["step"] if rec else 0), "event": "halted",
                                                "reason": "MindFormers' NaN check (check_for_nan_in_loss_and_grad)"}))
            continue
        if OVER.search(text):
            p.ended = True
            continue
        m = VERSION.search(text)
        if m and "version" not in p.info:
            p.info["version"] = f"MindFormers {m.group(1)}"
        counts["other lines (not metrics)"] += 1
    if pipeline:
        for _, _, rec in p.train:
            if rec.get("loss") == 0.0:
                rec["loss"] = None
                rec["loss_note"] = "a pipeline stage without the loss prints 0"
                counts["placeholder losses of pipeline stages without the loss"] += 1
    p.info.setdefault("version", version(p.features, zero_based))
    return p


def version(features, zero_based):
    if "train_throughput_per_npu" in features:
        return "MindFormers 2024-10 or later (throughput per NPU)"
    if "global_norm" in features:
        return "MindFormers 2024-06 or later (global_norm)"
    if "per_step_time" in features:
        return "MindFormers 2023-09 to 2024-06 ({ Epoch ... per_step_time)"
    if "time" in features:
        return "MindFormers 2023-03 to 2023-09 (time: ms)" + (", epoch from 0 (before 2023-03-28)"
                                                              if zero_based else "")
    return ""


# --- the YAML beside the log → ms_llm's config ----------------------------------------------------------

def find_yaml(paths):
    """A MindFormers config beside the logs (the folder, then up to two folders above it)."""
    from ms_llm.config.foreign import looks_like_mindformers
    import yaml

    seen = set()
    for path in paths:
        d = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
        for _ in range(3):
            if d in seen:
                break
            seen.add(d)
            for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
                if name.endswith((".yaml", ".yml")):
                    full = os.path.join(d, name)
                    try:
                        with open(full, encoding="utf-8") as f:
                            raw = yaml.safe_load(f)
                    except (OSError, yaml.YAMLError, UnicodeDecodeError):
                        continue
                    if looks_like_mindformers(raw, full):
                        return full, raw
            d = os.path.dirname(d)
    return None, None


def config_from_yaml(path, raw, steps_per_epoch=None, devices=None):
    """(ms_llm config dict, notes) through the MindFormers config import (ms_llm/interop/mindformers/). The log's
    steps per epoch give the dataset's samples (x the global batch), which the import needs for the run length
    and a warmup_ratio."""
    from ms_llm.errors import UserError
    from ms_llm.interop.mindformers.config import import_config

    try:
        ours, rows, _ = import_config(raw, None, devices, f"'{path}'")
        gbs = (ours.get("train") or {}).get("global_batch_size")
        if steps_per_epoch and gbs:
            ours, rows, _ = import_config(raw, steps_per_epoch * gbs, devices, f"'{path}'")
    except UserError as e:
        return {}, [f"{path}: not read as a MindFormers config ({e})"]
    except Exception as e:  # noqa: BLE001 (a config the import cannot map leaves the run without one, not broken)
        return {}, [f"{path}: the MindFormers config import failed ({type(e).__name__}: {e})"]
    odd = [r for r in rows if r.status in ("NOT SUPPORTED", "unknown")]
    notes = [f"{len(odd)} key(s) of {os.path.basename(path)} have no ms_llm equivalent (ms-llm convert "
             f"--from-mindformers-config lists them)"] if odd else []
    return ours, notes
