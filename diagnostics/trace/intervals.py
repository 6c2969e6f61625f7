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
    """Intersection of two disjoint sorted sets (two-pointer merge)."""
    (as_, ae), (bs, be) = a, b
    out_s, out_e = [], []
    i = j = 0
    while i < as_.size and j < bs.size:
        lo, hi = max(as_[i], bs[j]), min(ae[i], be[j])
        if hi > lo:
            out_s.append(lo)
            out_e.append(hi)
        if ae[i] < be[j]:
            i += 1
        else:
            j += 1
    return np.array(out_s, dtype=float), np.array(out_e, dtype=float)


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """a minus b, for disjoint sorted sets."""
    if a[0].size == 0 or b[0].size == 0:
        return a
    cut = intersect(a, b)
    # Walk each a-interval and remove the cut pieces inside it (cuts are sorted, inside a).
    out_s, out_e = [], []
    j = 0
    cs, ce = cut
    for s, e in zip(a[0], a[1]):
        cur = s
        while j < cs.size and cs[j] < e:
            if cs[j] > cur:
                out_s.append(cur)
                out_e.append(cs[j])
            cur = max(cur, ce[j])
            j += 1
        if e > cur:
            out_s.append(cur)
            out_e.append(e)
    return np.array(out_s, dtype=float), np.array(out_e, dtype=float)
