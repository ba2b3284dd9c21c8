"""Worker side of preprocessing: one raw chunk (see `sources.Chunk`) → the token ids of its documents.

Runs in worker processes started with `spawn`, so it imports neither MindSpore nor anything that does:
a worker costs ~50 MB and starts in well under a second. A bad document never raises here: the chunk's
result carries (line, byte offset, reason) and the main process, which knows the file name, decides
whether that is an error or a skipped line (`--skip-bad`).
"""
import hashlib
import json
import os
import signal
from dataclasses import dataclass, field
from typing import List

import numpy as np

MAX_REPORTED = 20  # bad lines listed by name; the rest are counted


@dataclass
class Encoded:
    tokens: np.ndarray  # int32: each document's ids, followed by the end-of-document id where a document ends
    lengths: np.ndarray  # int64: tokens of each document piece, without the end-of-document id
    val: np.ndarray  # bool: the piece's document belongs to the validation split (by a hash of its text)
    bad: List[tuple] = field(default_factory=list)  # (line or None, byte offset, reason), at most MAX_REPORTED
    nbad: int = 0
    chars: str = ""  # vocabulary pass (char tokenizer): the distinct characters of the chunk


class Encoder:
    def __init__(self, tokenizer, text_field="text", val_fraction=0.1, chars_only=False):
        self.tok, self.text_field, self.chars_only = tokenizer, text_field, chars_only
        # a document goes to validation when the first 8 bytes of its BLAKE2b hash fall below this
        self.val_threshold = int(val_fraction * 2 ** 64)

    def is_val(self, text):
        h = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()
        return int.from_bytes(h, "little") < self.val_threshold

    def __call__(self, chunk):
        bad = []
        texts, lines = self.texts(chunk, bad)
        if self.chars_only:
            chars = set()
            for t in texts:
                chars.update(t)
            return Encoded(np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros(0, bool), bad[:MAX_REPORTED],
                           len(bad), "".join(sorted(chars)))
        ids = self._encode(texts, lines, chunk, bad)
        keep = [i for i, x in enumerate(ids) if x is not None]
        ids = [ids[i] for i in keep]
        texts = [texts[i] for i in keep]
        lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
        ends = np.ones(len(ids), bool) if chunk.jsonl else np.array([chunk.doc_end] * len(ids), bool)
        out = np.empty(int(lengths.sum() + ends.sum()), np.int32)
        pos = 0
        for x, end in zip(ids, ends):
            out[pos:pos + len(x)] = x
            pos += len(x)
            if end:
                out[pos] = self.tok.eod_id
                pos += 1
        val = np.fromiter((self.is_val(t) for t in texts), dtype=bool, count=len(texts))
        return Encoded(out, lengths, val, bad[:MAX_REPORTED], len(bad))

    def texts(self, chunk, bad):
        """The chunk's document texts and their line numbers (None for text files); problems go to `bad`."""
        return self._jsonl(chunk, bad) if chunk.jsonl else self._text(chunk, bad)

    def _text(self, chunk, bad):
        try:
            text = chunk.data.decode("utf-8")
        except UnicodeDecodeError as e:
            bad.append((None, chunk.offset + e.start, f"bytes {chunk.data[e.start:e.start + 4]!r} are not UTF-8"))
            text = chunk.data.decode("utf-8", errors="replace")
        if chunk.doc_start and chunk.doc_end and not text.strip():
            return [], []  # an empty or blank file is no document
        return [text], [None]

    def _jsonl(self, chunk, bad):
        try:
            lines = chunk.data.decode("utf-8").split("\n")
        except UnicodeDecodeError:
            lines = []
            offset = chunk.offset
            for n, raw in enumerate(chunk.data.split(b"\n")):
                try:
                    lines.append(raw.decode("utf-8"))
                except UnicodeDecodeError as e:
                    bad.append((chunk.first_line + n, offset + e.start,
                                f"bytes {raw[e.start:e.start + 4]!r} are not UTF-8"))
                    lines.append("")
                offset += len(raw) + 1
        texts, where = [], []
        key = self.text_field
        for n, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as e:
                bad.append((chunk.first_line + n, None, f"is not valid JSON ({getattr(e, 'msg', e)})"))
                continue
            value = record.get(key) if isinstance(record, dict) else None
            if not isinstance(value, str):
                bad.append((chunk.first_line + n, None, f"has no string field '{key}'"))
                continue
            if value:
                texts.append(value)
                where.append(chunk.first_line + n)
        return texts, where

    def _encode(self, texts, lines, chunk, bad):
        """Token ids per text; None for a text the tokenizer refuses (e.g. a lone surrogate from a JSON escape)."""
        if not texts:
            return []
        try:
            return self.tok.encode_batch(texts)
        except Exception:  # find which document it was, keep the others
            out = []
            for t, line in zip(texts, lines):
                try:
                    out.append(self.tok.encode(t))
                except Exception as e:
                    bad.append((line, None if line else chunk.offset, f"cannot be tokenized ({e})"))
                    out.append(None)
            return out


_encoder = None


def init_worker(spec, text_field, val_fraction, chars_only):
    """Pool initializer: Ctrl-C is the main process's to handle (it stops the pool and cleans up), and the
    tokenizer runs single-threaded because the workers are the parallelism."""
    global _encoder
    from ms_llm.data.tokenizers import from_spec
    from ms_llm.data.workers import in_worker

    if in_worker():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        os.environ["TOKENIZERS_PARALLELISM"] = "false"

    _encoder = Encoder(from_spec(spec) if spec else None, text_field, val_fraction, chars_only)


def encode_chunk(chunk):
    return _encoder(chunk)
