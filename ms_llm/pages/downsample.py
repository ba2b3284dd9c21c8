"""Thinning a curve for display without hiding its spikes.

A 100k-step run logged every step has 100k points per curve; a browser draws 2,000 as well, and the page
must stay under 5 MB. Averaging or striding would erase the one-step loss spike a reader is looking for,
so each bucket keeps its minimum and its maximum (in step order): every extreme of the full curve is a
point of the thinned one.
"""
import numpy as np

MAX_POINTS = 2000


def minmax(x, y, max_points=MAX_POINTS):
    """(x, y) thinned to at most `max_points` points, keeping each bucket's min and max.

    NaN values (gaps, non-finite steps) are skipped when looking for extrema; a bucket that is all NaN keeps
    one NaN so the gap stays a gap.
    """
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    n = len(y)
    if n <= max_points:
        return x, y
    size = -(-n // (max_points // 2))  # points per bucket, rounded up: at most max_points/2 buckets
    rows = -(-n // size)
    pad = rows * size - n
    lo = np.concatenate([np.where(np.isnan(y), np.inf, y), np.full(pad, np.inf)]).reshape(rows, size)
    hi = np.concatenate([np.where(np.isnan(y), -np.inf, y), np.full(pad, -np.inf)]).reshape(rows, size)
    base = np.arange(rows) * size
    keep = np.concatenate([base + lo.argmin(axis=1), base + hi.argmax(axis=1)])
    keep = np.unique(np.minimum(keep, n - 1))  # unique also sorts: step order is kept
    return x[keep], y[keep]
