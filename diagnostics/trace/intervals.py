"""Interval arithmetic on sorted, disjoint [start, end) sets held as two numpy arrays.

The breakdown of a step into computation, communication and their overlap is unions,
intersections and differences of event intervals; these helpers keep that exact and vectorised.
"""

from __future__ import annotations

import numpy as np

Intervals = tuple[np.ndarray, np.ndarray]
EMPTY: Intervals = (np.zeros(0), np.zeros(0))


def union(starts, ends) -> Intervals:
    """Merge possibly overlapping intervals into sorted disjoint ones (empty ones dropped)."""
    s = np.asarray(starts, dtype=float)
    e = np.asarray(ends, dtype=float)
    keep = e > s
    s, e = s[keep], e[keep]
    if s.size == 0:
        return EMPTY
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    run_end = np.maximum.accumulate(e)
    # A new block starts where an interval begins after everything before it has ended.
    new = np.r_[True, s[1:] > run_end[:-1]]
    idx = np.flatnonzero(new)
    return s[idx], np.maximum.reduceat(e, idx) if idx.size else e[:0]


def length(iv: Intervals) -> float:
    return float(np.sum(iv[1] - iv[0])) if iv[0].size else 0.0


def clip(iv: Intervals, lo: float, hi: float) -> Intervals:
    s = np.clip(iv[0], lo, hi)
    e = np.clip(iv[1], lo, hi)
    keep = e > s
    return s[keep], e[keep]


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """Intersection of two disjoint sorted sets: a sweep over both sets' bounds (ends before starts
    at equal times, so touching intervals give no empty piece); where both are open, it is in."""
    (as_, ae), (bs, be) = a, b
    if as_.size == 0 or bs.size == 0:
        return EMPTY
    pts = np.concatenate([as_, ae, bs, be]).astype(float)
    delta = np.concatenate([np.ones(as_.size), -np.ones(ae.size), np.ones(bs.size), -np.ones(be.size)])
    order = np.lexsort((delta, pts))
    pts, depth = pts[order], np.cumsum(delta[order])
    k = np.flatnonzero(depth[:-1] == 2)
    s, e = pts[k], pts[k + 1]
    keep = e > s
    return s[keep], e[keep]


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """a minus b, for disjoint sorted sets: a intersected with the gaps of b."""
    if a[0].size == 0 or b[0].size == 0:
        return a
    gaps = (np.r_[-np.inf, b[1]], np.r_[b[0], np.inf])
    return intersect(a, gaps)


def lengths_within(iv: Intervals, lo, hi) -> np.ndarray:
    """Per window [lo[k], hi[k]): the length of ``iv`` (sorted, disjoint) inside it, all windows at once."""
    s, e = iv
    lo, hi = np.asarray(lo, dtype=float), np.asarray(hi, dtype=float)
    if s.size == 0:
        return np.zeros(lo.size)
    cum = np.r_[0.0, np.cumsum(e - s)]

    def covered(t):  # length of iv before t
        i = np.searchsorted(s, t, side="right")  # intervals starting at or before t
        last = np.maximum(i - 1, 0)
        part = np.where(i > 0, np.minimum(e[last], t) - s[last], 0.0)
        return cum[np.maximum(i - 1, 0)] * (i > 0) + np.maximum(part, 0.0)

    return np.maximum(covered(hi) - covered(lo), 0.0)
