"""Token stream → packed samples → MindRecord shard files.

Sample i of a split holds tokens [i*T, i*T + T + 1): consecutive samples overlap by one token so that every
token of the split is a prediction target exactly once. `Packer` does this on a stream (it keeps the at most
T tokens that wait for the next sample), so packing a split chunk by chunk gives exactly `pack()` of the
whole split.

A split is written as shards of at most `shard_bytes` of samples: `train.mindrecord`, then
`train.00001.mindrecord`, ... (the first shard's name does not depend on how many follow, so shards are
written while the corpus is still being read; a MindRecord file cannot be renamed afterwards, its name is
inside it). Rows are handed to MindRecord in groups whose size depends only on the sample length, which
keeps the files byte-identical however the stream was chunked.

A shard's `.db` index is built when its split is closed, not when the shard fills: MindRecord builds an index
in memory, about 1.4 KB per row (90 MB for a 256 MB shard of 1025-token rows), and built mid-run it landed on
top of the tokenizing workers' memory, so the peak grew with the corpus until the first shard filled. The
split is closed after the workers have stopped. The index is a function of the data file alone, so the files
are the same (FileWriter.commit runs the same generator right away).
"""
import importlib
import os
import stat

import numpy as np

from ms_llm.fileio import sha256_file

DEFAULT_SHARD_MB = 256
GROUP_BYTES = 8 << 20  # rows per write_raw_data call: at most 8192, at most 8 MiB


def pack(tokens, seq_length):
    """Samples of seq_length+1 tokens with stride seq_length (the last partial one is dropped)."""
    n = (len(tokens) - 1) // seq_length
    if n <= 0:
        return np.zeros((0, seq_length + 1), np.int32)
    windows = np.lib.stride_tricks.sliding_window_view(tokens[: n * seq_length + 1], seq_length + 1)
    return np.ascontiguousarray(windows[::seq_length], dtype=np.int32)


class Packer:
    """pack() over a stream of token arrays."""

    def __init__(self, seq_length):
        self.T = seq_length
        self.carry = np.zeros(0, np.int32)

    def add(self, tokens):
        buf = np.concatenate([self.carry, tokens]) if len(self.carry) else np.asarray(tokens, np.int32)
        samples = pack(buf, self.T)
        self.carry = buf[len(samples) * self.T:]
        return samples


def shard_name(split, k):
    return f"{split}.mindrecord" if k == 0 else f"{split}.{k:05d}.mindrecord"


def rows_per_group(sample_length):
    return max(1, min(8192, GROUP_BYTES // (4 * sample_length)))


class ShardWriter:
    """Appends samples to a split's shards in `directory`; `close()` returns the manifest entries."""

    def __init__(self, directory, split, sample_length, shard_bytes=DEFAULT_SHARD_MB << 20):
        self.dir, self.split, self.width = directory, split, sample_length
        self.per_shard = max(1, shard_bytes // (4 * sample_length))
        self.group = rows_per_group(sample_length)
        self.pending, self.npending = [], 0
        self.written = []  # (file name, samples) of the shards committed so far, in order
        self.writer, self.in_shard, self.index_later = None, 0, None

    def write(self, samples):
        while len(samples):
            room = self.per_shard - self.in_shard - self.npending
            take = samples[:room]
            self.pending.append(take)
            self.npending += len(take)
            samples = samples[room:]
            while self.npending >= self.group or (self.in_shard + self.npending == self.per_shard and self.npending):
                self._flush(min(self.group, self.npending))
            if self.in_shard == self.per_shard:
                self._finish_shard()

    def _flush(self, n):
        rows = np.concatenate(self.pending) if len(self.pending) > 1 else self.pending[0]
        group, rest = rows[:n], rows[n:]
        self.pending, self.npending = ([rest] if len(rest) else []), len(rest)
        if self.writer is None:
            if self.index_later is None:  # asked here: it imports MindSpore
                self.index_later = index_generator() is not None
            path = os.path.join(self.dir, shard_name(self.split, len(self.written)))
            self.writer = open_writer(path, self.width, self.index_later)
        self.writer.write_raw_data([{"input_ids": row} for row in group])
        self.in_shard += n

    def _finish_shard(self):
        if self.writer is None:
            return
        self.writer.commit()
        self.written.append((shard_name(self.split, len(self.written)), self.in_shard))
        self.writer, self.in_shard = None, 0

    def close(self):
        """Write what is left, build the indexes still to build; the manifest entries of the split's shards."""
        while self.npending:
            self._flush(min(self.group, self.npending))
        self._finish_shard()
        if self.index_later:
            for name, _ in self.written:
                build_index(os.path.join(self.dir, name))
        return [describe_shard(self.dir, name, samples) for name, samples in self.written]

    @property
    def samples(self):
        return sum(n for _, n in self.written) + self.in_shard + self.npending


def import_mindrecord():
    """MindSpore's MindRecord writer, which takes seconds to import (preprocessing imports it while its workers
    start on the first chunks)."""
    importlib.import_module("mindspore.mindrecord")


def open_writer(path, width, index_later=False):
    """A MindRecord writer for `path`; with `index_later` its commit() writes the data file only (build_index)."""
    from mindspore.mindrecord import FileWriter

    writer = FileWriter(path, shard_num=1, overwrite=True)
    # the 32 MiB page + 16 MiB header defaults would pad a small shard to 50 MB on disk
    writer.set_page_size(1 << 20)
    writer.set_header_size(1 << 20)
    writer.add_schema({"input_ids": {"type": "int32", "shape": [width]}}, "packed_tokens")
    if index_later:
        writer._index_generator = False  # FileWriter's own switch for the index step of commit()
    return writer


def index_generator():
    """MindRecord's index generator (what FileWriter.commit runs on the file it has just written), or None
    where it cannot run later: not where MindSpore 2.x keeps it, or encryption on (commit encrypts the data
    file, which the generator then could not read). Both are MindSpore internals: without them each shard's
    index is built at its commit, as before, which costs memory, never correctness."""
    try:
        from mindspore.mindrecord.config import _get_enc_key
        from mindspore.mindrecord.core.shardindexgenerator import ShardIndexGenerator
    except ImportError:
        return None
    return None if _get_enc_key() is not None else ShardIndexGenerator


def build_index(path):
    """The `.db` index of a committed MindRecord file, as FileWriter.commit builds it (and with its mode)."""
    if os.path.exists(path + ".db"):  # a FileWriter without the switch above built it at commit
        return
    generator = index_generator()(os.path.realpath(path), False)
    generator.build()
    generator.write_to_db()
    os.chmod(path + ".db", stat.S_IRUSR | stat.S_IWUSR)


def describe_shard(directory, name, samples):
    """A manifest entry: what `load_manifest` checks (sizes always, checksums on first use)."""
    path = os.path.join(directory, name)
    return {"file": name, "samples": int(samples), "bytes": os.path.getsize(path), "sha256": sha256_file(path),
            "db_bytes": os.path.getsize(path + ".db"), "db_sha256": sha256_file(path + ".db")}

