"""The training loop: config → checks → data → model → compiled step → logs, evals, checkpoints.

Read top to bottom: `run()` is the whole story; helpers below it do one thing each.
"""
import os
import time

import numpy as np

from ms_llm.config import save_config
from ms_llm.errors import UserError
from ms_llm.monitor.metrics import MetricsWriter
from ms_llm.monitor.throughput import memory_gib, peak_memory_gib
from ms_llm.train import run_dir as rd
from ms_llm.train.context import rank0_int
from ms_llm.train.evaluate import evaluate
from ms_llm.train.session import agree, open_session


def run(cfg, run_dir=None, resume=False, config_path=None, echo=print):
    """Train as `cfg` says. Returns a summary dict (final val loss, steps, timings) on every rank."""
    dirs = {}

    def preflight(rt, log):
        dirs["run"] = run_dir or default_run_dir_all_ranks(rt, config_path)
        agree(rt, lambda: rd.check_run_dir(dirs["run"], resume))
        if resume:
            raise UserError("--resume is not available yet in this version: checkpoints are written but cannot be "
                            "resumed from. Start a new run with a new --run-dir.")

    s = open_session(cfg, echo, preflight)
    rt, log, model, step_fn, data, val = s.rt, s.log, s.model, s.step_fn, s.data, s.val
    run_dir, t, m = dirs["run"], cfg.train, cfg.model
    if rt.is_main:
        rd.create_run_dir(run_dir)
        save_config(cfg, os.path.join(run_dir, "config.yaml"))
        rd.write_json(os.path.join(run_dir, "run_info.json"), rd.run_info(rt, cfg, {"run_dir": os.path.abspath(run_dir)}))
    log(f"run directory: {run_dir}")
    from ms_llm.train.lr_schedule import lr_at

    n_params, flops_tok, peak, tokens_per_step = s.n_params, s.flops_per_token, s.peak_flops, s.tokens_per_step
    writer = MetricsWriter(run_dir, rt.rank, t.max_steps, cfg.monitor.summary, echo=log)
    bar = progress_bar(t.max_steps, cfg.monitor.progress_bar and rt.is_main)
    if bar is not None and rt.is_main:
        writer.echo = bar.write

    profiler = None
    if cfg.monitor.profile is not None:
        from ms_llm.monitor.profile import ProfileWindow

        p = cfg.monitor.profile
        out = p.output_dir or os.path.join(run_dir, "profile", f"rank_{rt.rank}")
        profiler = ProfileWindow(p.start_step, min(p.stop_step, t.max_steps), out, rt.device_target, log)

    pending, skipped, compile_s, val_loss = [], 0, None, None
    interval_start, paused, data.wait_s = time.perf_counter(), 0.0, 0.0
    try:
        for step in range(t.max_steps):
            if profiler is not None:
                profiler.before_step(step)
            t0 = time.perf_counter()
            pending.append(s.train_step())
            if compile_s is None:  # the first call compiles the graph: keep it out of the throughput figures
                pending[-1][0].asnumpy()
                compile_s = time.perf_counter() - t0
                log(f"compiled the training step in {compile_s:.1f} s")
                interval_start, paused, data.wait_s = time.perf_counter(), 0.0, 0.0
            done = step + 1
            if profiler is not None:
                profiler.after_step(done)
            if done % t.log_interval == 0 or done == t.max_steps:
                record, n_skipped = interval_record(pending, done, lr_at(step, t))
                skipped += n_skipped
                elapsed = time.perf_counter() - interval_start - paused  # evals and saves excluded
                steps_timed = len(pending) - (1 if done == len(pending) else 0)
                tok_s = tokens_per_step * steps_timed / elapsed if elapsed > 0 and steps_timed else 0.0
                record.update(skipped=skipped, tokens_per_s=tok_s,
                              mfu=flops_tok * tok_s / rt.world_size / peak, mem_gib=memory_gib(rt.device_target),
                              data_wait_frac=min(1.0, data.wait_s / elapsed) if elapsed > 0 else 0.0)
                if done == len(pending):
                    record["compile_s"] = compile_s
                writer.write(record)
                pending, interval_start, paused, data.wait_s = [], time.perf_counter(), 0.0, 0.0
            t_pause = time.perf_counter()
            if t.eval_interval and done % t.eval_interval == 0 and done != t.max_steps:
                val_loss = run_eval(model, s.eval_step, val, rt, done, m.seq_length, writer)
            if cfg.checkpoint.save_interval and done % cfg.checkpoint.save_interval == 0 and done != t.max_steps:
                save_checkpoint(run_dir, rt, model, step_fn, done, data, cfg)
            paused += time.perf_counter() - t_pause
            if bar is not None:
                bar.update(1)
        val_loss = run_eval(model, s.eval_step, val, rt, t.max_steps, m.seq_length, writer)
        path = save_checkpoint(run_dir, rt, model, step_fn, t.max_steps, data, cfg)
    finally:
        if profiler is not None and profiler.profiler is not None:
            profiler.finish(0)
        if bar is not None:
            bar.close()
        writer.close()
    digest = param_digest(model, n_params)
    if digest:
        log(f"parameter digest (rank {rt.rank}): {digest}")
    summary = {"final_val_loss": val_loss, "param_digest": digest, "steps": t.max_steps, "skipped_steps": skipped, "compile_s": compile_s,
               "peak_mem_gib": peak_memory_gib(rt.device_target), "run_dir": run_dir, "checkpoint": path,
               "parameters": n_params}
    if profiler is not None and profiler.table:
        summary["profile_top_ops"] = [{"op": op, "ms_per_step": ms_, "calls_per_step": c, "share": sh}
                                      for op, ms_, c, sh in profiler.table]
    if rt.is_main:
        info_path = os.path.join(run_dir, "run_info.json")
        info = __import__("json").load(open(info_path))
        info["final"] = summary
        rd.write_json(info_path, info)
    log(f"done: {t.max_steps} steps, final val_loss {val_loss:.4f}, checkpoint {path}")
    return summary


def param_digest(model, n_params, limit=200_000_000):
    """SHA-256 over all parameters in name order: equal digests = bit-identical replicas across ranks.
    Skipped for big models, where copying every weight to the host would take minutes."""
    if n_params > limit:
        return None
    import hashlib

    h = hashlib.sha256()
    for name, p in sorted(model.parameters_and_names(), key=lambda kv: kv[0]):
        h.update(name.encode())
        h.update(p.asnumpy().tobytes())
    return h.hexdigest()[:16]


def interval_record(pending, step, lr):
    """Reduce the step outputs of one log interval to a record (the only host sync in the interval)."""
    losses, norms, overflow, scale = [], [], [], None
    for loss, grad_norm, ovf, sc in pending:
        losses.append(float(loss.asnumpy()))
        norms.append(float(grad_norm.asnumpy()))
        overflow.append(bool(ovf.asnumpy()))
        scale = float(sc.asnumpy())
    clean = [n for n, o in zip(norms, overflow) if not o]
    record = {"step": step, "loss": float(np.mean(losses)), "lr": lr,
              "grad_norm": float(np.mean(clean)) if clean else float("nan"), "loss_scale": scale,
              "skipped_interval": int(sum(overflow))}
    return record, int(sum(overflow))


def run_eval(model, eval_step, batches, rt, step, seq_length, writer):
    val_loss = evaluate(model, eval_step, batches, rt)
    writer.write({"step": step, "val_loss": val_loss,
                  "val_tokens": len(batches) * int(batches[0].shape[0]) * seq_length * rt.world_size if batches else 0})
    return val_loss


def checkpoint_tensors(model, step_fn):
    tensors = dict(model.parameters_and_names())
    opt = step_fn.optimizer
    for p, m_, v in zip(opt.params, opt.exp_avg, opt.exp_avg_sq):
        tensors[m_.name], tensors[v.name] = m_, v
    st = step_fn.state
    for p in (opt.step, st.loss_scale, st.good_steps, st.global_step):
        tensors[p.name] = p
    return tensors


def save_checkpoint(run_dir, rt, model, step_fn, step, data, cfg):
    """Data-parallel ranks hold identical state: rank 0 alone writes it."""
    from ms_llm.checkpoint import store

    directory = store.rank_dir(run_dir, 0)
    if rt.is_main:
        meta = {"consumed_samples": data.consumed, "epoch": data.epoch, "world_size": rt.world_size}
        store.save(directory, step, checkpoint_tensors(model, step_fn), meta, cfg.checkpoint.keep_last)
    return os.path.join(directory, f"step_{step:08d}.ckpt")


def default_run_dir_all_ranks(rt, config_path):
    """runs/<config>-<time>, the same on every rank (rank clocks can straddle a second)."""
    import datetime

    stamp = rank0_int(rt, int(time.time()))
    stem = os.path.splitext(os.path.basename(config_path))[0] if config_path else "run"
    return os.path.join("runs", f"{stem}-{datetime.datetime.fromtimestamp(stamp):%Y%m%d-%H%M%S}")


def progress_bar(total, enabled):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="step", dynamic_ncols=True, disable=None, leave=False)
