"""`data.blend: [[0.7, data/web], [0.3, data/code]]`: mix preprocessed datasets by weight.

The blended stream is cut into blocks of BLOCK positions. Block b gives dataset i exactly
floor((b+1)·L·c_{i+1}) − floor((b+1)·L·c_i) − (the same at b) slots, c being the cumulative weights, so every
prefix of the stream holds each dataset within one block of its weight; the slots are shuffled inside the
block with (train.seed, b). Dataset i's k-th slot reads position k of its own stream: epochs of its own
permutation, keyed by (seed, i+1), so a small dataset with a large weight repeats, and a large one is
sampled without repetition. Everything is a function of the stream position, so:
  * the data position is still one number (samples consumed), and resume is exact;
  * a global batch holds the same samples whatever the number of ranks (ranks interleave positions).

This module reads no file: `load_manifest(..., blend=data.blend)` (manifest.py) reads each dataset and hands
them to `combine`, and the loader streams the combined manifest through `BlendStream`.
"""
import math
import os

import numpy as np

from ms_llm.data.permutation import Permutation
from ms_llm.data.split_index import SplitIndex, split_shards
from ms_llm.data.tokenizers import same_tokenizer
from ms_llm.errors import UserError

BLOCK = 1024
EXAMPLE = "e.g. data.blend: [[0.7, data/web], [0.3, data/code]]"


def check_blend(blend):
    """data.blend as [(weight, dataset_dir), ...] with weights summing to 1; refuses malformed entries."""
    if not isinstance(blend, (list, tuple)) or not blend:
        raise UserError(f"data.blend = {blend!r} must be a non-empty list of [weight, dataset_dir] pairs, {EXAMPLE}.")
    out, seen = [], {}
    for n, entry in enumerate(blend, 1):
        ok = isinstance(entry, (list, tuple)) and len(entry) == 2
        weight, path = (entry if ok else (None, None))
        if ok and isinstance(weight, str) and isinstance(path, (int, float)):
            raise UserError(f"data.blend entry {n} = {list(entry)!r} has the dataset first: write [weight, "
                            f"dataset_dir], i.e. [{path}, {weight}] ({EXAMPLE}).")
        if not ok or isinstance(weight, bool) or not isinstance(weight, (int, float)) or not isinstance(path, str):
            raise UserError(f"data.blend entry {n} = {entry!r} must be [weight, dataset_dir] ({EXAMPLE}).")
        if not math.isfinite(weight) or weight <= 0:
            raise UserError(f"data.blend entry {n} ('{path}') has weight {weight}: weights must be positive numbers "
                            f"(they are normalised to sum to 1). Remove the entry to leave a dataset out.")
        key = os.path.realpath(path)
        if key in seen:
            raise UserError(f"data.blend names '{path}' twice (entries {seen[key]} and {n}). Give each dataset once, "
                            f"with the sum of its weights.")
        seen[key] = n
        out.append((float(weight), path))
    total = sum(w for w, _ in out)
    return [(w / total, p) for w, p in out]


def combine(parts):
    """The combined manifest of a blend from [(weight, dataset_dir, manifest), ...] (`check_blend`'s weights,
    each dataset's manifest as `load_manifest` read it); the datasets must agree on tokenizer, vocabulary and
    sample length."""
    comps = []
    for weight, path, m in parts:
        if m["splits"]["train"]["samples"] == 0:
            raise UserError(f"data.blend: '{path}' has no training samples. Remove it from the blend.")
        comps.append({"weight": weight, "dir": path, "manifest": m})
    first = comps[0]
    for c in comps[1:]:
        for what, key, same in (("tokenizer", "tokenizer", same_tokenizer), ("vocabulary size", "vocab_size", None),
                                ("sample length (seq_length)", "seq_length", None)):
            a, b = first["manifest"][key], c["manifest"][key]
            if not (same(a, b) if same else a == b):
                show = (lambda v: describe_tokenizer(v)) if key == "tokenizer" else repr
                raise UserError(f"data.blend: '{first['dir']}' and '{c['dir']}' disagree on the {what}: {show(a)} "
                                f"against {show(b)}. Blended datasets must be preprocessed with the same tokenizer and "
                                f"--seq-length; re-run preprocessing of one of them.")
    m0 = first["manifest"]
    splits = {s: {"samples": sum(c["manifest"]["splits"][s]["samples"] for c in comps),
                  "tokens": sum(c["manifest"]["splits"][s].get("tokens", 0) for c in comps)}
              for s in ("train", "val")}
    return {"schema_version": m0["schema_version"], "seq_length": m0["seq_length"],
            "sample_length": m0.get("sample_length", m0["seq_length"] + 1), "tokenizer": m0["tokenizer"],
            "vocab_size": m0["vocab_size"], "eod_id": m0.get("eod_id"),
            "max_token_id": max(c["manifest"].get("max_token_id", c["manifest"]["vocab_size"] - 1) for c in comps),
            "splits": splits, "blend": comps}


def describe_tokenizer(spec):
    kind = spec.get("kind")
    if kind == "char":
        return f"char ({len(spec.get('vocab', ''))} characters)"
    return f"{kind} ({spec['path']})" if spec.get("path") else str(kind)


class BlendStream:
    """The blended stream of one split for one rank: files for MindDataset and global sample indices."""

    def __init__(self, manifest, split, dp, rank, seed, shuffle):
        comps = [c for c in manifest["blend"] if c["manifest"]["splits"][split]["samples"] > 0]
        self.files, self.index, self.perm, base = [], [], [], 0
        for c in comps:
            i = manifest["blend"].index(c)
            idx = SplitIndex(c["dir"], split_shards(c["manifest"], split), base)
            base = idx.end
            self.files += idx.files
            self.index.append(idx)
            self.perm.append(Permutation(idx.num_samples, (seed, i + 1), shuffle))
        w = np.array([c["weight"] for c in comps], np.float64)
        w = w / w.sum() if len(w) else w
        self.weights = w
        self.cum = np.concatenate([[0.0], np.cumsum(w)])
        self.cum[-1] = 1.0  # exactly: the quotas of a block then sum to BLOCK
        self.sizes = np.array([x.num_samples for x in self.index], np.int64)
        self.num_samples = int(self.sizes.sum())
        # positions before the first dataset starts repeating (what validation may use)
        self.distinct_samples = int(min(self.sizes / w)) if len(w) else 0
        self.dp, self.rank, self.seed, self.shuffle = dp, rank, seed, shuffle
        self._blocks = {}

    def quota(self, m):
        """Slots of each dataset among the first m positions (m a multiple of BLOCK)."""
        return np.diff(np.floor(m * self.cum).astype(np.int64))

    def _block(self, b):
        if b not in self._blocks:
            if len(self._blocks) > 4:
                self._blocks.pop(next(iter(self._blocks)))
            base = self.quota(b * BLOCK)
            counts = self.quota((b + 1) * BLOCK) - base
            labels = np.repeat(np.arange(len(counts)), counts)
            if self.shuffle:
                labels = np.random.default_rng([self.seed, b, 0xB1E4D]).permutation(labels)
            rank = np.empty(BLOCK, np.int64)
            for i in range(len(counts)):
                sel = labels == i
                rank[sel] = np.arange(int(sel.sum()))
            self._blocks[b] = (labels, base[labels] + rank)
        return self._blocks[b]

    def at(self, p):
        """Global indices (into `files`) of the samples at blended stream positions p."""
        blocks, offs = p // BLOCK, p % BLOCK
        comp, k = np.empty_like(p), np.empty_like(p)
        for b in np.unique(blocks):
            sel = blocks == b
            labels, slot = self._block(int(b))
            comp[sel], k[sel] = labels[offs[sel]], slot[offs[sel]]
        out = np.empty_like(p)
        for i, (index, perm, n) in enumerate(zip(self.index, self.perm, self.sizes)):
            sel = comp == i
            if not sel.any():
                continue
            epochs, pos = k[sel] // n, k[sel] % n
            local = np.empty_like(pos)
            for e in np.unique(epochs):
                es = epochs == e
                local[es] = perm(int(e), pos[es])
            out[sel] = index(local)
        return out

    def components(self, p):
        """Which dataset each stream position reads (for tests and `data info`)."""
        blocks, offs = p // BLOCK, p % BLOCK
        comp = np.empty_like(p)
        for b in np.unique(blocks):
            sel = blocks == b
            comp[sel] = self._block(int(b))[0][offs[sel]]
        return comp

    def indices(self, q0, q1):
        return self.at(np.arange(q0, q1, dtype=np.int64) * self.dp + self.rank)
