"""The run's dataset, made before the session opens: when data.dataset_dir holds none and data.source names a corpus,
rank 0 preprocesses it (text, or chat/instruction conversations) while the other ranks wait.

The commands that train (`train`, `benchmark`, `debug lr-find`, `debug overfit`) call this; the session itself only
reads the manifest, and `--dry-run`, which writes nothing, refuses a dataset that is not there yet."""
from ms_llm.data.manifest import has_manifest, load_manifest
from ms_llm.train.setup.context import agree, launch_world_size, select_device, setup_context
from ms_llm.train.setup.resolve import check_launch


def prepare_dataset(cfg, rt, log):
    """Preprocess `data.source` into data.dataset_dir (on rank 0) when the folder has no dataset yet."""
    d = cfg.data
    if d.blend or has_manifest(d.dataset_dir):
        return
    if not d.source:
        load_manifest(d.dataset_dir)  # raises the 'run ms-llm preprocess' message
    if rt.is_main:
        log(f"no dataset in '{d.dataset_dir}': preprocessing '{d.source}' ({d.tokenizer} tokenizer, "
            f"seq_length {cfg.model.seq_length})")

    def build():
        if rt.is_main and d.format != "text":  # conversations (docs/finetuning.md)
            from ms_llm.data.chat_preprocess import preprocess_conversations

            preprocess_conversations(d.source, d.dataset_dir, cfg.model.seq_length, d.tokenizer, d.format,
                                     d.val_fraction, log=log)
        elif rt.is_main:
            from ms_llm.data.preprocess import preprocess

            preprocess(d.source, d.dataset_dir, cfg.model.seq_length, d.tokenizer, d.val_fraction, d.text_field,
                       log=log)

    agree(rt, build)


def prepared_runtime(cfg, log=print):
    """Check the launch, set up the runtime and prepare the dataset: what a command that trains does before it opens
    its session (`open_session(cfg, log, rt=rt)`)."""
    check_launch(cfg, launch_world_size(), select_device(cfg.context))
    rt = setup_context(cfg.context)
    prepare_dataset(cfg, rt, log)
    return rt
