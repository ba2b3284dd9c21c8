"""`ms-llm data info DIR [--config C]`: what a dataset holds, and what a run will make of it.

Documents, tokens and samples per split, the document-length histogram and the unigram entropy come from
the manifest (preprocessing gathers them), and so do the splits' overlap (near-copies of training text in
validation) and the divergence of their token distributions (ms_llm.data.overlap); a dataset preprocessed before
these were measured is measured from its samples once, and the result saved into its manifest. With a config: how many epochs `train.max_steps` covers, with a
warning when that repeats the data more than REPEAT_WARN times (the model starts memorising: the train loss
keeps falling while the validation loss turns up).
"""
import json
import os

from ms_llm.data.manifest import MANIFEST, load_manifest
from ms_llm.data.split_index import split_shards
from ms_llm.fileio import interpreting

REPEAT_WARN = 4.0


def histogram_lines(hist, width=40):
    if not hist:
        return []
    top = max(hist.values())
    return [f"  {label:>17} tokens | {'#' * max(1, round(width * c / top)):<{width}} {c:,}" for label, c in hist.items()]


def info(dataset_dir, cfg=None):
    """The report as a list of lines; a statistic of the wrong type in a hand-edited manifest is one paragraph."""
    m = load_manifest(dataset_dir, verify=False)
    with interpreting(os.path.join(dataset_dir, MANIFEST), "dataset manifest",
                      "Restore manifest.json, or re-run preprocessing."):
        return report_lines(dataset_dir, m, cfg)


def report_lines(dataset_dir, m, cfg):
    tk = m["tokenizer"]
    lines = [f"dataset '{dataset_dir}': tokenizer {tk['kind']}" + (f" ({tk['path']})" if tk.get("path") else "")
             + f", vocab {m['vocab_size']:,}, samples of {m['seq_length'] + 1} tokens"
             + (f", split: {m['split_method']}" if m.get("split_method") else "")]
    for name, s in m["splits"].items():
        docs = s.get("documents")
        docs = f"{docs:,}" if docs is not None else "n/a"
        lines.append(f"  {name:5}: {docs:>10} documents {s.get('tokens', 0):>14,} tokens {s['samples']:>12,} samples "
                     f"in {len(split_shards(m, name))} file(s)")
    stats = m.get("stats", {})
    for name, st in stats.items():
        h = st.get("unigram_entropy_nats")
        if h is not None:
            lines.append(f"unigram entropy ({name}): {h:.4f} nats/token: the loss of a model that ignores context; "
                         f"a trained model should end well below it")
    hist = stats.get("train", {}).get("doc_length_histogram")
    if hist:
        lines.append("document lengths (train):")
        lines += histogram_lines(hist)
    if m.get("finetune"):
        from ms_llm.data.chat_pack import info_lines

        lines += info_lines(m)
    if m.get("preference"):
        from ms_llm.data.preference import info_lines as preference_lines

        lines += preference_lines(m)
    lines += overlap_lines(dataset_dir, m)
    if m.get("bad_lines"):
        lines.append(f"bad lines skipped while preprocessing: {m['bad_lines']:,}")
    if cfg is not None:
        lines += run_coverage(m, cfg)
    return lines


def run_coverage(manifest, cfg):
    t = cfg.train
    n = manifest["splits"]["train"]["samples"]
    seen = t.global_batch_size * t.max_steps
    epochs = seen / n if n else float("inf")
    out = [f"run: {t.max_steps:,} steps × {t.global_batch_size} samples = {seen:,} samples = {epochs:.2f} epoch(s) "
           f"of the {n:,} training samples"]
    if epochs > REPEAT_WARN:
        out.append(f"warning: the run repeats the training data {epochs:.1f} times (more than {REPEAT_WARN:g}): expect "
                   f"overfitting (validation loss rising while the train loss falls). Use more data, fewer steps "
                   f"(train.max_steps <= {int(REPEAT_WARN * n // t.global_batch_size):,}), or a smaller model.")
    return out


def overlap_lines(dataset_dir, m):
    """The splits' overlap and divergence, measured now (and saved) when the manifest lacks them."""
    from ms_llm.data import overlap

    entry, note = m.get("overlap"), ""
    # rebuilt from the rows as one stream, which conversation samples (padded, not overlapping) are not: their
    # overlap is measured while preprocessing only
    if not entry and not m.get("format") and "val" in m["splits"] and m["splits"]["val"].get("samples"):
        from ms_llm.data.progress import Progress

        tokens = sum(s.get("tokens") or (s["samples"] * m["seq_length"]) for s in m["splits"].values())
        progress = Progress(tokens, f"measuring the splits' overlap in '{dataset_dir}'", print)
        try:
            entry = overlap.measure_dataset(dataset_dir, m, progress.update)
        finally:
            progress.close()
        note = " (measured now from the samples" + (", saved into manifest.json)" if save_overlap(dataset_dir, entry)
                                                     else "; the folder is read-only, so not saved)")
    if not entry:
        return []
    out = []
    share = entry.get("val_shingles_in_train")
    if share is not None:
        out.append(f"overlap: {100 * share:.2f}% of the validation split's {entry['shingle_tokens']}-token shingles "
                   f"occur in the training split ({entry['sampled_val_shingles']:,} of {entry['val_shingles']:,} "
                   f"sampled){note}")
    kl = entry.get("unigram_kl_val_train_nats")
    if kl is not None:
        out.append(f"token distributions: KL(val || train) = {kl:.4f} nats/token, Jensen-Shannon "
                   f"{entry['unigram_js_nats']:.4f}; {100 * entry['val_tokens_unseen_in_train']:.3f}% of validation "
                   f"tokens never occur in training")
    out += [f"warning: {w}" for w in overlap.warnings(entry)]
    return out


def save_overlap(dataset_dir, entry):
    from ms_llm.fileio import atomic_write_bytes

    path = os.path.join(dataset_dir, MANIFEST)
    if entry is None or not os.access(dataset_dir, os.W_OK):
        return False
    try:
        with open(path, encoding="utf-8") as f:
            m = json.load(f)
        m["overlap"] = entry
        atomic_write_bytes(path, json.dumps(m, indent=1).encode("utf-8"))
    except (OSError, ValueError):
        return False
    return True
