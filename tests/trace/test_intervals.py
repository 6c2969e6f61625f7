"""Interval arithmetic checked against a brute-force count on an integer grid."""

import numpy as np

from diagnostics.trace import intervals as iv


def _grid(a, n=200):
    g = np.zeros(n, dtype=bool)
    for s, e in zip(*a):
        g[int(s):int(e)] = True
    return g


def test_union_intersect_subtract_match_a_grid():
    rng = np.random.default_rng(0)
    for _ in range(200):
        s1 = rng.integers(0, 180, 6)
        e1 = s1 + rng.integers(0, 20, 6)
        s2 = rng.integers(0, 180, 5)
        e2 = s2 + rng.integers(0, 20, 5)
        a, b = iv.union(s1, e1), iv.union(s2, e2)
        ga, gb = _grid((s1, e1)), _grid((s2, e2))
        assert iv.length(a) == ga.sum()
        assert np.all(a[0][1:] > a[1][:-1])  # disjoint, sorted, not touching
        assert (_grid(iv.intersect(a, b)) == (ga & gb)).all()
        assert (_grid(iv.subtract(a, b)) == (ga & ~gb)).all()
        assert iv.length(iv.clip(a, 50, 120)) == ga[50:120].sum()
