"""How the two splits relate, measured while they stream past: near-copies of training text in validation (leakage)
and how far apart their token distributions are (shift). Both go into the manifest (`overlap`), `ms-llm data info`
shows them and `ms-llm diagnose` reads them.

Leakage: the share of validation *shingles* (runs of `k` consecutive tokens, about SHINGLE_CHARS characters of
text) that also occur in training. A near-copy (the same passage under another header, date or number) shares
almost all its shingles with its original; unrelated text of the same kind shares almost none (Tiny Shakespeare's
last 10% against the rest: 0.04% of its 24-character shingles, none of its 32-character ones). The hash split keeps
exact duplicates together, not near-copies.

It streams in fixed memory. Each shingle is hashed to 64 bits; a split keeps the hashes below its `limit` only, at
most CAPACITY of them (training: distinct hashes; validation: one per position). When a split's store is full its
limit is lowered to the median of what it holds and everything above is dropped. At the end both splits are cut at
the lower of the two limits, so what is left is *every* shingle of each split whose hash falls below one value: a
uniform sample, the same for both, in which a validation shingle that occurs in training is found in training's
sample too. The share is exact on the sample (no false positives); its precision is that of a sample of tens of
thousands of positions or more. A split's hashes (the kept ones, then those added since) live in one buffer that
compaction sorts, deduplicates and halves in place: at most 2 x CAPACITY hashes and one chunk's are ever written,
18 MiB a split, whatever the corpus.

Shift: the Kullback-Leibler divergence KL(val || train) of the splits' unigram distributions (training's smoothed
by half a count), in nats per token: the extra loss a model of training's token frequencies pays on validation.
"""
import numpy as np

SHINGLE_CHARS = 32      # a shingle spans about this many characters of text
CAPACITY = 1 << 20      # hashes kept per split (8 MiB each; as many again pending before a compaction)
LEAK_WARN = 0.10        # a validation split with at least this share of its shingles in training: a warning
SHIFT_WARN = 0.10       # KL(val || train) of the unigram distributions above this many nats/token: a warning
SLICE = 1 << 20         # tokens hashed at once (bounds the temporary arrays)
DEDUP_BLOCK = 1 << 17   # hashes deduplicated at once while compacting (1 MiB of temporary memory)
_FULL = np.uint64(0xFFFFFFFFFFFFFFFF)
_BASE = np.uint64(0x9E3779B97F4A7C15)  # an odd multiplier: the polynomial hash's base
SAMPLE_TEXT = ("The quick brown fox jumps over the lazy dog. It was the best of times, it was the worst of times; "
               "in the beginning the training data and the validation data were drawn from the same text.")


def shingle_tokens(tokenizer_spec, tokenizer=None):
    """Tokens per shingle: SHINGLE_CHARS characters' worth (char/byte tokenizers: one character per token; others:
    measured on a sample sentence)."""
    kind = (tokenizer_spec or {}).get("kind")
    if kind in ("char", "byte") or tokenizer is None:
        return SHINGLE_CHARS if kind in ("char", "byte") else SHINGLE_CHARS // 4
    try:
        per_token = len(SAMPLE_TEXT) / max(1, len(tokenizer.encode(SAMPLE_TEXT)))
    except Exception:  # noqa: BLE001 (a tokenizer that cannot encode the sample: the usual 4 characters per token)
        per_token = 4.0
    return int(min(SHINGLE_CHARS, max(4, round(SHINGLE_CHARS / per_token))))


def shingle_hashes(tokens, k):
    """64-bit hashes of every window of `k` tokens (len(tokens) - k + 1 of them): a polynomial hash mod 2^64,
    built by doubling (log2(k) passes), then mixed (splitmix64's finaliser) so that its bits are uniform."""
    t = np.asarray(tokens, np.int64).astype(np.uint64) + np.uint64(1)
    n = len(t) - k + 1
    if n <= 0:
        return np.zeros(0, np.uint64)
    with np.errstate(over="ignore"):
        out, out_len = None, 0
        piece, piece_len, power = t, 1, _BASE   # piece[i] hashes tokens i .. i+piece_len-1; power = BASE^piece_len
        remaining = k
        while True:
            if remaining & 1:  # append `piece` after what `out` holds: out * BASE^piece_len + piece shifted
                if out is None:
                    out, out_len = piece, piece_len
                else:
                    m = len(t) - out_len - piece_len + 1
                    out = out[:m] * power + piece[out_len:out_len + m]
                    out_len += piece_len
            remaining >>= 1
            if not remaining:
                break
            m = len(piece) - piece_len
            piece = piece[:m] * power + piece[piece_len:piece_len + m]
            piece_len, power = 2 * piece_len, power * power
        x = out[:n].copy()
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x


class SplitOverlap:
    """Feed each split's tokens in stream order (`add(split, tokens)`); `result(stats)` gives the manifest entry.

    Each split's hashes live in one buffer allocated once: the kept ones (sorted) at its start, those added since
    the last compaction after them. Compaction sorts, deduplicates and halves in place, so memory is that buffer
    (at most 2 x CAPACITY + SLICE hashes, 24 MiB, of which only the part ever written is resident: 2 x CAPACITY plus
    one chunk's in practice) whatever the corpus size; before it was fixed, the kept array, the pending pieces, their
    concatenation, np.unique's sorted copy and its result were alive at once (76 MiB at the peak), and the peak
    rose with the corpus until both splits had been compacted a few times."""

    def __init__(self, k, capacity=CAPACITY):
        self.k, self.capacity = int(k), int(capacity)
        self.limit = {"train": _FULL, "val": _FULL}
        # at most `capacity` kept, fewer than `capacity` pending before an add, one slice's hashes added by it
        self.store = {"train": None, "val": None}  # allocated on first use (np.empty: pages resident once written)
        self.nkept = {"train": 0, "val": 0}
        self.npending = {"train": 0, "val": 0}
        self.tail = {"train": np.zeros(0, np.int64), "val": np.zeros(0, np.int64)}
        self.positions = {"train": 0, "val": 0}

    @property
    def kept(self):
        """The kept (sorted) hashes of each split, as views of its buffer."""
        return {s: (np.zeros(0, np.uint64) if b is None else b[:self.nkept[s]]) for s, b in self.store.items()}

    def add(self, split, tokens):
        tokens = np.asarray(tokens, np.int64)
        for lo in range(0, len(tokens), SLICE):
            part = np.concatenate([self.tail[split], tokens[lo:lo + SLICE]])
            self.tail[split] = part[len(part) - self.k + 1:] if len(part) >= self.k else part
            h = shingle_hashes(part, self.k)
            self.positions[split] += len(h)
            h = h[h < self.limit[split]]
            if len(h):
                if self.store[split] is None:
                    self.store[split] = np.empty(2 * self.capacity + SLICE, np.uint64)
                end = self.nkept[split] + self.npending[split]
                self.store[split][end:end + len(h)] = h
                self.npending[split] += len(h)
                if self.npending[split] >= self.capacity:
                    self.compact(split)

    def compact(self, split):
        if self.store[split] is None:
            return
        a = self.store[split][:self.nkept[split] + self.npending[split]]
        a.sort()  # in place
        if split == "train":  # distinct hashes
            a = a[:dedup_sorted(a)]
        self.npending[split] = 0
        while len(a) > self.capacity:  # keep the lower half of the hash range held so far
            cut = a[len(a) // 2]
            a = a[:np.searchsorted(a, cut, "left")]  # a[a < cut] of a sorted array
            self.limit[split] = cut
        self.nkept[split] = len(a)

    def share(self):
        """(share of validation shingles found in training, validation shingles in the sample) or (None, 0)."""
        for split in ("train", "val"):
            self.compact(split)
        limit = min(self.limit["train"], self.limit["val"])
        kept = self.kept
        train = kept["train"][:np.searchsorted(kept["train"], limit, "left")]
        val = kept["val"][:np.searchsorted(kept["val"], limit, "left")]
        if not len(val) or not len(train):
            return None, len(val)
        pos = np.minimum(np.searchsorted(train, val), len(train) - 1)
        return float(np.mean(train[pos] == val)), int(len(val))

    def result(self, train_counts=None, val_counts=None, log=None):
        """The manifest's `overlap` entry; with the splits' token counts also their divergence. Warns through `log`
        when either is above its threshold."""
        share, sampled = self.share()
        out = {"shingle_tokens": self.k, "val_shingles": self.positions["val"], "train_shingles":
               self.positions["train"], "sampled_val_shingles": sampled,
               "val_shingles_in_train": None if share is None else round(share, 5)}
        if train_counts is not None and val_counts is not None:
            out.update(divergence(train_counts, val_counts))
        for line in warnings(out):
            if log is not None:
                log(f"warning: {line}")
        return out


def dedup_sorted(a, block=DEDUP_BLOCK):
    """Drop the repeats of sorted `a` in place, block by block (temporary memory: two blocks of hashes and a mask);
    returns how many distinct values there are (now a[:count])."""
    if not len(a):
        return 0
    w, prev = 1, a[0]
    blk, keep, out = np.empty(block, a.dtype), np.empty(block, bool), np.empty(block, a.dtype)
    for lo in range(1, len(a), block):
        n = min(block, len(a) - lo)
        np.copyto(blk[:n], a[lo:lo + n])  # a copy: the writes below may cover this block
        keep[0] = blk[0] != prev
        np.not_equal(blk[1:n], blk[:n - 1], out=keep[1:n])
        prev = blk[n - 1]
        m = int(np.count_nonzero(keep[:n]))
        np.compress(keep[:n], blk[:n], out=out[:m])
        a[w:w + m] = out[:m]  # w <= lo: only what was read already is overwritten
        w += m
    return w


def divergence(train_counts, val_counts):
    """KL(val || train) and the Jensen-Shannon divergence of the splits' unigram distributions (nats/token); the
    training counts are smoothed by half a count so a token that training lacks costs a finite amount."""
    tr, va = np.asarray(train_counts, np.float64), np.asarray(val_counts, np.float64)
    if tr.sum() <= 0 or va.sum() <= 0:
        return {}
    q = (tr + 0.5) / (tr.sum() + 0.5 * len(tr))
    p = va / va.sum()
    nz = p > 0
    kl = float(np.sum(p[nz] * np.log(p[nz] / q[nz])))
    pt = tr / tr.sum()
    m = 0.5 * (p + pt)
    js = 0.5 * float(np.sum(p[nz] * np.log(p[nz] / m[nz]))) + 0.5 * float(
        np.sum(pt[pt > 0] * np.log(pt[pt > 0] / m[pt > 0])))
    unseen = float(va[tr == 0].sum() / va.sum())
    return {"unigram_kl_val_train_nats": round(kl, 5), "unigram_js_nats": round(js, 5),
            "val_tokens_unseen_in_train": round(unseen, 6)}


def warnings(entry):
    """What the overlap entry of a manifest warns about, as sentences (none when both measures are low)."""
    out = []
    share = (entry or {}).get("val_shingles_in_train")
    if isinstance(share, (int, float)) and share >= LEAK_WARN:
        out.append(f"{100 * share:.1f}% of the validation split's {entry['shingle_tokens']}-token shingles also occur "
                   f"in the training split (above {100 * LEAK_WARN:.0f}%): validation holds near-copies of training "
                   f"text, so its loss overstates generalisation. Remove near-duplicates before preprocessing.")
    kl = (entry or {}).get("unigram_kl_val_train_nats")
    if isinstance(kl, (int, float)) and kl >= SHIFT_WARN:
        out.append(f"the validation split's token distribution differs from training's: KL(val || train) = {kl:.3f} "
                   f"nats/token (above {SHIFT_WARN:g}): validation is not drawn from the training distribution "
                   f"(a tail split of a corpus whose end differs, or another source).")
    return out


def measure_dataset(dataset_dir, manifest, progress=None):
    """The overlap entry of an existing dataset, from its samples (for `data info` on datasets preprocessed before
    it was measured, and `data adopt`ed ones): each split's token stream is rebuilt from its rows (consecutive rows
    share one token) and streamed through SplitOverlap."""
    import os

    import mindspore.dataset as ds

    from ms_llm.data.manifest import split_shards

    tokenizer = None
    if manifest["tokenizer"].get("kind") not in ("char", "byte"):
        try:
            from ms_llm.data.tokenizers import from_spec

            tokenizer = from_spec(manifest["tokenizer"])
        except Exception:  # noqa: BLE001 (its library missing: the usual 4 characters per token)
            tokenizer = None
    sketch = SplitOverlap(shingle_tokens(manifest["tokenizer"], tokenizer))
    vocab = int(manifest["vocab_size"])
    counts = {}
    for split in ("train", "val"):
        if split not in manifest["splits"]:
            continue
        counts[split] = np.zeros(vocab, np.int64)
        first = True
        for shard in split_shards(manifest, split):
            start, end, row = shard["start"], shard["start"] + shard["samples"], 0
            data = ds.MindDataset([os.path.join(dataset_dir, shard["file"])], columns_list=["input_ids"],
                                  shuffle=False)
            for (batch,) in data.batch(1024).create_tuple_iterator(num_epochs=1, output_numpy=True):
                lo, hi = max(start - row, 0), min(end - row, len(batch))
                if hi > lo:
                    rows = batch[lo:hi]
                    toks = np.concatenate([rows[0], rows[1:, 1:].reshape(-1)]) if first else rows[:, 1:].reshape(-1)
                    first = False
                    sketch.add(split, toks)
                    ok = toks[(toks >= 0) & (toks < vocab)]
                    counts[split] += np.bincount(ok, minlength=vocab)[:vocab]
                    if progress is not None:
                        progress(len(toks))
                row += len(batch)
                if row >= end:
                    break
    if "val" not in counts:
        return None
    return sketch.result(counts.get("train"), counts.get("val"))
