"""`ms-llm preprocess --format chat|instruction`: JSONL conversations → rendered with the tokenizer's chat template →
token ids, loss mask (1 on the assistant's tokens) and segment ids (which conversation each token belongs to) →
samples packed several conversations each (or one, `--no-pack`) → sharded MindRecord with the three columns +
manifest.json.

The manifest records what makes the data: `format`, `columns`, `packed`, the chat template (its text, where it came
from, its special tokens: `sample --chat` renders prompts with the same one), and per split the conversations,
tokens, loss tokens and fill rate (`ms-llm data info` shows them), with the conversations cut to fit a sample.

The plain-text pipeline's guarantees hold: conversations go to validation by a hash of their line (adding files
moves none between splits); the result does not depend on the number of workers (results are consumed in input
order); everything is written into a temporary folder that is moved into place when complete, so an error or
Ctrl-C leaves any previous dataset untouched.
"""
import datetime
import json
import os
import shutil
import tempfile

import numpy as np

from ms_llm.data import chat
from ms_llm.data.chat_pack import COLUMNS, ConversationPacker
from ms_llm.data.manifest import MANIFEST, SCHEMA_VERSION
from ms_llm.data.preference import PairPacker
from ms_llm.data.overlap import SplitOverlap, shingle_tokens
from ms_llm.data.preprocess import (SMALL_INPUT, describe_inputs, move_into_place, remove_stale_temps, write_error,
                                   write_failure)
from ms_llm.data.progress import Progress
from ms_llm.data.shards import DEFAULT_SHARD_MB, ShardWriter
from ms_llm.data.sources import Source, expand_inputs, is_jsonl
from ms_llm.data.stats import SplitStats
from ms_llm.data.templates import ChatTemplate, find_template
from ms_llm.data.tokenizers import build_tokenizer
from ms_llm.data.workers import WorkerDied, default_workers, ordered_map
from ms_llm.errors import UserError

SPLITS = ("train", "val")


def chat_tokenizer(name, fmt):
    """The tokenizer of a chat dataset: one that reports character offsets (tokenizer.json, or byte with
    --chat-template); a char vocabulary built from the corpus would not hold the template's own text."""
    if name == "char":
        raise UserError(f"--format {fmt} with the char tokenizer: chat data is rendered with the model's chat "
                        f"template and tokenized with the model's tokenizer. Pass --tokenizer path/to/tokenizer.json "
                        f"(with its tokenizer_config.json beside it).")
    tok = build_tokenizer(name)
    if not hasattr(tok, "encode_with_offsets"):
        raise UserError(f"--format {fmt} with tokenizer '{name}' ({tok.kind}): the loss mask is found from each "
                        f"token's character offsets, which this tokenizer does not report. Use the model's "
                        f"tokenizer.json (Hugging Face tokenizers report them).")
    return tok


def preprocess_conversations(source, output_dir, seq_length, tokenizer, fmt, val_fraction=0.1, overwrite=False,
                             log=print, workers=None, skip_bad=False, shard_mb=DEFAULT_SHARD_MB, pack=True,
                             refuse_long=False, chat_template=None):
    """Build a chat/instruction dataset in `output_dir` (see the module docstring). Returns the manifest dict."""
    if fmt not in chat.FORMATS:
        raise UserError(f"--format {fmt!r}: the conversation formats are {', '.join(chat.FORMATS)}.")
    if os.path.exists(os.path.join(output_dir, MANIFEST)) and not overwrite:
        raise UserError(f"'{output_dir}' already holds a dataset (manifest.json). Choose another output folder, "
                        f"or pass --overwrite to replace it.")
    files = expand_inputs(source)
    not_jsonl = [f for f in files if not is_jsonl(f)]
    if not_jsonl:
        raise UserError(f"--format {fmt} reads JSONL (one conversation per line), but '{not_jsonl[0]}' is not a "
                        f".jsonl / .json(.gz) file. Convert it, or drop --format for plain text.")
    tok = chat_tokenizer(tokenizer, fmt)
    template = ChatTemplate.from_spec(find_template(getattr(tok, "path", None), chat_template))
    pad_id = tok.token_id(template.special_tokens["pad_token"]) if (
        "pad_token" in template.special_tokens and hasattr(tok, "token_id")) else None
    pad_id = tok.eod_id if pad_id is None else pad_id
    workers = default_workers() if workers is None else max(1, int(workers))
    total = sum(os.path.getsize(f) for f in files)
    parent = os.path.dirname(os.path.abspath(output_dir)) or "."
    os.makedirs(parent, exist_ok=True)
    base = os.path.basename(os.path.abspath(output_dir))
    remove_stale_temps(parent, base)
    tmp = tempfile.mkdtemp(prefix=f".{base}.preprocess-{os.getpid()}-", dir=parent)
    os.chmod(tmp, 0o755)
    job = _Job(files, tok, template, fmt, seq_length + 1, val_fraction, skip_bad, pack, refuse_long, pad_id,
               0 if total < SMALL_INPUT else workers, shard_mb << 20, log)
    try:
        try:  # the failures the plain-text pipeline explains, explained the same way (data/preprocess.py)
            manifest = job.run(tmp)
            with open(os.path.join(tmp, MANIFEST), "w", encoding="utf-8") as f:
                json.dump(manifest, f, indent=1)
        except (OSError, RuntimeError) as e:
            error = write_error(e, tmp)
            if error is None:
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # before measuring what is free
            raise write_failure(error, output_dir, parent, None, 0.0) from None
        except WorkerDied as e:
            raise WorkerDied(f"{e} Nothing was replaced: the partial dataset was removed and any existing "
                             f"'{output_dir}' is unchanged.") from None
        move_into_place(tmp, output_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if fmt == "preference":
        p = manifest["preference"]
        log(f"preprocessed {describe_inputs(files)} (preference): {p['train']['pairs'] + p['val']['pairs']:,} pairs "
            f"→ {p['train']['pairs']:,} train / {p['val']['pairs']:,} val samples of {seq_length + 1} tokens (one pair "
            f"each, fill rate {100 * (p['train']['fill_rate'] or 0):.1f}%); template from {template.source}"
            + (f"; {manifest['bad_lines']:,} bad line(s) skipped" if manifest["bad_lines"] else "")
            + f" in '{output_dir}'")
        return manifest
    ft = manifest["finetune"]
    tr, va = ft["train"], ft["val"]
    log(f"preprocessed {describe_inputs(files)} ({fmt}): {tr['conversations'] + va['conversations']:,} "
        f"conversations → {tr['samples']:,} train / {va['samples']:,} val samples of {seq_length + 1} tokens "
        f"({'packed' if pack else 'one per sample'}, fill rate {100 * (tr['fill_rate'] or 0):.1f}%), "
        f"{100 * (tr['loss_fraction'] or 0):.1f}% of tokens in the loss; template from {template.source}"
        + (f"; {ft['truncated']:,} conversation(s) cut to {seq_length + 1} tokens" if ft["truncated"] else "")
        + (f"; {ft['dropped']:,} dropped (no response token within the sample)" if ft["dropped"] else "")
        + (f"; {manifest['bad_lines']:,} bad line(s) skipped" if manifest["bad_lines"] else "")
        + f" in '{output_dir}'")
    return manifest


class _Job:
    def __init__(self, files, tok, template, fmt, width, val_fraction, skip_bad, pack, refuse_long, pad_id, workers,
                 shard_bytes, log):
        self.files, self.tok, self.template, self.fmt, self.width = files, tok, template, fmt, width
        self.val_fraction, self.skip_bad, self.pack, self.refuse_long = val_fraction, skip_bad, pack, refuse_long
        self.pad_id, self.workers, self.shard_bytes, self.log = pad_id, workers, shard_bytes, log
        self.nbad, self.bad_examples, self.truncated, self.dropped = 0, [], 0, 0
        self.too_long = 0  # preference pairs longer than a sample, skipped (--skip-bad)

    def chunks(self, sources):
        for i, s in enumerate(sources):
            yield from s.chunks(i)

    def bad(self, path, enc):
        line, _, reason = enc.bad[0]
        if not self.skip_bad:
            raise UserError(f"data source '{path}' line {line} {reason}. Fix the line, or pass --skip-bad to count "
                            f"and skip such lines.")
        self.nbad += enc.nbad
        self.bad_examples += [f"{path}:{ln}: {why}" for ln, _, why in enc.bad][: 5 - len(self.bad_examples)]

    def fit(self, path, line, ids, mask):
        """The conversation cut to one sample, or None when nothing of its response is left."""
        if len(ids) <= self.width:
            return ids, mask
        if self.refuse_long:
            raise UserError(f"data source '{path}' line {line}: the conversation is {len(ids):,} tokens, longer than "
                            f"a sample (seq_length + 1 = {self.width}). Raise --seq-length, shorten it, or drop "
                            f"--refuse-long to cut such conversations to the sample length (they are counted).")
        self.truncated += 1
        ids, mask = ids[: self.width], mask[: self.width]
        if not mask.any():
            self.dropped += 1
            return None
        return ids, mask

    def fit_pair(self, path, line, ids, mask, first):
        """A preference pair as it is (both sequences in one sample), or None when it is longer and --skip-bad."""
        if len(ids) <= self.width:
            return ids, mask, first
        if not self.skip_bad:
            raise UserError(f"data source '{path}' line {line}: the pair (prompt + chosen, then prompt + rejected) is "
                            f"{len(ids):,} tokens ({first:,} + {len(ids) - first:,}), longer than a sample "
                            f"(seq_length + 1 = {self.width}): both sequences of a pair go in one sample, and a cut "
                            f"response would be scored on a part of it. Raise --seq-length (to at least "
                            f"{len(ids) - 1}), shorten the line's prompt or responses, or pass --skip-bad to skip "
                            f"such pairs (they are counted in the manifest).")
        self.too_long += 1
        if len(self.bad_examples) < 5:
            self.bad_examples.append(f"{path}:{line}: pair of {len(ids)} tokens longer than a sample")
        return None

    def run(self, tmp):
        sources = [Source(f) for f in self.files]
        writers = {s: ShardWriter(tmp, s, self.width, self.shard_bytes, COLUMNS) for s in SPLITS}
        packers = {s: (PairPacker(self.width, self.pad_id) if self.fmt == "preference" else
                       ConversationPacker(self.width, self.pad_id, self.pack)) for s in SPLITS}
        stats = {s: SplitStats(self.tok.vocab_size) for s in SPLITS}
        # near-copies between the splits, over the response tokens: what the validation loss counts (every
        # conversation shares the template's own text, which would read as copied)
        overlap = SplitOverlap(shingle_tokens(self.tok.spec(), self.tok))
        progress = Progress(sum(s.size for s in sources), "preprocess", self.log)
        args = (self.tok.spec(), self.template.spec(), self.fmt, self.val_fraction)
        results = ordered_map(chat.encode_chunk, self.chunks(sources), self.workers, chat.init_worker, args)
        try:
            for ch, enc in results:
                path = sources[ch.file_index].path
                if enc.nbad:
                    self.bad(path, enc)
                progress.update(ch.progress, len(enc.lengths), len(enc.tokens))
                starts = np.concatenate([[0], np.cumsum(enc.lengths)])
                for k in range(len(enc.lengths)):
                    a, b = starts[k], starts[k + 1]
                    if self.fmt == "preference":
                        fitted = self.fit_pair(path, int(enc.lines[k]), enc.tokens[a:b], enc.masks[a:b],
                                               int(enc.firsts[k]))
                    else:
                        fitted = self.fit(path, int(enc.lines[k]), enc.tokens[a:b], enc.masks[a:b])
                    if fitted is None:
                        continue
                    split = "val" if enc.val[k] else "train"
                    stats[split].add_tokens(fitted[0])
                    stats[split].add_documents([len(fitted[0])])
                    overlap.add(split, fitted[0][fitted[1] > 0])
                    writers[split].write(packers[split].add(*fitted))
        finally:
            results.close()
            seconds = progress.close()
        shards = {}
        for s in SPLITS:
            writers[s].write(packers[s].close())
            shards[s] = writers[s].close()
        if self.nbad or self.too_long:
            self.log(f"skipped {self.nbad + self.too_long:,} bad line(s) (--skip-bad)"
                     + (f", {self.too_long:,} of them pairs longer than a sample" if self.too_long else "")
                     + "; the first: " + "; ".join(self.bad_examples))
        conversations = sum(p.conversations for p in packers.values())
        if conversations == 0:
            raise UserError(f"data source {describe_inputs(self.files)} holds no usable conversation. Each line must "
                            f"be a {self.fmt} record "
                            f"({'docs/preference.md' if self.fmt == 'preference' else 'docs/finetuning.md'}).")
        if not shards["val"]:
            self.log(f"note: no conversation went to validation (val_fraction {self.val_fraction}, by a hash of each "
                     f"line): there will be no validation loss")
        if not shards["train"]:
            raise UserError(f"data source {describe_inputs(self.files)}: every one of its {conversations:,} "
                            f"conversation(s) went to validation (val_fraction {self.val_fraction}, by a hash of "
                            f"each line). Use more conversations or a smaller --val-fraction.")
        entry = overlap.result(stats["train"].counts, stats["val"].counts, self.log)
        return self.manifest(sources, packers, stats, shards, seconds, entry)

    def manifest(self, sources, packers, stats, shards, seconds, overlap):
        splits = {}
        for name in SPLITS:
            st = stats[name].to_dict()
            splits[name] = {"samples": sum(x["samples"] for x in shards[name]), "tokens": st["tokens"],
                            "documents": st["documents"], "shards": shards[name]}
        files = [{"path": os.path.abspath(s.path), "bytes": s.size, "sha256": s.sha256} for s in sources]
        documents = sum(p.conversations for p in packers.values())
        source = dict(files[0], documents=documents) if len(files) == 1 else {
            "files": len(files), "bytes": sum(f["bytes"] for f in files), "documents": documents}
        return {
            "schema_version": SCHEMA_VERSION,
            "seq_length": self.width - 1,
            "sample_length": self.width,
            "tokenizer": self.tok.spec(),
            "vocab_size": self.tok.vocab_size,
            "eod_id": self.tok.eod_id,
            "max_token_id": max(st.max_id for st in stats.values()),
            "format": self.fmt,
            "columns": list(COLUMNS),
            "packed": self.pack or self.fmt == "preference",  # a pair's two sequences are two documents
            "pad_id": int(self.pad_id),
            "chat_template": self.template.spec(),
            **({"preference": {"train": packers["train"].stats(), "val": packers["val"].stats(),
                               "too_long": self.too_long}} if self.fmt == "preference" else
               {"finetune": {"train": packers["train"].stats(), "val": packers["val"].stats(),
                             "truncated": self.truncated, "dropped": self.dropped}}),
            "splits": splits,
            "split_method": "conversations by hash",
            "stats": {name: {k: v for k, v in stats[name].to_dict().items() if k not in ("documents", "tokens")}
                      for name in SPLITS},
            "overlap": overlap,
            "source": source,
            "sources": files,
            "val_fraction": self.val_fraction,
            "bad_lines": self.nbad + self.too_long,
            "seconds": round(seconds, 2),
            "created": datetime.datetime.now().isoformat(timespec="seconds"),
        }
