"""Corpus inputs → a stream of raw chunks for the tokenizing workers.

An input is a file, a folder (searched recursively) or a glob. JSONL files (`.jsonl`, `.json`, optionally
`.gz`) hold one document per line; any other file is one document of plain text (`.txt`, `.txt.gz`, ...).

The main process only cuts bytes: JSONL into blocks of whole lines, text into segments that end at a line
start. Decoding, JSON parsing and tokenizing happen in the workers, so reading never limits throughput and
memory holds only the chunks in flight. A chunk carries where it came from (file, first line, byte offset)
so that a worker can name the exact line or byte of a bad document. Chunks depend only on the input, never
on the number of workers: that is what makes the output identical whatever `--workers` is.
"""
import glob
import gzip
import hashlib
import os
import zlib
from dataclasses import dataclass

from ms_llm.errors import UserError

JSONL_SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz")
TEXT_SUFFIXES = (".txt", ".txt.gz", ".text", ".md")
BLOCK = 1 << 20  # bytes of JSONL lines per chunk: big enough to amortise IPC, small enough to spread over workers
SEGMENT = 4 << 20  # a text document longer than this is tokenized in segments cut at line starts


@dataclass
class Chunk:
    file_index: int
    data: bytes
    first_line: int  # 1-based line number of data[0]
    offset: int  # byte offset of data[0] in the (decompressed) file
    jsonl: bool
    doc_start: bool = True  # text: the first segment of its document
    doc_end: bool = True  # text: the last segment (the end-of-document token follows it)
    progress: int = 0  # bytes of the input file (compressed, as on disk) this chunk accounts for


def is_jsonl(path):
    return path.endswith(JSONL_SUFFIXES)


def expand_inputs(inputs):
    """Files named by `inputs` (files, folders, globs), in a stable order, each once."""
    if isinstance(inputs, str):
        inputs = [inputs]
    files = []
    for item in inputs:
        if os.path.isdir(item):
            found = sorted(os.path.join(root, f) for root, _, names in os.walk(item) for f in names
                           if f.endswith(JSONL_SUFFIXES + TEXT_SUFFIXES) and not f.startswith("."))
            if not found:
                raise UserError(f"input folder '{item}' holds no .txt, .jsonl or .jsonl.gz files. Point --input at "
                                f"the corpus files (folders are searched recursively).")
            files += found
        elif os.path.isfile(item):
            files.append(item)
        elif glob.has_magic(item):
            found = sorted(f for f in glob.glob(item, recursive=True) if os.path.isfile(f))
            if not found:
                raise UserError(f"input pattern '{item}' matches no files. Check the pattern (quote it so the shell "
                                f"does not expand it, e.g. --input 'data/*.jsonl').")
            files += found
        else:
            raise UserError(f"data source '{item}' does not exist. Set data.source (or --input) to text or JSONL "
                            f"files, folders or globs.")
    seen, out = set(), []
    for f in files:
        key = os.path.realpath(f)
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out


class _HashingReader:
    """A raw file that hashes (SHA-256) what is read through it and counts the bytes, for .gz sources whose
    checksum is of the file on disk while the text is read decompressed."""

    def __init__(self, f):
        self.f, self.sha, self.pos = f, hashlib.sha256(), 0

    def read(self, n=-1):
        b = self.f.read(n)
        self.sha.update(b)
        self.pos += len(b)
        return b

    def readable(self):
        return True

    def close(self):
        self.f.close()


class Source:
    """One input file read as a stream of bytes; `sha256` and `bytes` are ready once it has been read."""

    def __init__(self, path):
        self.path = path
        self.size = os.path.getsize(path)
        self.gz = path.endswith(".gz")
        self.jsonl = is_jsonl(path)
        self.sha256 = None

    def blocks(self, size):
        try:
            raw = _HashingReader(open(self.path, "rb"))
        except OSError as e:
            raise UserError(f"data source '{self.path}' cannot be read ({e.strerror}). Check its permissions.") from None
        stream = gzip.GzipFile(fileobj=raw, mode="rb") if self.gz else raw
        try:
            while True:
                try:
                    b = stream.read(size)
                except (OSError, EOFError, zlib.error) as e:
                    raise UserError(f"data source '{self.path}' is not a valid gzip file or is truncated ({e}) after "
                                    f"{raw.pos:,} bytes. Re-download or re-compress it.") from None
                if not b:
                    break
                yield b, raw.pos
        finally:
            raw.close()
        self.sha256 = raw.sha.hexdigest()

    def chunks(self, file_index):
        return self._jsonl_chunks(file_index) if self.jsonl else self._text_chunks(file_index)

    def _jsonl_chunks(self, file_index):
        carry, line, offset, done = b"", 1, 0, 0
        for block, pos in self.blocks(BLOCK):
            data = carry + block
            cut = data.rfind(b"\n") + 1
            if cut == 0:  # a line longer than a block: keep reading
                carry = data
                continue
            chunk = Chunk(file_index, data[:cut], line, offset, True, progress=pos - done)
            done = pos
            line += chunk.data.count(b"\n")
            offset += cut
            carry = data[cut:]
            yield chunk
        if carry:
            yield Chunk(file_index, carry, line, offset, True, progress=self.size - done)
        elif done < self.size:
            yield Chunk(file_index, b"", line, offset, True, progress=self.size - done)

    def _text_chunks(self, file_index):
        """Segments of at most SEGMENT bytes, each ending just before a line that starts with a non-space
        character, so that tokenizers that split on whitespace see the same words either way; a file shorter
        than SEGMENT is one segment, tokenized exactly as a whole."""
        carry, line, offset, done, first = b"", 1, 0, 0, True
        pending = None
        for block, pos in self.blocks(SEGMENT):
            data = carry + block
            cut = line_start_cut(data) if len(data) >= SEGMENT else 0
            if cut == 0:
                carry = data
                continue
            if pending is not None:
                yield pending
            pending = Chunk(file_index, data[:cut], line, offset, False, doc_start=first, doc_end=False,
                            progress=pos - done)
            done, first = pos, False
            line += pending.data.count(b"\n")
            offset += cut
            carry = data[cut:]
        if carry or pending is None:
            if pending is not None:
                yield pending
            yield Chunk(file_index, carry, line, offset, False, doc_start=first, doc_end=True,
                        progress=self.size - done)
        else:
            pending.doc_end = True
            pending.progress += self.size - done
            yield pending


def line_start_cut(data):
    """Where to end a text segment: after the last newline that is followed by a non-whitespace byte
    (else after the last newline; else at the last UTF-8 character boundary)."""
    i = len(data) - 1
    while True:
        i = data.rfind(b"\n", 0, i)
        if i < 0 or i < len(data) // 2:
            break
        if data[i + 1:i + 2] not in (b" ", b"\t", b"\r", b"\n", b""):
            return i + 1
    nl = data.rfind(b"\n")
    if nl > 0:
        return nl + 1
    i = len(data) - 1  # no newline at all: cut before the last character that starts a UTF-8 sequence
    while i > 0 and (data[i] & 0xC0) == 0x80:
        i -= 1
    return i if i > 0 else len(data)
