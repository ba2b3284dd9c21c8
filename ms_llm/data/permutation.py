"""The order in which an epoch visits a split's samples, as a function of (seed, epoch).

Up to EXACT_MAX samples this is numpy's permutation, as it always was (so existing runs resume in the same
order and the quickstart's numbers do not move). Above that, materialising a permutation costs 8 bytes per
sample and a pass over all of them at every epoch start (10 M samples: 80 MB and 0.3 s, times the ranks), so
it is computed on demand instead: a keyed Feistel network on the next even power of two, with cycle-walking
back into [0, n). It is a bijection, needs no memory, and any stream position maps to its sample in O(1).
"""
import numpy as np

EXACT_MAX = 1 << 20
ROUNDS = 6
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix(z):
    """splitmix64's finaliser: a good avalanche for the Feistel round function."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


class Permutation:
    """`perm(epoch, positions)` → sample indices; `key` seeds every epoch (e.g. (seed,) or (seed, component))."""

    def __init__(self, n, key, shuffle=True):
        self.n, self.key, self.shuffle = int(n), tuple(int(k) for k in key), shuffle
        self._cache = {}
        bits = max(2, (self.n - 1).bit_length())
        self.half = (bits + 1) // 2
        self.mask = np.uint64((1 << self.half) - 1)

    def __call__(self, epoch, pos):
        pos = np.asarray(pos, np.int64)
        if not self.shuffle:
            return pos
        if self.n <= EXACT_MAX:
            return self._exact(epoch)[pos]
        return self._feistel(epoch, pos)

    def _exact(self, epoch):
        if epoch not in self._cache:
            if len(self._cache) > 2:
                self._cache.pop(min(self._cache))
            # seeded exactly as before blends existed: the quickstart's order depends on it
            self._cache[epoch] = np.random.default_rng([*self.key, epoch]).permutation(self.n)
        return self._cache[epoch]

    def _round_keys(self, epoch):
        return np.random.default_rng([*self.key, epoch, 0x5EED]).integers(0, 2 ** 63, ROUNDS, dtype=np.uint64)

    def _feistel(self, epoch, pos):
        keys = self._round_keys(epoch)
        out = pos.astype(np.uint64)
        todo = np.ones(len(out), bool)
        while todo.any():  # cycle-walking: values that land outside [0, n) are permuted again
            x = out[todo]
            half = np.uint64(self.half)
            left, right = x >> half, x & self.mask
            for k in keys:
                left, right = right, left ^ (_mix(right ^ k) & self.mask)
            x = (left << half) | right
            out[todo] = x
            todo[todo] = x >= np.uint64(self.n)
        return out.astype(np.int64)
