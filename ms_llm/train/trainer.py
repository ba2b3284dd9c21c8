"""The training loop: config → layout → run plan → session → steps, logs, evals, checkpoints.

Read `run()` top to bottom: it is the whole story, one loop body for every step. What is due on which step is
ms_llm.train.loop.cadence's, every early stop (a signal, train.stop_at_step, a hook's stop_reason, a run whose
updates are all skipped) ms_llm.train.loop.stop's. The helpers below it do one thing each; the per-step extras
(profiler window, NaN watch, tensor statistics, anomaly rollback, report, telemetry) are hooks the caller hands in
(ms_llm.train.loop.hooks).
"""
import os
import shutil
import time
import traceback

from ms_llm.checkpoint import state as ckpt_state
from ms_llm.checkpoint.saver import CheckpointSaver
from ms_llm.config import save_config
from ms_llm.data.manifest import has_manifest
from ms_llm.errors import UserError
from ms_llm.monitor.metrics import MetricsWriter
from ms_llm.monitor.throughput import memory_gib, peak_memory_gib
from ms_llm.nn.dropout import KEY_NAME as DROPOUT_KEY
from ms_llm.train import compile_cache
from ms_llm.rundir import writer as rd
from ms_llm.train.setup.context import launch_world_size, select_device, setup_context
from ms_llm.train.loop.evaluate import evaluate_session
from ms_llm.train.loop.hooks import TrainingRun, call, per_step
from ms_llm.train.lr_schedule import lr_at
from ms_llm.train.loop.meter import IntervalMeter
from ms_llm.train.loop.stop import Stop
from ms_llm.train.setup.resume import keep_metrics_until, load_initial_weights, resume_from
from ms_llm.train.loop.run_log import RunLog
from ms_llm.train.setup.run_plan import plan_run
from ms_llm.train.setup.resolve import check_launch
from ms_llm.train.loop.router_stats import router_stats_for
from ms_llm.train.setup.dataset import prepare_dataset
from ms_llm.train.session import open_session
from ms_llm.train.step_runner import StepRunner
from ms_llm.train.loop.cadence import Cadence
from ms_llm.rundir import names


def run(cfg, run_dir=None, resume=False, config_path=None, echo=print, weights_only=False, hooks=()):
    """Train as `cfg` says (resuming `run_dir` when asked). Returns a summary dict on every rank."""
    entered = time.time()  # the startup (setup, model, data) is accounted up to the start of training
    s, plan, runner, start, host, log = open_run(cfg, run_dir, resume, weights_only, config_path, echo)
    t, cadence = s.cfg.train, Cadence(s.cfg.train, s.cfg.checkpoint)
    trun, saver, meter = open_records(s, plan, start, host, entered, log)
    stop = Stop(trun, saver, checkpoint=lambda step: save(trun, saver, step, meter))
    router = router_stats_for(s)  # MoE: router health per layer, read with each log record
    if plan.resume:
        trun.writer.write({"step": start, "event": "resume", "from": plan.checkpoint[0]})
    log.start_progress(t.max_steps, start, s.cfg.monitor.progress_bar)
    call(hooks, "start", trun)
    val_loss, finished, stepping = None, False, per_step(hooks)
    try:
        with stop:  # a signal from here on finishes the step, saves and returns
            for step in range(start, t.max_steps):
                with meter.waiting():
                    batches = next_batches(s, step)
                if stepping:
                    call(stepping, "before_step", trun, step, batches, times=meter.hook_s)
                out = runner.step(batches)
                done, due = step + 1, cadence.at(step + 1)
                if meter.compile_s is None:  # this process's first step compiled (or loaded) the graphs
                    report_compile(trun, runner, meter, out, fresh=step == 0)
                meter.add(out, timed=done - start > 1)
                stop.after_step(done, out)
                if stepping:
                    call(stepping, "after_step", trun, step, out, batches, times=meter.hook_s)
                if due.halt_check:  # reads the update codes back: a host sync every few steps
                    stop.halt_if_stuck(done)
                if due.log:
                    record = log_record(s, meter, router, step, done)
                    trun.writer.write(record)
                with meter.paused():  # log-time hooks (the live diagnosis), evaluation and checkpoints: not step time
                    if due.log:
                        call(hooks, "after_log", trun, record)
                    if due.eval:
                        val_loss = run_eval(trun, done, hooks)
                    if stop.due(done) or due.save:
                        save(trun, saver, done, meter)
                log.progress(done, t.max_steps, step_s=meter.step_s())
                if stop.step is not None:
                    stop.report()
                    break
            if stop.step is None:
                val_loss = run_eval(trun, t.max_steps, hooks)
                save(trun, saver, t.max_steps, meter)
            saver.close()
            saver.upload()
        finished = True
        call(hooks, "finish", trun)
        summary = summarise(trun, stop.step or t.max_steps, val_loss, meter, saver)
        finish(trun, summary, saver)
        call(hooks, "done", trun, summary)
        return summary
    except BaseException:
        log.to_files(traceback.format_exc().rstrip())  # what ended the run stays in logs/ (the console: one paragraph)
        raise
    finally:
        close_run(trun, hooks, finished)


def open_run(cfg, run_dir, resume, weights_only, config_path, echo):
    """Everything before the first step: the launch checked, the context set up, the run planned, the dataset
    prepared, the session opened (resumed, or started from loaded weights), the run directory written.
    Returns (session, plan, step runner, first step, the checkpoint's host state, log)."""
    # A config the launch cannot run is refused by every rank at once (and by msrun's scheduler process), before
    # any of them waits for another.
    check_launch(cfg, launch_world_size(), select_device(cfg.context))
    rt = setup_context(cfg.context)
    log = RunLog(echo, rt.rank)
    plan = plan_run(cfg, rt, run_dir, resume, weights_only, config_path, log)
    prepare_dataset(cfg, rt, log)
    # from here on s.cfg: the config as run
    s = open_session(cfg, log, rt=rt, strategy_dir=plan.strategy_dir, fresh_start=plan.fresh_start)
    start, host = 0, {}
    if plan.resume:
        start, host = resume_from(s, plan.checkpoint, weights_only, log)
    elif plan.load_weights:
        load_initial_weights(s, plan.load_weights, log)
    s.loss.prepare(s, log, resumed=plan.resume)  # e.g. the preference loss's reference log-probs
    runner = StepRunner(s)
    if rt.is_main:
        write_run_dir(plan, s.cfg, rt, start, s.manifest)
    log.open_files(plan.run_dir)
    log(f"run directory: {plan.run_dir}" + (f" (resuming at step {start})" if plan.resume else ""))
    return s, plan, runner, start, host, log


def open_records(s, plan, start, host, entered, log):
    """What the loop writes through: the metrics writer (in the run), the checkpoint saver, the interval meter (its
    counts carried over from the checkpoint resumed, its startup time from `entered`)."""
    t = s.cfg.train
    writer = MetricsWriter(plan.run_dir, s.rt.rank, t.max_steps, s.cfg.monitor, echo=log)
    saver = CheckpointSaver(plan.run_dir, plan.ckpt_rank, s.cfg.checkpoint, log, events=writer.write)
    meter = IntervalMeter(s.tokens_per_step, s.flops_per_token, s.peak_flops, s.rt.world_size, start, t.max_steps,
                          t_start=writer.t_start)
    meter.restore(host)
    meter.startup_s = max(0.0, writer.t_start - entered)
    return TrainingRun(s, plan.run_dir, writer, log, plan.ckpt_rank), saver, meter


def close_run(trun, hooks, finished):
    """However the run ended: hooks release what they hold (profiler, sampler thread) on an error or a halt, the
    metrics and log files close, and MindSpore's compile cache is left off (a run that failed between enabling it
    and compiling would leave it on)."""
    if not finished:
        for h in hooks:
            try:
                h.finish(trun)
            except Exception:  # noqa: BLE001 (the original error is the one to report)
                pass
    trun.writer.close()
    trun.log.close()
    compile_cache.close()


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

def report_compile(trun, runner, meter, out, fresh):
    """The first step of this process compiled (or loaded) the step's graphs: timed on its own (a compile cache entry
    that fails its checks is recovered from in ms_llm/train/compile_step.py). On a fresh run its loss is the loss
    before any update (the step computes it on the initial weights), kept as initial_loss."""
    loss = float(out.loss.asnumpy())
    meter.first_step(runner.compile_s, loss if fresh else None)
    trun.log(f"compiled the training step in {meter.compile_s:.1f} s" + (f"; loss before any update {loss:.4f}"
                                                                        if fresh else ""))


def log_record(s, meter, router, step, done):
    """The interval's metrics record: the meter's (the interval's one host sync), the learning rate as lowered by
    rollbacks, the MoE router's health and the loss's own fields."""
    lr = lr_at(step, s.cfg.train) * float(s.step_fn.state.lr_scale.asnumpy())
    record = meter.record(done, lr, memory_gib(s.rt.device_target))
    if router is not None:
        record.update(router.read())
    record.update(s.loss.log_fields())  # e.g. the share of target tokens a masked loss counts
    return record


def next_batches(s, step):
    try:
        return s.next_batches()
    except UserError as e:  # a bad token id: name the step it would have corrupted
        raise UserError(f"step {step + 1}, {e}") from None


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


def run_eval(trun, step, hooks):
    s = trun.session
    if not s.val:  # no validation batches (train.eval_steps = 0, pipeline parallelism, a split too small)
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
