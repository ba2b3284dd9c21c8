"""A split's samples as MindDataset numbers them: the shards a manifest lists for the split (a split may be part
of a file, like an adopted dataset's validation tail), and the global index of each of its samples in the
concatenation of their files. Used by the single-dataset and the blended streams alike."""
import os

import numpy as np


def split_shards(manifest, split):
    """The shards of a split as dicts with file, samples, start (first sample of the file that belongs to the
    split) and file_samples (samples in the whole file)."""
    entry = manifest["splits"][split]
    if "shards" not in entry:  # schema 1: one file per split
        return [{"file": entry["file"], "samples": entry["samples"], "start": 0, "file_samples": entry["samples"]}]
    return [dict(s, start=s.get("start", 0), file_samples=s.get("file_samples", s["samples"]))
            for s in entry["shards"]]


class SplitIndex:
    """A split's samples as indices into the concatenation of its files (what MindDataset numbers).

    Usually the identity; a split that is part of a file (an adopted dataset's validation tail) is an
    offset into it."""

    def __init__(self, dataset_dir, shards, base=0):
        self.files, first, seen = [], {}, {}
        offset = base
        for s in shards:
            if s["file"] not in seen:
                seen[s["file"]] = offset
                self.files.append(os.path.join(dataset_dir, s["file"]))
                offset += s["file_samples"]
            first.setdefault(s["file"], seen[s["file"]])
        self.end = offset  # next free global index after these files
        self.starts = np.cumsum([0] + [s["samples"] for s in shards])[:-1]
        self.globals = np.array([seen[s["file"]] + s["start"] for s in shards], np.int64)
        self.num_samples = int(sum(s["samples"] for s in shards))

    def __call__(self, local):
        part = np.searchsorted(self.starts, local, side="right") - 1
        return self.globals[part] + (local - self.starts[part])
