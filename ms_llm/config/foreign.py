"""Is this YAML another framework's config (MindFormers')? The config loader asks while reporting an unknown
section, so that a MindFormers file handed to `ms-llm train` is named as one, with the command that converts it
(ms_llm/interop/mindformers/)."""

# Top-level keys that only MindFormers configs have (ours never will: our sections are fixed).
MINDFORMERS_KEYS = ("runner_config", "runner_wrapper", "train_dataset", "train_dataset_task", "trainer", "run_mode",
                    "lr_schedule", "optimizer", "callbacks", "use_parallel", "load_checkpoint", "auto_trans_ckpt",
                    "output_dir", "processor", "micro_batch_interleave_num", "moe_config", "eval_dataset")


def looks_like_mindformers(raw, path=None):
    """A one-paragraph message saying how to convert `raw` (a YAML mapping) when it is a MindFormers config,
    else None."""
    if not isinstance(raw, dict):
        return None
    found = [k for k in MINDFORMERS_KEYS if k in raw]
    model = raw.get("model")
    if isinstance(model, dict) and "model_config" in model:
        found.insert(0, "model.model_config")
    if len(found) < 2:
        return None
    name = f"'{path}'" if path else "the config file"
    src = path or "FILE.yaml"
    dst = (path[:-5] if path and path.endswith(".yaml") else "FILE") + "_ms_llm.yaml"
    return (f"{name} is a MindFormers config (it has {', '.join(found[:4])}), which ms-llm does not read "
            f"directly: its sections and some meanings differ (MindFormers' batch_size is per device, ours is "
            f"global). Convert it once with `ms-llm convert --from-mindformers-config {src} --output {dst}`, "
            f"read the table it prints (every key: mapped to what, ignored and why, or not supported), then "
            f"run `ms-llm train --config {dst}`. docs/from_mindformers.md explains the differences.")
