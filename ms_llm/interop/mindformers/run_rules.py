"""MindFormers dataset, callbacks, context, profiling and top-level run keys → our `data`, `checkpoint`,
`monitor`, `context` sections (one row per key)."""
import os
import re

from ms_llm.errors import UserError


def data(t):
    td = "train_dataset."
    d = t.get(td + "data_loader.dataset_dir")
    if d:
        is_file = re.search(r"\.mindrecord\d*$", d) or os.path.isfile(d)  # MindFormers accepts a shard's path
        folder = os.path.dirname(d) if is_file else d.rstrip("/")
        t.mapped(td + "data_loader.dataset_dir", ("data.dataset_dir", folder or "."),
                 ("the folder of that file; " if is_file else "")
                 + "a MindFormers MindRecord needs a manifest.json first (ms-llm data adopt)")
    else:
        t.action(td + "data_loader.dataset_dir", "empty: set data.dataset_dir to the dataset folder")
    t.ignored(td + "data_loader.type", "MindDataset: what ms_llm reads")
    t.ignored(td + "data_loader.shuffle", "ms_llm shuffles every epoch with a permutation drawn from train.seed")
    cols = t.get(td + "input_columns", ["input_ids"])
    if "labels" in cols:
        t.unsupported(td + "input_columns", "the labels column is not read: ms_llm's loss covers every next token "
                                            "of input_ids (no prompt masking)")
    t.ignored(td + "input_columns", "ms_llm reads input_ids (seq_length + 1 tokens per sample)")
    t.ignored(td + "num_parallel_workers", "reader threads suit the host, not the run: set data.num_workers for "
                                           "yours (default 1; MindSpore refuses more than the host's CPUs)")
    t.ignored(td + "batch_size", "MindFormers replaces it with runner_config.batch_size too")
    for k in ("python_multiprocessing", "drop_remainder", "repeat", "numa_enable", "prefetch_size", "seed"):
        t.ignored(td + k, "pipeline detail ms_llm sets itself (batches never end short: epochs join)")
    t.ignore_prefix("train_dataset_task.", "the dataset task wrapping train_dataset")
    t.ignore_prefix("eval_dataset", "ms_llm evaluates on the val split of data.dataset_dir")
    if t.get("do_eval", False):
        step = t.get("eval_step_interval", -1)
        if step and step > 0:
            t.mapped("eval_step_interval", ("train.eval_interval", int(step)))
        t.ignored("do_eval", "on: every eval_step_interval steps")
    else:
        t.mapped("do_eval", ("train.eval_interval", 0), "ms_llm still evaluates once at the end")
        t.ignored("eval_step_interval", "do_eval is off")
        if not t.has("do_eval"):
            t.default("do_eval", ("train.eval_interval", 0), "MindFormers does not evaluate while training by "
                                                             "default; ms_llm still evaluates once at the end")
    t.ignored("eval_step_interval", "-1: evaluation only at the end")
    t.ignored("eval_epoch_interval", "ms_llm counts steps, not epochs")


CALLBACK_NOTES = {
    "MFLossMonitor": "the log line and metrics.jsonl every train.log_interval steps",
    "ObsMonitor": "copies to OBS: checkpoint.remote_dir (see remote_save_url)",
    "SummaryMonitor": "Insight summaries under <run>/summary (monitor.summary)",
    "ProfileMonitor": "the profiler window: monitor.profile",
    "TrainingStateMonitor": "per-layer statistics: monitor.tensor_stats",
    "CheckpointMonitor": "the checkpoint section",
    "EvalCallBack": "train.eval_interval",
}


def callbacks(t):
    i = 0
    while t.has(f"callbacks[{i}].type"):
        p = f"callbacks[{i}]."
        kind = t.get(p + "type")
        if kind not in CALLBACK_NOTES:
            t.unsupported(p + "type", "no ms_llm equivalent for this callback")
            t.ignore_prefix(p, f"belongs to {kind}")
            i += 1
            continue
        if kind == "SummaryMonitor":
            t.mapped(p + "type", ("monitor.summary", True), CALLBACK_NOTES[kind])
            t.ignore_prefix(p, "summaries go to <run>/summary")
        t.ignored(p + "type", CALLBACK_NOTES[kind])
        if kind == "MFLossMonitor" and t.has(p + "per_print_times"):
            t.mapped(p + "per_print_times", ("train.log_interval", int(t.get(p + "per_print_times"))))
        if kind == "CheckpointMonitor":
            if t.has(p + "save_checkpoint_steps"):
                t.mapped(p + "save_checkpoint_steps",
                         ("checkpoint.save_interval", int(t.get(p + "save_checkpoint_steps"))))
            keep = int(t.get(p + "keep_checkpoint_max", 5))
            t.mapped(p + "keep_checkpoint_max", ("checkpoint.keep_last", keep))
            if not t.has(p + "keep_checkpoint_max"):
                t.default(p + "keep_checkpoint_max", ("checkpoint.keep_last", 5), "CheckpointMonitor's default")
            t.mapped(p + "async_save", ("checkpoint.async_save", bool(t.get(p + "async_save"))))
            fmt = t.get(p + "checkpoint_format", "ckpt")
            if fmt in ("ckpt", "safetensors"):
                t.mapped(p + "checkpoint_format", ("checkpoint.format", fmt))
            t.ignored(p + "prefix", "ms_llm names checkpoints step_<n>")
            t.ignored(p + "integrated_save", "each rank writes its own checkpoint; `ms-llm convert --merge` joins "
                                             "tensor-parallel shards")
            t.ignored(p + "directory", "checkpoints go to <run>/checkpoints/rank_<r>")
            for k in ("save_network_params", "save_trainable_params", "remove_redundancy", "save_checkpoint_seconds"):
                t.ignored(p + k, "ms_llm saves the full training state every save_interval steps")
        t.ignore_prefix(p, f"{kind} setting ms_llm has no knob for")
        i += 1
    t.ignore_prefix("eval_callbacks", "ms_llm's evaluation logs val_loss to the same log line and metrics.jsonl")


def context(t):
    c = "context."
    mode = t.get(c + "mode", 0)
    t.mapped(c + "mode", ("context.mode", "pynative" if mode in (1, "PYNATIVE_MODE") else "graph"))
    target = t.get(c + "device_target", "Ascend")
    t.mapped(c + "device_target", ("context.device_target", "auto"),
             f"auto picks Ascend where present (was {target!r}); the config stays checkable on a CPU")
    t.mapped(c + "max_device_memory", ("context.max_device_memory", str(t.get(c + "max_device_memory"))))
    level = t.get(c + "jit_config.jit_level")
    if level in ("O0", "O1", "O2"):
        t.mapped(c + "jit_config.jit_level", ("context.jit_level", level))
    if t.has(c + "runtime_num_threads"):
        t.mapped(c + "runtime_num_threads", ("context.num_threads", int(t.get(c + "runtime_num_threads"))))
    t.ignored(c + "device_id", "each rank's device comes from msrun")
    for k in t.keys(c):
        t.ignored(k, "a MindSpore compiler/debug option ms_llm leaves at its default")


def top_level(t):
    t.mapped("seed", ("train.seed", int(t.get("seed", 0))), "init, data order and dropout")
    mode = t.get("run_mode", "train")
    if mode in ("train", "finetune"):
        t.ignored("run_mode", "training" + (": fine-tuning is training from checkpoint.load_weights"
                                             if mode == "finetune" else ""))
    else:
        t.unsupported("run_mode", f"{mode!r}: ms-llm convert imports training configs (generation: ms-llm sample)")
    ckpt = t.get("load_checkpoint", "")
    if ckpt:
        t.action("load_checkpoint", f"convert it: ms-llm convert --from-mindformers {ckpt} --config <this output> "
                                    f"--output DIR, then --set checkpoint.load_weights=DIR/model.ckpt")
    t.ignored("load_checkpoint", "empty: training starts from random weights")
    if t.get("resume_training"):
        t.unsupported("resume_training", "MindFormers optimizer state is not converted: start from its weights "
                                         "(checkpoint.load_weights); ms_llm runs resume with --resume")
    t.ignored("resume_training", "off")
    t.ignored("auto_trans_ckpt", "ms_llm shards a full checkpoint itself for any layout")
    t.ignored("src_strategy_path_or_dir", "strategy files are read by `ms-llm convert --from-mindformers DIR "
                                          "--strategy S` when merging a sharded checkpoint")
    t.ignored("only_save_strategy", "`ms-llm plan` and `--dry-run` check a layout without training")
    t.ignored("output_dir", "each run gets its own --run-dir (runs/<config>-<time>)")
    t.ignore_prefix("trainer.", "ms_llm has one trainer; the model comes from model.arch")
    t.ignore_prefix("processor.", "tokenizing happens before training: the dataset's manifest.json names the tokenizer")
    t.ignore_prefix("metric.", "ms_llm reports validation loss (perplexity = exp(val_loss))")
    url = t.get("remote_save_url", "")
    if isinstance(url, str) and url.startswith(("obs://", "s3://")):
        t.mapped("remote_save_url", ("checkpoint.remote_dir", url), "every completed checkpoint is copied there")
    t.ignored("remote_save_url", "not a URL (the template's placeholder)")
    if t.get("profile", False):
        start, stop = int(t.get("profile_start_step", 1)), int(t.get("profile_stop_step", 10))
        t.mapped("profile", [("monitor.profile.start_step", start), ("monitor.profile.stop_step", stop)],
                 f"steps {start}-{stop} with mindspore.Profiler; top-10 operators printed")
        t.ignored("profile_start_step", "in monitor.profile.start_step")
        t.ignored("profile_stop_step", "in monitor.profile.stop_step")
    t.ignored("profile", "off")
    for k in ("profile_start_step", "profile_stop_step"):
        t.ignored(k, "profiling is off")
    for k in ("init_start_profile", "profile_communication", "profile_memory", "profile_level", "profile_output",
              "profile_rank_ids", "profile_pipeline", "profile_with_stack", "profiler_level", "with_stack"):
        t.ignored(k, "ms_llm's profiler window records operators and memory on the profiled rank")
    if t.get("layer_scale"):
        t.unsupported("layer_scale", "layer-wise learning-rate decay is not implemented")
    for k in ("layer_scale", "layer_decay", "lr_scale_factor"):
        t.ignored(k, "layer-wise learning-rate scaling is off")
    for k in ("auto_tune", "filepath_prefix", "autotune_per_step"):
        t.ignored(k, "hyper-parameter auto-tuning (off); `ms-llm plan --search` ranks parallel layouts")
