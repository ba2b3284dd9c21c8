"""Synthetic run directories for the report tests and its size/time benchmark: the files a training run
leaves (config.yaml, run_info.json, metrics.jsonl with the time fields and event records, telemetry.jsonl,
stats.jsonl), shaped like the quickstart, written fast enough for 100k steps."""
import json
import math
import os
import random

from ms_llm.config import load_config, save_config

START = 1_767_261_600.0  # 2026-01-01T10:00:00 UTC


def _clean(v):
    return str(v) if isinstance(v, float) and not math.isfinite(v) else v


def make_run(path, steps=2000, log_interval=10, seed=0, lr=1e-3, overrides=(), events=True, telemetry=True,
             stats_every=0, time_fields=True, spike_at=None, nan_at=None, profile=None, eval_interval=500,
             layers=4):
    """Write a run directory; returns its path. `spike_at`: a step whose loss jumps; `nan_at`: a step whose loss
    and grad norm are NaN; `profile`: (start, stop) of a profiled window (events + profile_top_ops)."""
    os.makedirs(path, exist_ok=True)
    cfg = load_config(None, ["model.vocab_size=66", f"model.num_layers={layers}", f"train.max_steps={steps}",
                             f"train.log_interval={log_interval}", f"train.lr={lr}", f"train.seed={seed}",
                             f"train.eval_interval={eval_interval}", *overrides])
    save_config(cfg, os.path.join(path, "config.yaml"))
    rng = random.Random(seed)
    recs, t, scale, skipped = [], START + 5.0, 65536.0, 0
    speed = 1.0 + lr * 300  # a higher learning rate falls faster at first
    for step in range(log_interval, steps + 1, log_interval):
        loss = 1.8 + 2.0 * math.exp(-step * speed / 250) + rng.gauss(0, 0.01)
        grad = 1.0 + step / steps + rng.gauss(0, 0.05)
        n_skip = 1 if step % 1000 == 0 else 0
        if n_skip:
            scale /= 2
        skipped += n_skip
        if step == spike_at:
            loss, grad = loss * 3, grad * 20
        if step == nan_at:
            loss, grad = math.nan, math.inf
        ms = 50.0 * (1 + rng.gauss(0, 0.03)) * (3 if profile and profile[0] <= step <= profile[1] else 1)
        t += ms / 1000 * log_interval
        r = {"step": step, "loss": loss, "lr": lr, "grad_norm": grad, "loss_scale": scale,
             "skipped_interval": n_skip, "skipped": skipped, "tokens_per_s": 768 / ms * 1000, "mfu": 0.3,
             "mem_gib": 0.7 + step / steps / 10, "data_wait_frac": abs(rng.gauss(0.01, 0.002))}
        if time_fields:
            r.update(time=round(t, 3), elapsed_s=round(t - START, 3), ms_per_step=ms,
                     eta_s=round((steps - step) * ms / 1000, 1))
        recs.append(r)
        if step % eval_interval == 0 or step == steps:
            recs.append({"step": step, "val_loss": loss + 0.05, "val_tokens": 111360})
        if events and step % 500 == 0:
            recs.append({"step": step, "event": "checkpoint", "path": f"checkpoints/rank_0/step_{step:08d}.ckpt"})
    if events:
        recs.append({"step": steps // 2, "event": "preempted", "signal": 15})
        recs.append({"step": steps // 2, "event": "resume", "from": f"step_{steps // 2:08d}.ckpt"})
    if nan_at:
        recs.append({"step": nan_at, "event": "nonfinite", "culprit": "layers.1.attn", "cause": "overflow"})
    if profile:
        recs += [{"step": profile[0], "event": "profile_start"}, {"step": profile[1], "event": "profile_stop"}]
    recs.sort(key=lambda r: r["step"])
    with open(os.path.join(path, "metrics.jsonl"), "w", encoding="utf-8") as f:
        f.writelines(json.dumps({k: _clean(v) for k, v in r.items()}) + "\n" for r in recs)
    info = {"start_time": "2026-01-01T10:00:00", "command": "ms-llm train", "host": "vm",
            "versions": {"python": "3.11.7", "mindspore": "2.10.0", "numpy": "1.26.4", "ms_llm": "0.1.0"},
            "platform": "Linux", "device": {"target": "CPU", "cpu_count": 2}, "git_revision": "abc123",
            "parallel": {"world_size": 1, "data_parallel": 1, "model_parallel": 1, "pipeline_stage": 1},
            "final": {"final_val_loss": 1.9, "steps": steps, "skipped_steps": skipped, "compile_s": 3.0,
                      "peak_mem_gib": 0.8, "parameters": 804224}}
    if profile:
        info["final"]["profile_top_ops"] = [{"op": f"Op{i}", "ms_per_step": 10.0 / i, "calls_per_step": i,
                                             "share": 0.3 / i} for i in range(1, 13)]
    with open(os.path.join(path, "run_info.json"), "w", encoding="utf-8") as f:
        json.dump(info, f)
    if telemetry:
        write_telemetry(path, t0=START, t1=t, seed=seed)
    if stats_every:
        write_stats(path, steps, stats_every, layers, seed)
    return str(path)


def write_telemetry(path, t0, t1, seed=0, interval=30.0):
    rng = random.Random(seed)
    n = max(2, int((t1 - t0) / interval))
    with open(os.path.join(path, "telemetry.jsonl"), "w", encoding="utf-8") as f:
        f.write(json.dumps({"time": t0, "event": "tool_missing", "tool": "npu-smi",
                            "detail": "npu-smi not found on PATH"}) + "\n")
        for i in range(n):
            f.write(json.dumps({"time": t0 + i * interval, "cpu_util_pct": 90 + rng.gauss(0, 3), "rss_gib": 0.7,
                                "load1": 2.0 + rng.random(), "load5": 2.0, "load15": 1.5,
                                "devices": [{"id": d, "temp_c": 40 + i % 7, "power_w": 70.0 + d, "util_pct": 80.0,
                                             "mem_used_mb": 3000.0 + 10 * i, "mem_total_mb": 65536.0}
                                            for d in range(2)],
                                "sample_ms": 2.0, "sample_cpu_ms": 1.0}) + "\n")


def write_stats(path, steps, every, layers, seed=0):
    rng = random.Random(seed)
    names = ["embedding"] + [f"layers.{i}" for i in range(layers)] + ["final_norm"]
    params = [f"layers.{i}.{p}" for i in range(layers) for p in ("attn.qkv.weight", "mlp.fc.weight")]
    with open(os.path.join(path, "stats.jsonl"), "w", encoding="utf-8") as f:
        for step in range(every, steps + 1, every):
            for j, n in enumerate(names):
                f.write(json.dumps({"step": step, "kind": "activation", "name": n, "mean": 0.0,
                                    "std": 1.0 + j * 0.2 + rng.random() * 0.05, "max_abs": 5.0, "norm": 30.0,
                                    "zero_frac": 0.0, "nonfinite": 0}) + "\n")
            for p in params:
                f.write(json.dumps({"step": step, "kind": "gradient", "name": p, "mean": 0.0, "std": 1e-3,
                                    "max_abs": 0.01, "norm": 0.1 * (1 + rng.random()), "zero_frac": 0.0,
                                    "nonfinite": 0}) + "\n")
                f.write(json.dumps({"step": step, "kind": "update_ratio", "name": p,
                                    "value": 1e-3 * (1 + rng.random())}) + "\n")
