"""Corpus files → tokens → documents joined by an end-of-document token → packed samples of `seq_length + 1`
int32 tokens → sharded MindRecord (train and val) + `manifest.json`.

Streaming: documents are read chunk by chunk, tokenized by `workers` processes, packed and written while the
rest of the corpus is still being read, so memory does not grow with the corpus. Results are consumed in
input order, so the files are byte-identical whatever the number of workers.

Train/validation split:
  * many documents: a document goes to validation when a hash of its text falls in the lowest `val_fraction`
    of the hash range, so adding files never moves a document from one split to the other (and exact
    duplicates land in the same split);
  * a single document (one text file, like the quickstart's sample): the last `val_fraction` of its tokens,
    as nanoGPT does, so train and val never share text.

Everything is written into a temporary folder next to `output_dir` and moved into place when complete: an
error, Ctrl-C or a full disk leaves the previous dataset (if any) untouched and no partial one behind.
"""
import contextlib
import ctypes
import datetime
import errno
import json
import os
import shutil
import tempfile

import numpy as np

from ms_llm.data import encode
from ms_llm.data.manifest import MANIFEST, SCHEMA_VERSION
from ms_llm.data.overlap import SplitOverlap, shingle_tokens, warnings as overlap_warnings
from ms_llm.data.progress import Progress
from ms_llm.data.shards import DEFAULT_SHARD_MB, Packer, ShardWriter, import_mindrecord, pack
from ms_llm.data.sources import Source, expand_inputs, is_jsonl
from ms_llm.data.stats import SplitStats
from ms_llm.data.tokenizers import CharTokenizer, build_tokenizer
from ms_llm.data.workers import WorkerDied, default_workers, ordered_map
from ms_llm.errors import UserError

__all__ = ["preprocess", "pack"]

SMALL_INPUT = 4 << 20  # below this many bytes, tokenize in this process: starting workers would cost more
SPLITS = ("train", "val")
TAIL_READ = 1 << 22  # tokens per read when packing a single document's token file
SCRATCH = "tokens.tmp"  # a single document's tokens, before they are split and packed


class _SingleDocument(Exception):
    """A multi-file or JSONL source turned out to hold one document: redo it with the token-tail split."""


def preprocess(source, output_dir, seq_length, tokenizer="char", val_fraction=0.1, text_field="text",
               overwrite=False, log=print, workers=None, skip_bad=False, shard_mb=DEFAULT_SHARD_MB):
    """Build the dataset in a temporary folder next to `output_dir`, then move it into place.

    `source`: a path, folder or glob, or a list of them. An existing dataset is only replaced when
    `overwrite` is set, and only after the new one is complete. Returns the manifest dict.
    """
    if os.path.exists(os.path.join(output_dir, MANIFEST)) and not overwrite:
        raise UserError(f"'{output_dir}' already holds a dataset (manifest.json). Choose another output folder, "
                        f"or pass --overwrite to replace it.")
    files = expand_inputs(source)
    workers = default_workers() if workers is None else max(1, int(workers))
    total = sum(os.path.getsize(f) for f in files)
    job = Job(files, output_dir, seq_length, tokenizer, val_fraction, text_field, skip_bad, shard_mb << 20,
              0 if total < SMALL_INPUT else workers, log)
    parent = os.path.dirname(os.path.abspath(output_dir)) or "."
    os.makedirs(parent, exist_ok=True)
    remove_stale_temps(parent, os.path.basename(os.path.abspath(output_dir)))
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(output_dir))}.preprocess-{os.getpid()}-",
                           dir=parent)
    os.chmod(tmp, 0o755)
    try:
        try:
            try:
                manifest = job.run(tmp, tail=len(files) == 1 and not is_jsonl(files[0]))
            except _SingleDocument:
                for name in os.listdir(tmp):
                    os.remove(os.path.join(tmp, name))
                manifest = job.run(tmp, tail=True)
            with open(os.path.join(tmp, MANIFEST), "w", encoding="utf-8") as f:
                json.dump(manifest, f, indent=1)
        except (OSError, RuntimeError) as e:
            error = write_error(e, tmp)
            if error is None:
                raise
            need, read = job.bytes_needed()
            shutil.rmtree(tmp, ignore_errors=True)  # before measuring what is free
            raise write_failure(error, output_dir, parent, need, read) from None
        except WorkerDied as e:
            raise WorkerDied(f"{e} Nothing was replaced: the partial dataset was removed and any existing "
                             f"'{output_dir}' is unchanged.") from None
        move_into_place(tmp, output_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    tr, va = manifest["splits"]["train"], manifest["splits"]["val"]
    log(f"preprocessed {describe_inputs(files)}: {manifest['source']['documents']:,} document(s), "
        f"{tr['tokens'] + va['tokens']:,} tokens, vocab {manifest['vocab_size']} ({manifest['tokenizer']['kind']}) "
        f"→ {tr['samples']:,} train / {va['samples']:,} val samples of {seq_length + 1} tokens in '{output_dir}'"
        + (f" ({manifest['bad_lines']:,} bad line(s) skipped)" if manifest.get("bad_lines") else "")
        + (f" in {manifest['seconds']:.1f} s" if manifest.get("seconds", 0) >= 1 else ""))
    return manifest


class Job:
    def __init__(self, files, output_dir, seq_length, tokenizer, val_fraction, text_field, skip_bad, shard_bytes,
                 workers, log):
        self.files, self.output_dir, self.T = files, output_dir, seq_length
        self.tokenizer_name, self.val_fraction, self.text_field = tokenizer, val_fraction, text_field
        self.skip_bad, self.shard_bytes, self.workers, self.log = skip_bad, shard_bytes, workers, log
        self.bad_examples, self.nbad = [], 0
        self.progress, self.tail = None, False

    def bytes_needed(self):
        """(about how many bytes the dataset needs on disk, the share of the input read so far): 4 bytes per token
        of the samples (which overlap by one token), twice for a single document (its token file, then the
        shards beside it), extrapolated from the tokens of the input read so far; None before any was read."""
        p = self.progress
        read = p.done / p.total if p is not None else 0.0
        if read <= 0 or not p.tokens:
            return None, read
        return 4 * p.tokens / read * (self.T + 1) / self.T * (2 if self.tail else 1), read

    # -- reading -------------------------------------------------------------------------------------------
    def chunks(self, sources):
        for i, s in enumerate(sources):
            yield from s.chunks(i)

    def encoded(self, sources, spec, chars_only=False, progress=None, meanwhile=None):
        """(chunk, Encoded) in input order; bad documents are raised or counted here. `meanwhile()` runs in this
        thread while the workers start (see ordered_map)."""
        args = (spec, self.text_field, self.val_fraction, chars_only)
        results = ordered_map(encode.encode_chunk, self.chunks(sources), self.workers, encode.init_worker, args,
                              meanwhile=meanwhile)
        try:
            for chunk, enc in results:
                if enc.nbad:
                    self.record_bad(sources[chunk.file_index].path, enc, chars_only)
                if progress is not None:
                    progress.update(chunk.progress, len(enc.lengths), len(enc.tokens))
                yield chunk, enc
        finally:
            results.close()  # stop the workers now, not when the traceback is freed

    def record_bad(self, path, enc, counted_already):
        line, offset, reason = enc.bad[0]
        where = f"line {line}" if line else f"byte offset {offset:,}"
        if offset is not None and line:
            where += f" (byte offset {offset:,})"
        if not self.skip_bad:
            raise UserError(f"data source '{path}' {where} {reason}. "
                            + (f"Each line of a JSONL file must be one object such as {{\"{self.text_field}\": "
                               f"\"...\"}} (set --text-field / data.text_field to the key that holds the text). "
                               if line else "Convert the file to UTF-8. ")
                            + "Or pass --skip-bad to count and skip such lines.")
        if counted_already:
            return  # the vocabulary pass sees the same bad lines as the tokenizing pass: count them once
        self.nbad += enc.nbad
        for line, offset, reason in enc.bad:
            if len(self.bad_examples) < encode.MAX_REPORTED:
                self.bad_examples.append(f"{path}:{line or 'offset ' + format(offset, ',')}: {reason}")

    def build_tokenizer(self, sources):
        if self.tokenizer_name != "char":
            tok = build_tokenizer(self.tokenizer_name)
            probe = first_text(sources[0].path, self.text_field)
            problem = getattr(tok, "round_trip_problem", lambda _: None)(probe)
            if problem:
                self.log(f"warning: {problem}")
            return tok
        chars = set()
        with contextlib.closing(self.encoded(sources, None, chars_only=True)) as results:
            for _, enc in results:
                chars.update(enc.chars)
        return CharTokenizer(sorted(chars))

    # -- one run -------------------------------------------------------------------------------------------
    def run(self, tmp, tail):
        self.tail = tail
        sources = [Source(f) for f in self.files]
        self.bad_examples, self.nbad = [], 0
        tok = self.build_tokenizer(sources)
        stats = {s: SplitStats(tok.vocab_size) for s in SPLITS}
        self.overlap = SplitOverlap(shingle_tokens(tok.spec(), tok))  # near-copies and shift between the splits
        progress = self.progress = Progress(sum(s.size for s in sources), "preprocess", self.log)
        try:
            if tail:
                shards, documents = self.run_tail(tmp, tok, sources, stats, progress)
            else:
                shards, documents = self.run_hashed(tmp, tok, sources, stats, progress)
        finally:
            seconds = progress.close()
        if documents == 0:
            raise UserError(f"data source {describe_inputs(self.files)} holds no text (empty files or no non-empty "
                            f"'{self.text_field}' fields). Point data.source at a corpus with content.")
        for name in SPLITS:
            if not shards[name] and not (name == "val" and self.val_fraction == 0):  # 0: no validation, on request
                st = stats[name]
                why = "" if tail else (f" (documents go to validation by a hash of their text; {documents:,} "
                                       f"document(s) with val_fraction {self.val_fraction} left this split almost "
                                       f"empty)")
                raise UserError(f"data source {describe_inputs(self.files)} is too short: its {name} split has "
                                f"{st.tokens} tokens{why}, fewer than one sample of seq_length + 1 = {self.T + 1}. "
                                f"Use a longer corpus, a smaller model.seq_length, or a different data.val_fraction.")
        if self.nbad:
            self.log(f"skipped {self.nbad:,} bad line(s) (--skip-bad); the first: " + "; ".join(self.bad_examples[:5]))
        return self.manifest(tok, sources, stats, shards, documents, tail, seconds)

    def run_hashed(self, tmp, tok, sources, stats, progress):
        writers = {s: ShardWriter(tmp, s, self.T + 1, self.shard_bytes) for s in SPLITS}
        packers = {s: Packer(self.T) for s in SPLITS}
        documents, doc_val, doc_len = 0, False, 0
        # MindRecord takes seconds to import: while the workers start, in this thread (a thread still importing
        # MindSpore when an error ended the process made its exit crash)
        results = self.encoded(sources, tok.spec(), progress=progress, meanwhile=import_mindrecord)
        with contextlib.closing(results):
            for chunk, enc in results:
                if chunk.jsonl:
                    piece_val = enc.val
                    documents += len(enc.lengths)
                    for name, sel in (("train", ~enc.val), ("val", enc.val)):
                        stats[name].add_documents(enc.lengths[sel])
                elif len(enc.lengths):  # a text segment: its document's split was decided at its first segment
                    if chunk.doc_start:
                        doc_val, doc_len = bool(enc.val[0]), 0
                        documents += 1
                    piece_val = np.array([doc_val])
                    doc_len += int(enc.lengths[0])
                    if chunk.doc_end:
                        stats["val" if doc_val else "train"].add_documents([doc_len])
                else:
                    continue
                span = enc.lengths + (1 if chunk.jsonl or chunk.doc_end else 0)
                mask = np.repeat(piece_val, span)
                for name, sel in (("train", ~mask), ("val", mask)):
                    toks = enc.tokens[sel] if not sel.all() else enc.tokens
                    if len(toks):
                        stats[name].add_tokens(toks)
                        self.overlap.add(name, toks)
                        writers[name].write(packers[name].add(toks))
        if documents == 1:
            raise _SingleDocument()
        return self.close_splits(writers, stats), documents

    def run_tail(self, tmp, tok, sources, stats, progress):
        """One document: its tokens go to a scratch file, then the last val_fraction of them is validation."""
        path = os.path.join(tmp, SCRATCH)
        documents, length = 0, 0
        with open(path, "wb") as f:
            with contextlib.closing(self.encoded(sources, tok.spec(), progress=progress)) as results:
                for chunk, enc in results:
                    if len(enc.lengths):
                        documents += len(enc.lengths) if chunk.jsonl else int(chunk.doc_start)
                        length += int(enc.lengths.sum())
                        f.write(enc.tokens.tobytes())
        n = os.path.getsize(path) // 4
        n_val = int(round(n * self.val_fraction))
        bounds = {"train": (0, n - n_val), "val": (n - n_val, n)}
        writers = {}
        for name, (lo, hi) in bounds.items():
            writer, packer = ShardWriter(tmp, name, self.T + 1, self.shard_bytes), Packer(self.T)
            for start in range(lo, hi, TAIL_READ):
                toks = np.fromfile(path, np.int32, count=min(TAIL_READ, hi - start), offset=4 * start)
                stats[name].add_tokens(toks)
                self.overlap.add(name, toks)
                writer.write(packer.add(toks))
            writers[name] = writer
        shards = self.close_splits(writers, stats)
        stats["train"].add_documents([length] if documents else [])
        for name in SPLITS:  # both splits hold part of the same document
            stats[name].documents = documents
        os.remove(path)
        return shards, documents

    def close_splits(self, writers, stats):
        """Every token is in: the overlap entry is measured and the sketch let go before the splits are closed, since
        closing builds each shard's MindRecord index in memory (~1.4 KB a row, 90 MB for a full 256 MB shard) and the
        sketch's buffers (up to ~36 MiB) need not lie under it, nor the free heap the stream left behind."""
        self.overlap_entry = self.overlap.result(stats["train"].counts, stats["val"].counts)
        self.overlap = None
        return_free_heap()
        return {s: w.close() for s, w in writers.items()}

    def manifest(self, tok, sources, stats, shards, documents, tail, seconds):
        for line in overlap_warnings(self.overlap_entry):
            self.log(f"warning: {line}")
        splits = {}
        for name in SPLITS:
            s = stats[name].to_dict()
            splits[name] = {"samples": sum(x["samples"] for x in shards[name]), "tokens": s["tokens"],
                            "documents": s["documents"], "shards": shards[name]}
            if len(shards[name]) == 1:  # what readers of schema 1 look for
                splits[name]["file"] = shards[name][0]["file"]
        files = [{"path": os.path.abspath(s.path), "bytes": s.size, "sha256": s.sha256} for s in sources]
        source = dict(files[0], documents=documents) if len(files) == 1 else {
            "files": len(files), "bytes": sum(f["bytes"] for f in files), "documents": documents}
        return {
            "schema_version": SCHEMA_VERSION,
            "seq_length": self.T,
            "sample_length": self.T + 1,
            "tokenizer": tok.spec(),
            "vocab_size": tok.vocab_size,
            "eod_id": tok.eod_id,
            "max_token_id": max(st.max_id for st in stats.values()),
            "splits": splits,
            "split_method": "token tail of a single document" if tail else "documents by hash",
            "stats": {name: {k: v for k, v in stats[name].to_dict().items() if k not in ("documents", "tokens")}
                      for name in SPLITS},
            "overlap": self.overlap_entry,
            "source": source,
            "sources": files,
            "val_fraction": self.val_fraction,
            "text_field": self.text_field,
            "bad_lines": self.nbad,
            "seconds": round(seconds, 2),
            "created": datetime.datetime.now().isoformat(timespec="seconds"),
        }


def keep_large_arrays_off_the_heap(threshold=1 << 20):
    """For a process that only preprocesses (`ms-llm preprocess`): every allocation of `threshold` bytes or more
    gets pages of its own, handed back to the system when freed. Left to itself, glibc raises that threshold to
    the largest block freed so far (here the 8 MB groups of rows handed to MindRecord), after which the chunks,
    token arrays and samples that stream through this process come from the heap, whose free space then grew
    with the corpus: over 60 MB of BPE JSONL the main process went from 213 to 239 MiB anonymous memory, its free
    heap from 8 to 52 MiB; with this setting 204 to 208 MiB, 18 MiB free throughout. It holds for the whole
    process and for good, so the command sets it, not preprocess(), which a training run may call. Returns
    whether it was set (not where the C library is not glibc)."""
    m_mmap_threshold = -3  # glibc's malloc.h
    try:
        return bool(ctypes.CDLL(None).mallopt(m_mmap_threshold, int(threshold)))
    except (OSError, AttributeError):
        return False


def return_free_heap():
    """Give the heap's free pages back to the system (glibc's malloc_trim; elsewhere nothing). After 480 MB of JSONL
    the main process held 34 MB of free heap (small blocks freed in between others that stay), on top of which the
    MindRecord indexes were built."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def first_text(path, text_field, limit=1 << 16):
    """The beginning of the corpus's first document: the probe for the tokenizer round-trip check."""
    import gzip

    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            head = f.read(limit).decode("utf-8", errors="replace")
    except (OSError, EOFError):
        return ""
    if not is_jsonl(path):
        return head
    for line in head.split("\n"):
        try:
            value = json.loads(line).get(text_field)
        except (ValueError, AttributeError):
            continue
        if isinstance(value, str) and value:
            return value
    return ""


def describe_inputs(files):
    return f"'{files[0]}'" if len(files) == 1 else f"{len(files)} files ('{files[0]}', ...)"


def move_into_place(tmp, output_dir):
    if os.path.exists(output_dir):
        old = output_dir.rstrip("/") + ".old"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(output_dir, old)
        os.replace(tmp, output_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, output_dir)


def remove_stale_temps(parent, base):
    """Temporary folders of runs that were killed (kill -9, power loss): their process no longer exists."""
    prefix = f".{base}.preprocess-"
    for name in os.listdir(parent):
        if not name.startswith(prefix):
            continue
        try:
            pid = int(name[len(prefix):].split("-")[0])
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
        except (ValueError, PermissionError):
            continue


def write_error(e, tmp):
    """The OSError behind a failure to write the dataset, or None when `e` is something else."""
    if isinstance(e, OSError):
        return e
    # MindRecord's writer reports a full disk as a RuntimeError, checking the free space itself
    if "No free disk" in str(e) or "No space left" in str(e) or shutil.disk_usage(tmp).free < (64 << 20):
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), tmp)
    return None


def write_failure(e, output_dir, parent, need, read_fraction):
    """The one-paragraph explanation of a dataset that could not be written (see checkpoint.store.write_failure)."""
    if e.errno == errno.ENOSPC:
        try:
            free = f"{shutil.disk_usage(parent).free / 2**20:,.1f} MiB are free"
        except OSError:
            free = "the free space is unknown"
        need = (f"it needs about {need / 2**20:,.1f} MiB (estimated from the first {100 * read_fraction:.0f}% of "
                f"the input)" if need else "it needs about 4 bytes per token plus a few MB per shard")
        return UserError(f"the dataset for '{output_dir}' could not be written to '{parent}': the disk is full; "
                         f"{need} and {free}. Nothing was replaced: the partial dataset was removed and any existing "
                         f"'{output_dir}' is unchanged. Free space there or choose another --output-dir, then run "
                         f"again.")
    return UserError(f"writing the dataset for '{output_dir}' failed ({e.strerror or e}: {e.filename or parent}). "
                     f"Nothing was replaced: the partial dataset was removed. Check that the folder is writable, then "
                     f"run again.")
