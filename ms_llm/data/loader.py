"""Read packed samples from MindRecord as micro-batches for one rank.

The global sample stream is the concatenation of epochs, each a permutation of the split drawn from
(seed, epoch) (see permutation.py). Global batch k is stream positions [k*G, (k+1)*G). Rank r of `dp` reads
the positions p with p % dp == r, the same interleaving MindDataset's own `num_shards`/`shard_id` sharding
uses, but computed here so that:
  * global batch k holds the same samples whatever the number of ranks;
  * resuming at any sample count is exact (no sample repeated or skipped) without reading the skipped ones;
  * epochs join seamlessly (a micro-batch may span two epochs).
With `data.blend`, the stream interleaves several datasets instead (see blend.py); the position is still one
number. The indices are handed to `MindDataset` (over all shard files of the split, in manifest order)
through a `SubsetSampler`, one bounded chunk at a time, so start-up time and memory do not grow with the
dataset, and reading and batching stay in MindSpore's C++ pipeline.
"""
import numpy as np

from ms_llm.data.blend import BlendStream
from ms_llm.data.permutation import Permutation
from ms_llm.data.split_index import SplitIndex, split_shards

MAX_CHUNK = 1 << 16  # rank samples per MindDataset pipeline: ~0.1 s to start, a few MB of indices


def check_token_ids(batch, vocab_size):
    """The integer analogue of a NaN input: token ids outside [0, vocab). Returns a message or None."""
    bad = (batch < 0) | (batch >= vocab_size)
    if not bad.any():
        return None
    sample, pos = (int(i) for i in np.argwhere(bad)[0])
    return (f"token id {int(batch[sample, pos])} at sample {sample}, position {pos} (and {int(bad.sum()) - 1} "
            f"more) is outside the vocabulary [0, {vocab_size}): a corrupted sample or a tokenizer/vocabulary "
            f"mismatch (check data.dataset_dir/manifest.json against model.vocab_size). Caught before the forward "
            f"pass, where the embedding lookup would have read garbage or failed.")


def epoch_permutation(seed, epoch, n):
    return Permutation(n, (seed,))(epoch, np.arange(n))


class RankStream:
    """Sample indices of rank `rank` at its stream positions q (global position q*dp + rank)."""

    def __init__(self, num_samples, dp, rank, seed, shuffle=True, key=None):
        self.n, self.dp, self.rank = num_samples, dp, rank
        self.perm = Permutation(num_samples, key or (seed,), shuffle)

    def positions(self, q0, q1):
        return np.arange(q0, q1, dtype=np.int64) * self.dp + self.rank

    def at(self, p):
        """Samples at global stream positions p (epochs of n samples, each its own permutation)."""
        epochs, pos = p // self.n, p % self.n
        out = np.empty_like(pos)
        for e in np.unique(epochs):
            sel = epochs == e
            out[sel] = self.perm(int(e), pos[sel])
        return out

    def indices(self, q0, q1):
        return self.at(self.positions(q0, q1))


class SplitStream:
    """One dataset's split: files for MindDataset and the global indices of this rank's stream positions."""

    def __init__(self, dataset_dir, manifest, split, dp, rank, seed, shuffle):
        index = SplitIndex(dataset_dir, split_shards(manifest, split))
        self.files, self.num_samples, self._index = index.files, index.num_samples, index
        self._stream = RankStream(index.num_samples, dp, rank, seed, shuffle)

    def indices(self, q0, q1):
        return self._index(self._stream.indices(q0, q1))


def open_stream(dataset_dir, manifest, split, dp, rank, seed, shuffle):
    if manifest.get("blend"):  # load_manifest(..., blend=data.blend) combined several datasets
        return BlendStream(manifest, split, dp, rank, seed, shuffle)
    return SplitStream(dataset_dir, manifest, split, dp, rank, seed, shuffle)


def make_dataset(files, indices, micro_batch, num_workers=1):
    import mindspore.dataset as ds

    data = ds.MindDataset(list(files), columns_list=["input_ids"], sampler=ds.SubsetSampler(indices.tolist()),
                          num_parallel_workers=num_workers)
    return data.batch(micro_batch, drop_remainder=True)


class TrainBatches:
    """Endless iterator of (micro_batch, seq_length+1) int32 Tensors for one rank.

    `consumed` counts global samples (all ranks) taken so far, including the starting offset, so a
    checkpoint can store it and a resumed run continues at exactly the next sample.
    """

    def __init__(self, dataset_dir, manifest, split, micro_batch, dp=1, rank=0, seed=0, seq_length=None,
                 consumed=0, shuffle=True, num_workers=1):
        self.stream = open_stream(dataset_dir, manifest, split, dp, rank, seed, shuffle)
        self.files, self.num_samples = self.stream.files, self.stream.num_samples
        self.micro_batch, self.dp, self.num_workers = micro_batch, dp, num_workers
        self.shuffle = shuffle  # the training stream; validation batches are read in order
        self.width = (seq_length or manifest["seq_length"]) + 1
        self.chunk = max(1, min(MAX_CHUNK // micro_batch, self.num_samples // (dp * micro_batch))) * micro_batch
        self.seek(consumed)  # this rank's stream position

    def seek(self, consumed):
        """Continue at global sample `consumed` (a multiple of data_parallel), e.g. a checkpoint's position."""
        if consumed % self.dp:
            raise ValueError(f"consumed={consumed} is not a multiple of data_parallel={self.dp}")
        self.q = consumed // self.dp
        self._it, self._left = None, 0

    @property
    def consumed(self):
        return self.q * self.dp

    @property
    def epoch(self):
        return self.consumed // self.num_samples

    def _next_chunk(self):
        if self._it is not None:  # free the finished pipeline (and MindDataset's row index) before the next
            stop = getattr(self._it, "stop", None)
            if stop is not None:
                stop()
            self._it = None
        idx = self.stream.indices(self.q, self.q + self.chunk)
        self._it = make_dataset(self.files, idx, self.micro_batch, self.num_workers).create_tuple_iterator(
            num_epochs=1, output_numpy=True)
        self._left = self.chunk // self.micro_batch

    def __iter__(self):
        return self

    def __next__(self):
        import mindspore as ms

        if self._left == 0:
            self._next_chunk()
        (batch,) = next(self._it)
        self._left -= 1
        self.q += self.micro_batch
        if batch.shape[1] != self.width:
            batch = batch[:, : self.width]
        return ms.Tensor(batch)


def eval_batches(dataset_dir, manifest, micro_batch, num_batches, dp=1, rank=0, seq_length=None, num_workers=1,
                 accum=1):
    """This rank's micro-batches of the first `num_batches` global validation batches (sequential, no shuffle).

    A global batch is micro_batch * accum * dp samples, so the validation set is the same whatever the
    number of ranks. Capped at the size of the split (for a blend: so that no dataset's validation samples
    repeat); returned as a list so every evaluation sees the same batches.
    """
    it = TrainBatches(dataset_dir, manifest, "val", micro_batch, dp, rank, seq_length=seq_length,
                      shuffle=False, num_workers=num_workers)
    n = getattr(it.stream, "distinct_samples", it.num_samples)
    num_batches = min(num_batches, n // (micro_batch * accum * dp))
    if num_batches == 0:
        return []
    it.chunk = num_batches * accum * micro_batch
    return [next(it) for _ in range(num_batches * accum)]
