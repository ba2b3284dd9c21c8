"""The training loop: config → layout → run plan → session → steps, logs, evals, checkpoints.

Read `run()` top to bottom: it is the whole story. The helpers below it do one thing each; the per-step
extras (profiler window, NaN watch, tensor statistics, anomaly rollback, report, telemetry) are hooks the
caller hands in (ms_llm.train.loop.hooks).
"""
import os
import shutil
import time

from ms_llm.checkpoint import state as ckpt_state
from ms_llm.checkpoint.saver import CheckpointSaver
from ms_llm.config import save_config
from ms_llm.data.manifest import has_manifest
from ms_llm.errors import UserError
from ms_llm.monitor.metrics import MetricsWriter
from ms_llm.monitor.throughput import memory_gib, peak_memory_gib
from ms_llm.nn.dropout import KEY_NAME as DROPOUT_KEY
from ms_llm.parallel.layout import uses_semi_auto
from ms_llm.train import compile_cache
from ms_llm.rundir import writer as rd
from ms_llm.train.setup.context import all_ranks_ok, launch_world_size, select_device, setup_context
from ms_llm.train.loop.evaluate import evaluate_session
from ms_llm.train.loop.hooks import TrainingRun, call
from ms_llm.train.lr_schedule import lr_at
from ms_llm.train.loop.meter import IntervalMeter
from ms_llm.train.loop.preemption import Preemption
from ms_llm.train.setup.resume import keep_metrics_until, load_initial_weights, resume_from
from ms_llm.train.loop.run_log import RunLog
from ms_llm.train.setup.run_plan import plan_run
from ms_llm.train.setup.resolve import check_launch
from ms_llm.train.loop.router_stats import router_stats_for
from ms_llm.train.setup.dataset import prepare_dataset
from ms_llm.train.session import open_session
from ms_llm.train.step_runner import StepRunner
from ms_llm.train.loop.skipped_steps import RunHalted, SkippedSteps
from ms_llm.rundir import names


def run(cfg, run_dir=None, resume=False, config_path=None, echo=print, weights_only=False, hooks=()):
    """Train as `cfg` says (resuming `run_dir` when asked). Returns a summary dict on every rank."""
    entered = time.time()  # the startup (setup, model, data) is accounted up to the start of training
    # A config the launch cannot run is refused by every rank at once (and by msrun's scheduler process), before
    # any of them waits for another.
    check_launch(cfg, launch_world_size(), select_device(cfg.context))
    rt = setup_context(cfg.context)
    log = RunLog(echo, rt.rank)
    plan = plan_run(cfg, rt, uses_semi_auto(cfg.parallel_config), run_dir, resume, weights_only, config_path, log)
    prepare_dataset(cfg, rt, log)
    s = open_session(cfg, log, rt=rt, strategy_dir=plan.strategy_dir)  # from here on s.cfg: the config as run
    start, host = 0, {}
    if plan.resume:
        start, host = resume_from(s, plan.checkpoint, weights_only, log)
    elif plan.load_weights:
        load_initial_weights(s, plan.load_weights, log)
    s.fresh_start = plan.fresh_start
    s.loss.prepare(s, log, resumed=plan.resume)  # e.g. the preference loss's reference log-probs
    runner = StepRunner(s)
    t = s.cfg.train
    if rt.is_main:
        write_run_dir(plan, s.cfg, rt, start, s.manifest)
    log.open_files(plan.run_dir)
    log(f"run directory: {plan.run_dir}" + (f" (resuming at step {start})" if plan.resume else ""))

    writer = MetricsWriter(plan.run_dir, rt.rank, t.max_steps, s.cfg.monitor, echo=log)
    saver = CheckpointSaver(plan.run_dir, plan.ckpt_rank, s.cfg.checkpoint, log, events=writer.write)
    meter = IntervalMeter(s.tokens_per_step, s.flops_per_token, s.peak_flops, rt.world_size, start, t.max_steps,
                          t_start=writer.t_start)
    meter.restore(host)
    meter.startup_s = max(0.0, writer.t_start - entered)
    skips = SkippedSteps(s.cfg.precision)
    skips.resume(float(s.step_fn.state.loss_scale.asnumpy()))
    trun = TrainingRun(s, plan.run_dir, writer, log, plan.ckpt_rank)
    router = router_stats_for(s)  # MoE: router health per layer, read with each log record
    if plan.resume:
        writer.write({"step": start, "event": "resume", "from": plan.checkpoint[0]})
    log.start_progress(t.max_steps, start, s.cfg.monitor.progress_bar)
    call(hooks, "start", trun)
    val_loss, stopped, finished = None, None, False
    try:
        with Preemption(log) as preemption:
            for step in range(start, t.max_steps):
                with meter.waiting():
                    batches = next_batches(s, step)
                call(hooks, "before_step", trun, step, batches, times=meter.hook_s)
                out = first_step(trun, runner, meter, batches, fresh=step == 0) if meter.compile_s is None else \
                    runner.step(batches)
                done = step + 1
                meter.add(out, timed=done - start > 1)
                skips.add(done, out)
                saver.check()  # a background save that failed stops the run here
                call(hooks, "after_step", trun, step, out, batches, times=meter.hook_s)
                if done % min(t.log_interval, 8) == 0 or done == t.max_steps:  # a host sync every few steps
                    halt_if_stuck(skips, done, trun, saver, meter)
                if done % t.log_interval == 0 or done == t.max_steps:
                    lr = lr_at(step, t) * float(s.step_fn.state.lr_scale.asnumpy())  # lowered by rollbacks
                    record = meter.record(done, lr, memory_gib(rt.device_target))
                    if router is not None:
                        record.update(router.read())
                    record.update(s.loss.log_fields())  # e.g. the share of target tokens a masked loss counts
                    writer.write(record)
                    with meter.paused():  # log-time work (the live diagnosis) is not step time; it times itself
                        call(hooks, "after_log", trun, record)
                with meter.paused():
                    if t.eval_interval and done % t.eval_interval == 0 and done != t.max_steps:
                        val_loss = run_eval(trun, done, hooks)
                    stop = stop_agreed(rt, preemption.requested or trun.stop_reason is not None) or \
                        done == t.stop_at_step
                    if stop or (s.cfg.checkpoint.save_interval and done % s.cfg.checkpoint.save_interval == 0
                                and done != t.max_steps):
                        save(trun, saver, done, meter)
                log.progress(done, t.max_steps, step_s=meter.step_s())
                if stop:
                    stopped = done
                    if trun.stop_reason is not None and not preemption.requested:  # a hook's (train.stop_on)
                        writer.write({"step": done, "event": "stop_on", "reason": trun.stop_reason}, echo=False)
                        log(f"stopped at step {done}: {trun.stop_reason}; checkpoint saved.")
                        break
                    writer.write({"step": done, "event": "preempted" if preemption.requested else "stop_at_step",
                                  "signal": preemption.signum or 0})
                    log(f"stopped at step {done} ({'signal' if preemption.requested else 'train.stop_at_step'}); "
                        f"checkpoint saved. Resume with --resume (or checkpoint.auto_resume: true).")
                    break
            if stopped is None:
                val_loss = run_eval(trun, t.max_steps, hooks)
                save(trun, saver, t.max_steps, meter)
            saver.close()
            saver.upload()
        finished = True
        call(hooks, "finish", trun)
        summary = summarise(trun, stopped or t.max_steps, val_loss, meter, saver)
        finish(trun, summary, saver)
        call(hooks, "done", trun, summary)
        return summary
    except BaseException:
        import traceback

        # what ended the run stays in logs/ (the console has the one paragraph)
        log.to_files(traceback.format_exc().rstrip())
        raise
    finally:
        if not finished:  # an error or a halt: hooks still release what they hold (profiler, sampler thread)
            for h in hooks:
                try:
                    h.finish(trun)
                except Exception:  # noqa: BLE001 (the original error is the one to report)
                    pass
        writer.close()
        log.close()
        compile_cache.close()  # a run that failed between enabling the cache and compiling leaves it off


# --- the run directory ------------------------------------------------------------------------------------

def write_run_dir(plan, cfg, rt, start, manifest):
    """Create the run directory (or continue it) and write the config as run and the run's facts (with the
    dataset's sample count and token statistics, so a run directory copied elsewhere keeps its references)."""
    rd.create_run_dir(plan.run_dir)
    if plan.resume:
        keep_metrics_until(plan.run_dir, start)
    name = names.resume_config(start) if plan.resume else names.CONFIG
    rd.write_config(cfg, os.path.join(plan.run_dir, name), save_config)
    info = os.path.join(plan.run_dir, names.RUN_INFO)
    if not os.path.isfile(info):
        dataset = {"dir": os.path.abspath(cfg.data.dataset_dir), "stats": manifest.get("stats"),
                   "overlap": manifest.get("overlap"),
                   "train_samples": manifest.get("splits", {}).get("train", {}).get("samples")}
        if manifest.get("format"):  # chat/instruction data: what diagnose's fine-tuning rules read
            dataset.update(format=manifest["format"], packed=manifest.get("packed"), finetune=manifest.get("finetune"),
                           seq_length=manifest.get("seq_length"))
        if manifest.get("preference"):  # preference pairs (diagnose's preference rules)
            dataset.update(preference=manifest["preference"])
        rd.write_json(info, rd.run_info(rt, cfg, {"run_dir": os.path.abspath(plan.run_dir), "dataset": dataset}))


def summarise(trun, steps, val_loss, meter, saver):
    s = trun.session
    digest = param_digest(s.model, s.n_params)
    if digest:
        trun.log(f"parameter digest (rank {s.rt.rank}): {digest}")
    return {"final_val_loss": val_loss, "param_digest": digest, "steps": steps, "skipped_steps": meter.skipped,
            "compile_s": meter.compile_s, "peak_mem_gib": peak_memory_gib(s.rt.device_target),
            "run_dir": trun.run_dir, "checkpoint": saver.last_path, "parameters": s.n_params, **trun.extra}


def finish(trun, summary, saver):
    s, log = trun.session, trun.log
    steps, val_loss = summary["steps"], summary["final_val_loss"]
    if s.rt.is_main:
        rd.update_run_info(trun.run_dir, final=summary)
        saver.upload()
    val = f"{val_loss:.4f}" if val_loss is not None else "n/a"
    if steps == s.cfg.train.max_steps:
        log(f"done: {steps} steps, final val_loss {val}, checkpoint {saver.last_path}")
    else:
        log(f"stopped after step {steps} of {s.cfg.train.max_steps}; last val_loss {val}; checkpoint "
            f"{saver.last_path}")
    return summary


# --- per-step helpers ------------------------------------------------------------------------------------

def first_step(trun, runner, meter, batches, fresh):
    """The first step of this process compiles (or loads) the step's graphs: timed on its own (a compile cache
    entry that fails its checks is the runner's to recover from). On a fresh run its loss is the loss before any
    update (the step computes it on the initial weights), kept as initial_loss."""
    t0 = time.perf_counter()
    out = runner.step(batches)
    loss = float(out.loss.asnumpy())
    meter.first_step(time.perf_counter() - t0, loss if fresh else None)
    trun.log(f"compiled the training step in {meter.compile_s:.1f} s" + (f"; loss before any update {loss:.4f}"
                                                                        if fresh else ""))
    return out


def next_batches(s, step):
    try:
        return s.next_batches()
    except UserError as e:  # a bad token id: name the step it would have corrupted
        raise UserError(f"step {step + 1}, {e}") from None


def halt_if_stuck(skips, done, trun, saver, meter):
    """Stop a run whose updates are all being skipped (ms_llm.train.loop.skipped_steps): save, record, explain."""
    halt = skips.check()
    if halt:
        save(trun, saver, done, meter)
        saver.close()
        trun.writer.write({"step": done, "event": "halted", "reason": halt, "since_step": skips.first})
        raise RunHalted(halted_message(done, skips, halt, trun.run_dir, saver,
                                       trun.session.cfg.train.anomaly is not None))


def halted_message(step, skips, reason, run_dir, saver, anomaly_guard):
    tried = "dynamic loss scaling" if skips.dynamic else "skipping the non-finite updates"
    if anomaly_guard:
        tried += " and the anomaly guard's rollbacks"
    return (f"training stopped at step {step}: every update since step {skips.first} was skipped; {reason}. Tried: "
            f"{tried}. No update was applied after step {skips.first - 1}, so the checkpoint just saved "
            f"({saver.last_path or 'see ' + run_dir + '/checkpoints'}) holds the last good weights. Find the first "
            f"module that goes non-finite with `ms-llm debug nan --run-dir {run_dir} --step {step}` (it replays the "
            f"next step from that checkpoint); docs/debugging.md walks the rest.")


def save(trun, saver, step, meter):
    s = trun.session
    cfg = s.cfg
    strategy = os.path.join(cfg.checkpoint.strategy_dir or "", f"strategy_rank_{s.rt.rank}.ckpt")
    if s.parallel.semi_auto and os.path.isfile(strategy):  # the layout travels with the shards it describes
        os.makedirs(saver.directory, exist_ok=True)
        shutil.copy2(strategy, saver.directory)
    if s.rt.is_main or s.parallel.semi_auto:
        t0 = time.perf_counter()
        saver.save(step, ckpt_state.capture(s), ckpt_state.describe(s, step, meter.host_state()))
        trun.writer.write({"step": step, "event": "checkpoint", "duration_s": round(time.perf_counter() - t0, 4)},
                          echo=False)


def stop_agreed(rt, requested):
    """All ranks stop at the same step: a stop any rank asks for (a signal, a hook's stop_reason) stops every rank."""
    if rt.world_size == 1:
        return requested
    return not all_ranks_ok(rt, not requested)


def run_eval(trun, step, hooks):
    s = trun.session
    if not s.val:  # no validation batches (pipeline parallelism)
        return None
    t0 = time.perf_counter()
    record = evaluate_session(s)  # the run's loss in evaluation mode; with data.extra_val's loss
    val_loss = record["val_loss"]
    trun.writer.write({"step": step, **record, "duration_s": round(time.perf_counter() - t0, 4)})
    call(hooks, "after_eval", trun, step, val_loss)
    return val_loss


def param_digest(model, n_params, limit=200_000_000):
    """SHA-256 over all parameters in name order: equal digests = bit-identical replicas across ranks.
    Skipped for big models, where copying every weight to the host would take minutes."""
    if n_params > limit:
        return None
    import hashlib

    h = hashlib.sha256()
    for name, p in sorted(model.parameters_and_names(), key=lambda kv: kv[0]):
        if name == DROPOUT_KEY:  # this rank's place in the batch, not a weight
            continue
        h.update(name.encode())
        h.update(p.asnumpy().tobytes())
    return h.hexdigest()[:16]


def dry_run(cfg, echo=print):
    """Check and compile everything a run would, without training or writing a run directory.

    On an Ascend host with `MS_SIMULATION_LEVEL=1` (msrun --sim_level=1) this compiles the sharded graph of
    one rank without touching a device: the way to verify a layout before queueing a cluster job."""
    d = cfg.data
    if not d.blend and d.source and not has_manifest(d.dataset_dir):
        raise UserError(f"--dry-run writes nothing, and data.dataset_dir = '{d.dataset_dir}' holds no dataset yet "
                        f"(training would first preprocess data.source = '{d.source}' into it). Preprocess it once: "
                        f"`ms-llm preprocess --input {d.source} --output-dir {d.dataset_dir} --seq-length "
                        f"{cfg.model.seq_length} --tokenizer {d.tokenizer}`, then run the dry run again.")
    s = open_session(cfg, echo, purpose="dry_run")
    s.log(s.parallel.table())
    t0 = time.perf_counter()
    StepRunner(s).compile([next(s.data) for _ in range(s.accum)])
    s.log(f"dry run: training step compiled in {time.perf_counter() - t0:.1f} s; nothing was trained or written")
    return s
