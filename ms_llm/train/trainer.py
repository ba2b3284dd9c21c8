"""The training loop: config → checks → data → model → compiled step → logs, evals, checkpoints.

Read `run()` top to bottom: it is the whole story; the helpers below it do one thing each.
"""
import json
import os
import shutil
import time

import numpy as np

from ms_llm.checkpoint import state as ckpt_state
from ms_llm.checkpoint import store
from ms_llm.checkpoint.saver import CheckpointSaver
from ms_llm.config import save_config
from ms_llm.errors import UserError
from ms_llm.monitor.metrics import MetricsWriter
from ms_llm.monitor.throughput import memory_gib, peak_memory_gib
from ms_llm.train import run_dir as rd
from ms_llm.train.compile_cache import CacheMismatch
from ms_llm.train.context import all_ranks_ok, rank0_int
from ms_llm.train.evaluate import evaluate
from ms_llm.train.preemption import Preemption
from ms_llm.train.session import agree, open_session
from ms_llm.train.skipped_steps import RunHalted, SkippedSteps


def run(cfg, run_dir=None, resume=False, config_path=None, echo=print, weights_only=False):
    """Train as `cfg` says (resuming `run_dir` when asked). Returns a summary dict on every rank."""
    plan = {}

    def preflight(rt, log, parallel):
        # semi-auto parallel ranks hold different shards: each saves its own; data-parallel replicas share rank 0's
        plan["ckpt_rank"] = rt.rank if parallel.semi_auto else 0
        plan["run_dir"] = run_dir or default_run_dir_all_ranks(rt, config_path)
        if cfg.checkpoint.strategy_dir is None:  # semi-auto parallel strategy files live with the run
            cfg.checkpoint.strategy_dir = os.path.join(plan["run_dir"], "strategy")
        if cfg.checkpoint.remote_dir:
            agree(rt, lambda: check_remote(cfg.checkpoint))
        plan["resume"] = resume or (cfg.checkpoint.auto_resume and
                                    has_checkpoints(plan["run_dir"], plan["ckpt_rank"], rt, cfg, log))
        agree(rt, lambda: rd.check_run_dir(plan["run_dir"], plan["resume"]))
        if plan["resume"]:
            agree(rt, lambda: plan.update(checkpoint=find_checkpoint(plan["run_dir"], plan["ckpt_rank"], log)))

    start = plan_start = 0  # the step this process starts at (0, or the resumed checkpoint's)
    s = open_session(cfg, echo, preflight)
    rt, log, t = s.rt, s.log, cfg.train
    run_dir = plan["run_dir"]
    host = {"skipped": 0, "pending": []}
    if plan["resume"]:
        start, host = resume_from(s, plan["checkpoint"], weights_only, log)
        plan_start = start
    elif cfg.checkpoint.load_weights:
        load_initial_weights(s, cfg.checkpoint.load_weights, log)
    s.fresh_start = not plan["resume"] and not cfg.checkpoint.load_weights
    if rt.is_main:
        rd.create_run_dir(run_dir)
        if plan["resume"]:
            keep_metrics_until(run_dir, start)
        name = f"config.resume_{start}.yaml" if plan["resume"] else "config.yaml"
        save_config(cfg, os.path.join(run_dir, name))
        info = os.path.join(run_dir, "run_info.json")
        if not os.path.isfile(info):
            rd.write_json(info, rd.run_info(rt, cfg, {"run_dir": os.path.abspath(run_dir)}))
    log(f"run directory: {run_dir}" + (f" (resuming at step {start})" if plan["resume"] else ""))
    from ms_llm.train.lr_schedule import lr_at

    saver = CheckpointSaver(run_dir, plan["ckpt_rank"], cfg.checkpoint, log)
    saves = rt.is_main or s.plan.semi_auto
    writer = MetricsWriter(run_dir, rt.rank, t.max_steps, cfg.monitor.summary, echo=log)
    bar = progress_bar(t.max_steps, start, cfg.monitor.progress_bar and rt.is_main)
    if bar is not None:
        writer.echo = bar.write
    profiler = make_profiler(cfg, rt, run_dir, t, log)
    nan_watch, tensor_stats = make_watches(s, run_dir)
    nonfinite_run = 0  # consecutive steps with non-finite gradients (anomaly guard)
    skips, unchecked = SkippedSteps(cfg.precision), []
    skips.resume(float(s.step_fn.state.loss_scale.asnumpy()))
    check_every = min(t.log_interval, 8)  # a host sync every few steps, not every step

    def save(step):
        strategy = os.path.join(cfg.checkpoint.strategy_dir or "", f"strategy_rank_{rt.rank}.ckpt")
        if s.plan.semi_auto and os.path.isfile(strategy):  # the layout travels with the shards it describes
            os.makedirs(saver.directory, exist_ok=True)
            shutil.copy2(strategy, saver.directory)
        if saves:
            host_state = {"skipped": host["skipped"], "pending": [as_floats(o) for o in host["pending"]]}
            saver.save(step, ckpt_state.capture(s), ckpt_state.describe(s, step, host_state))

    pending, compile_s, val_loss, preempted, timed = host["pending"], None, None, None, 0
    interval_start, paused, s.data.wait_s = time.perf_counter(), 0.0, 0.0
    with Preemption(log) as preemption:
        try:
            for step in range(start, t.max_steps):
                if profiler is not None:
                    profiler.before_step(step)
                try:
                    batches = s.next_batches()
                except UserError as e:
                    raise UserError(f"step {step + 1}, {e}") from None
                probing = tensor_stats is not None and tensor_stats.due(step)
                if probing:
                    tensor_stats.before_step(s, step, batches)
                t0 = time.perf_counter()
                try:
                    out = s.train_step(batches)
                except CacheMismatch as e:  # only a fresh start checks it: starting over loses nothing
                    log(f"warning: {e}")
                    s = open_session(cfg, echo, rt=rt, compile_cache=False)
                    batches = s.next_batches()
                    t0 = time.perf_counter()
                    out = s.train_step(batches)
                pending.append(out)
                if compile_s is None:  # the first call compiles the graph: keep it out of the throughput figures
                    pending[-1][0].asnumpy()
                    compile_s = time.perf_counter() - t0
                    log(f"compiled the training step in {compile_s:.1f} s")
                    interval_start, paused, s.data.wait_s = time.perf_counter(), 0.0, 0.0
                else:
                    timed += 1
                done = step + 1
                if nan_watch is not None:
                    nan_watch.after_step(s, step, out, batches, writer)
                if probing:
                    tensor_stats.after_step(s, step, out)
                if t.anomaly is not None:
                    nonfinite_run = guard(s, out, done, nonfinite_run, run_dir, plan["ckpt_rank"], writer, log)
                if profiler is not None:
                    profiler.after_step(done)
                unchecked.append((done, out))
                if done % check_every == 0 or done == t.max_steps:
                    halt = None
                    for n, o in unchecked:
                        halt = halt or skips.update(n, int(o[2].asnumpy()), float(o[3].asnumpy()))
                    unchecked.clear()
                    if halt:
                        save(done)
                        saver.close()
                        writer.write({"step": done, "event": "halted", "reason": halt, "since_step": skips.first})
                        raise RunHalted(halted_message(done, skips, halt, run_dir, saver, t.anomaly is not None))
                if done % t.log_interval == 0 or done == t.max_steps:
                    lr = lr_at(step, t) * float(s.step_fn.state.lr_scale.asnumpy())  # lowered by rollbacks
                    record, n_skipped = interval_record(pending, done, lr)
                    host["skipped"] += n_skipped
                    elapsed = time.perf_counter() - interval_start - paused  # evals and saves excluded
                    tok_s = s.tokens_per_step * timed / elapsed if elapsed > 0 and timed else 0.0
                    record.update(skipped=host["skipped"], tokens_per_s=tok_s,
                                  mfu=s.flops_per_token * tok_s / rt.world_size / s.peak_flops,
                                  mem_gib=memory_gib(rt.device_target),
                                  data_wait_frac=min(1.0, s.data.wait_s / elapsed) if elapsed > 0 else 0.0)
                    if done - plan_start <= t.log_interval:
                        record["compile_s"] = compile_s
                    writer.write(record)
                    pending.clear()
                    interval_start, paused, s.data.wait_s, timed = time.perf_counter(), 0.0, 0.0, 0
                t_pause = time.perf_counter()
                if t.eval_interval and done % t.eval_interval == 0 and done != t.max_steps:
                    val_loss = run_eval(s, done, writer)
                stop = preemption_agreed(rt, preemption) or done == t.stop_at_step
                if stop or (cfg.checkpoint.save_interval and done % cfg.checkpoint.save_interval == 0
                            and done != t.max_steps):
                    save(done)
                paused += time.perf_counter() - t_pause
                if bar is not None:
                    bar.update(1)
                if stop:
                    preempted = done
                    writer.write({"step": done, "event": "preempted" if preemption.requested else "stop_at_step",
                                  "signal": preemption.signum or 0})
                    log(f"stopped at step {done} ({'signal' if preemption.requested else 'train.stop_at_step'}); "
                        f"checkpoint saved. Resume with --resume (or checkpoint.auto_resume: true).")
                    break
            if preempted is None:
                val_loss = run_eval(s, t.max_steps, writer)
                save(t.max_steps)
            saver.close()
            saver.upload()
        finally:
            if profiler is not None and profiler.profiler is not None:
                profiler.finish(0)
            if bar is not None:
                bar.close()
            writer.close()
    return finish(s, run_dir, preempted or t.max_steps, val_loss, host["skipped"], compile_s, profiler, saver, log)


def halted_message(step, skips, reason, run_dir, saver, anomaly_guard):
    tried = "dynamic loss scaling" if skips.dynamic else "skipping the non-finite updates"
    if anomaly_guard:
        tried += " and the anomaly guard's rollbacks"
    return (f"training stopped at step {step}: every update since step {skips.first} was skipped; {reason}. Tried: "
            f"{tried}. No update was applied after step {skips.first - 1}, so the checkpoint just saved "
            f"({saver.last_path or 'see ' + run_dir + '/checkpoints'}) holds the last good weights. Find the first "
            f"module that goes non-finite with `ms-llm debug nan --run-dir {run_dir} --step {step}` (it replays the "
            f"next step from that checkpoint); docs/debugging.md walks the rest.")


def dry_run(cfg, echo=print):
    """Check and compile everything a run would, without training or writing a run directory.

    On an Ascend host with `MS_SIMULATION_LEVEL=1` (msrun --sim_level=1) this compiles the sharded graph of
    one rank without touching a device: the way to verify a layout before queueing a cluster job."""
    s = open_session(cfg, echo, purpose="dry_run")
    s.log(s.plan.table())
    batch = next(s.data)
    t0 = time.perf_counter()
    if s.cache is None:
        for cell in s.step_cells:
            cell.compile(batch)
    if s.cache is not None:
        s.cache.check_binding(s.step_cells, [batch] * len(s.step_cells), s.log)
    s.log(f"dry run: training step compiled in {time.perf_counter() - t0:.1f} s; nothing was trained or written")
    return s


def finish(s, run_dir, steps, val_loss, skipped, compile_s, profiler, saver, log):
    rt = s.rt
    digest = param_digest(s.model, s.n_params)
    if digest:
        log(f"parameter digest (rank {rt.rank}): {digest}")
    summary = {"final_val_loss": val_loss, "param_digest": digest, "steps": steps, "skipped_steps": skipped,
               "compile_s": compile_s, "peak_mem_gib": peak_memory_gib(rt.device_target), "run_dir": run_dir,
               "checkpoint": saver.last_path, "parameters": s.n_params}
    if profiler is not None and profiler.table:
        summary["profile_top_ops"] = [{"op": op, "ms_per_step": ms_, "calls_per_step": c, "share": sh}
                                      for op, ms_, c, sh in profiler.table]
    if rt.is_main:
        info_path = os.path.join(run_dir, "run_info.json")
        with open(info_path, encoding="utf-8") as f:
            info = json.load(f)
        info["final"] = summary
        rd.write_json(info_path, info)
        saver.upload()
    val = f"{val_loss:.4f}" if val_loss is not None else "n/a"
    if steps == s.cfg.train.max_steps:
        log(f"done: {steps} steps, final val_loss {val}, checkpoint {saver.last_path}")
    else:
        log(f"stopped after step {steps} of {s.cfg.train.max_steps}; last val_loss {val}; checkpoint {saver.last_path}")
    return summary


# --- resuming -------------------------------------------------------------------------------------------

def has_checkpoints(run_dir, ckpt_rank, rt, cfg, log):
    """Local checkpoints exist, or remote ones were pulled into the (empty) local run dir."""
    directory = store.rank_dir(run_dir, ckpt_rank)
    if store.list_checkpoints(directory):
        return True
    if cfg.checkpoint.remote_dir and ckpt_rank == rt.rank:
        from ms_llm.checkpoint import remote
        from ms_llm.checkpoint.saver import pull_newest

        up = remote.make_uploader(cfg.checkpoint.remote_dir, cfg.checkpoint.uploader)
        remote.check_remote_readable(up, cfg.checkpoint.remote_dir)
        pull_newest(cfg.checkpoint.remote_dir, up, run_dir, ckpt_rank, log)
    return all_ranks_ok(rt, bool(store.list_checkpoints(directory))) if rt.world_size > 1 else \
        bool(store.list_checkpoints(directory))


def check_remote(ckpt_cfg):
    from ms_llm.checkpoint import remote

    remote.check_remote_readable(remote.make_uploader(ckpt_cfg.remote_dir, ckpt_cfg.uploader), ckpt_cfg.remote_dir)


def find_checkpoint(run_dir, ckpt_rank, log):
    directory = store.rank_dir(run_dir, ckpt_rank)
    step, manifest = store.newest_valid(directory, warn=log)
    if step is None:
        raise UserError(f"no usable checkpoint in {directory} to resume from. Nothing was changed; start a new run "
                        f"with another --run-dir, or drop --resume.")
    return store.checkpoint_path(directory, manifest), manifest


def resume_from(s, checkpoint, weights_only, log):
    path, manifest = checkpoint
    changed = ckpt_state.check_compatible(s.cfg, manifest, path)
    if changed:
        log("note: resuming with changed settings: " + "; ".join(changed))
    ckpt_state.restore(s, store.read_tensors(path), path, weights_only, warn=log)
    step = manifest["step"]
    if not weights_only:
        ckpt_state.restore_host_rng(manifest)
    s.data.seek(manifest["consumed_samples"])
    if s.cfg.model.dropout > 0:
        log("note: dropout > 0: masks after the resume differ from an uninterrupted run (MindSpore's CPU dropout "
            "kernel state is not checkpointable); everything else continues exactly")
    log(f"resumed from {path}: step {step}, {manifest['consumed_samples']:,} samples consumed "
        f"(epoch {manifest['epoch']})")
    host = manifest.get("host") or {}
    return step, {"skipped": host.get("skipped", 0), "pending": [tuple(x) for x in host.get("pending", [])]}


def load_initial_weights(s, path, log):
    if not os.path.isfile(path):
        raise UserError(f"checkpoint.load_weights = '{path}' does not exist. Give a .ckpt or .safetensors file "
                        f"(e.g. from `ms-llm convert`).")
    try:
        arrays = store.read_tensors(path)
    except Exception as e:
        raise UserError(f"checkpoint.load_weights = '{path}' cannot be read ({type(e).__name__}): not a MindSpore "
                        f"or safetensors checkpoint, or truncated.") from None
    ckpt_state.restore(s, arrays, path, weights_only=True, warn=lambda *_: None)
    log(f"initialised model weights from {path}")


def keep_metrics_until(run_dir, step):
    """Records after the resumed checkpoint are superseded by the rerun: set them aside, keep the rest."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        return
    keep, drop = [], []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                (keep if json.loads(line).get("step", 0) <= step else drop).append(line)
            except json.JSONDecodeError:  # a line cut by a crash mid-write
                drop.append(line)
    if drop:
        with open(os.path.join(run_dir, "metrics.superseded.jsonl"), "a", encoding="utf-8") as f:
            f.writelines(drop)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(keep)
    os.replace(tmp, path)


# --- per-step helpers ------------------------------------------------------------------------------------

def make_watches(s, run_dir):
    from ms_llm.debug.watch import NanWatch, TensorStats

    mon = s.cfg.monitor
    nan = NanWatch(run_dir, s.rt.rank, s.cfg.model.vocab_size, s.cfg.precision.compute_dtype, s.log) \
        if mon.nan_check else None
    st = TensorStats(mon.tensor_stats, run_dir, s.rt.rank, s.rt.world_size, s.log) if mon.tensor_stats else None
    return nan, st


def guard(s, out, done, nonfinite_run, run_dir, ckpt_rank, writer, log):
    """Anomaly guard, host side: log each skipped update; after `max_nonfinite` consecutive non-finite
    steps, roll back to the newest checkpoint and lower the learning rate."""
    a = s.cfg.train.anomaly
    code = int(out[2].asnumpy())
    if code == 2:
        writer.write({"step": done, "event": "anomaly_skip", "reason": "grad norm or loss z-score > "
                      f"{a.zscore:g}", "loss": float(out[0].asnumpy()), "grad_norm": float(out[1].asnumpy())})
    nonfinite_run = nonfinite_run + 1 if code == 1 else 0
    if nonfinite_run < a.max_nonfinite:
        return nonfinite_run
    import mindspore as ms

    directory = store.rank_dir(run_dir, ckpt_rank)
    step, manifest = store.newest_valid(directory, warn=log)
    if step is None:
        log(f"warning: {nonfinite_run} consecutive non-finite steps and no checkpoint to roll back to; continuing")
        return 0
    path = store.checkpoint_path(directory, manifest)
    ckpt_state.restore(s, store.read_tensors(path), path)
    st = s.step_fn.state
    lr_scale = float(st.lr_scale.asnumpy()) * a.lr_factor
    st.lr_scale.set_data(ms.Tensor(lr_scale, ms.float32))
    st.global_step.set_data(ms.Tensor(done, ms.int32))  # the schedule keeps following the step count
    writer.write({"step": done, "event": "rollback", "to_step": step, "lr_scale": lr_scale,
                  "reason": f"{nonfinite_run} consecutive non-finite steps"})
    log(f"anomaly guard: {nonfinite_run} consecutive non-finite steps; rolled back to step {step}'s weights, "
        f"learning rate × {lr_scale:g}; the data continues past the bad batches")
    return 0


def preemption_agreed(rt, preemption):
    """All ranks stop at the same step: a signal seen by any rank stops every rank."""
    if rt.world_size == 1:
        return preemption.requested
    return not all_ranks_ok(rt, not preemption.requested)


def as_floats(out):
    return tuple(x if isinstance(x, float) else float(x.asnumpy()) for x in out)


def interval_record(pending, step, lr):
    """Reduce the step outputs of one log interval to a record (the only host sync in the interval)."""
    rows = [as_floats(o) for o in pending]
    losses = [r[0] for r in rows]
    clean = [r[1] for r in rows if not r[2]]
    n_skipped = int(sum(bool(r[2]) for r in rows))  # code 1: non-finite gradients, 2: anomaly guard
    record = {"step": step, "loss": float(np.mean(losses)), "lr": lr,
              "grad_norm": float(np.mean(clean)) if clean else float("nan"), "loss_scale": rows[-1][3],
              "skipped_interval": n_skipped}
    anomalies = int(sum(r[2] == 2 for r in rows))
    if anomalies:
        record["anomaly_skips"] = anomalies
    return record, n_skipped


def run_eval(s, step, writer):
    if not s.val:  # no validation batches (pipeline parallelism)
        return None
    val_loss = evaluate(s.model, s.eval_step, s.val, s.rt)
    writer.write({"step": step, "val_loss": val_loss,
                  "val_tokens": len(s.val) * int(s.val[0].shape[0]) * s.cfg.model.seq_length * s.rt.world_size})
    return val_loss


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


def make_profiler(cfg, rt, run_dir, t, log):
    if cfg.monitor.profile is None:
        return None
    from ms_llm.monitor.profile import ProfileWindow

    p = cfg.monitor.profile
    out = p.output_dir or os.path.join(run_dir, "profile", f"rank_{rt.rank}")
    return ProfileWindow(p.start_step, min(p.stop_step, t.max_steps), out, rt.device_target, log)


def default_run_dir_all_ranks(rt, config_path):
    """runs/<config>-<time>, the same on every rank (rank clocks can straddle a second)."""
    import datetime

    stamp = rank0_int(rt, int(time.time()))
    stem = os.path.splitext(os.path.basename(config_path))[0] if config_path else "run"
    return os.path.join("runs", f"{stem}-{datetime.datetime.fromtimestamp(stamp):%Y%m%d-%H%M%S}")


def progress_bar(total, start, enabled):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=start, unit="step", dynamic_ncols=True, disable=None, leave=False)
