"""critical_graph's host edges (issue #42: built with array passes) against the loop they replaced, on random
nestings: the same edges, in the same order (the longest path's ties follow the order edges come in)."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pytest

from diagnostics.trace.critical_graph import (
    E, GAP, OWN, S, SINK, SOURCE, THREAD_START, TO_SINK, Graph, _host_edges,
)


def _host_edges_loop(G, sel, e):
    """The loop _host_edges replaced (as it was before issue #42), kept as the reference."""
    start, end, rows = e.start, e.end, e.rows
    ev_parent = np.full(rows.size, -1, dtype=np.int64)
    children, roots = defaultdict(list), defaultdict(list)
    for i in range(e.n_h):
        p = int(sel.parent[rows[i]])
        if p >= 0 and p in e.index:
            ev_parent[i] = e.index[p]
            children[e.index[p]].append(i)
        else:
            roots[int(sel.lanes_all[rows[i]])].append(i)
    order_key = lambda i: (start[i], -(end[i] - start[i]))  # noqa: E731
    for i in range(e.n_h):
        kids = sorted(children.get(i, ()), key=order_key)
        if not kids:
            if not e.sync_call[i]:
                G.add(S(i), E(i), end[i] - start[i], OWN, i)
            continue
        G.add(S(i), S(kids[0]), start[kids[0]] - start[i], OWN, i)
        for a, b in zip(kids, kids[1:]):
            G.add(E(a), S(b), start[b] - end[a], OWN, i)
        G.add(E(kids[-1]), E(i), end[i] - end[kids[-1]], OWN, i)
    for lane, rs in roots.items():
        rs = sorted(rs, key=order_key)
        G.add(SOURCE, S(rs[0]), start[rs[0]], GAP if lane == int(sel.step_lane) else THREAD_START, rs[0])
        for a, b in zip(rs, rs[1:]):
            G.add(E(a), S(b), start[b] - end[a], GAP, b)
        G.add(E(rs[-1]), SINK, 0.0, TO_SINK, rs[-1])
    return ev_parent


def _random_step(rng, n_h: int, n_gpu: int):
    """A step's host calls on 1-4 lanes with random parents (some outside the step: roots), start times on a
    coarse grid (ties in start and length), some sync calls, trace rows with gaps, then GPU rows."""
    n_rows = 3 * (n_h + n_gpu) + 5
    rows_all = np.sort(rng.choice(n_rows, n_h + n_gpu, replace=False))
    hrows = rows_all[:n_h]
    rows = np.r_[hrows, rows_all[n_h:]].astype(np.int64)
    parent = np.full(n_rows, -1, dtype=np.int64)
    outside = np.setdiff1d(np.arange(n_rows), rows_all)   # rows of the trace not in the step
    for k in range(n_h):   # a parent is a host call (nesting_of over the step's host rows) or outside the step
        if k and rng.random() < 0.7:
            parent[hrows[k]] = hrows[rng.integers(0, k)] if rng.random() < 0.9 else rng.choice(outside)
    start = np.r_[rng.integers(0, 20, n_h).astype(float), rng.uniform(0, 30, n_gpu)]
    end = start + np.r_[rng.integers(0, 4, n_h).astype(float), rng.uniform(0, 3, n_gpu)]
    lanes_all = rng.integers(0, rng.integers(1, 5), n_rows)
    sel = SimpleNamespace(parent=parent, lanes_all=lanes_all, step_lane=int(lanes_all[hrows[0]]) if n_h else 0)
    e = SimpleNamespace(n_h=n_h, start=start, end=end, rows=rows, index={int(r): i for i, r in enumerate(rows)},
                        sync_call=np.r_[rng.random(n_h) < 0.15, np.zeros(n_gpu, dtype=bool)])
    return sel, e


def _edges(G):
    return [G.src.tolist(), G.dst.tolist(), G.w.tolist(), G.type.tolist(), G.event.tolist(), G.binding.tolist()]


@pytest.mark.parametrize("seed", range(40))
def test_host_edges_equal_the_loop_they_replaced(seed):
    rng = np.random.default_rng(seed)
    sel, e = _random_step(rng, int(rng.integers(0, 60)), int(rng.integers(0, 5)))
    new, old = Graph(e.rows.size), Graph(e.rows.size)
    for G in (new, old):   # the GPU and sync edges come after the host edges in build(): one more edge each
        G.add(SOURCE, SINK, 0.0, TO_SINK, -1, binding=False)
    p_new, p_old = _host_edges(new, sel, e), _host_edges_loop(old, sel, e)
    for G in (new, old):
        G.add(SOURCE, SINK, 0.0, TO_SINK, -1, binding=False)
    assert p_new.tolist() == p_old.tolist()
    new._flush(), old._flush()
    got = [np.concatenate(c).tolist() for c in zip(*new._chunks)]
    want = [np.concatenate(c).tolist() for c in zip(*old._chunks)]
    assert got == want
    assert len(got[0]) >= e.n_h   # every call has an edge into or out of it: the comparison is not empty


def test_graph_add_many_keeps_the_order_and_clamps_like_add():
    one, many = Graph(3), Graph(3)
    for u, v, w, t, ev in [(0, 2, 1.5, OWN, 0), (2, 3, -2.0, GAP, 0), (3, 1, 0.0, TO_SINK, 0)]:
        one.add(u, v, w, t, ev)
    many.add(0, 2, 1.5, OWN, 0)
    many.add_many([2, 3], [3, 1], [-2.0, 0.0], [GAP, TO_SINK], [0, 0])
    one.freeze(), many.freeze()
    assert _edges(one) == _edges(many)
    assert many.w.tolist() == [1.5, 0.0, 0.0]
    dist, pred = many.longest()
    assert dist[SINK] == pytest.approx(1.5) and pred[SINK] == 2


@pytest.mark.parametrize("seed", range(20))
def test_longest_to_is_longests_distance_on_random_graphs(seed):
    """What-ifs ask longest_to (no paths kept): the same distance as longest with the same base and changes, on
    random DAGs with tied (integer) weights and mixed binding edges."""
    rng = np.random.default_rng(seed)
    n_events = int(rng.integers(2, 40))
    G = Graph(n_events)
    n = G.n_nodes
    order = np.r_[SOURCE, rng.permutation(np.arange(2, n)), SINK]   # a topological order to draw edges along
    for _ in range(int(rng.integers(n, 4 * n))):
        a, b = sorted(rng.choice(n, 2, replace=False))
        G.add(int(order[a]), int(order[b]), float(rng.integers(0, 5)), OWN, int(rng.integers(0, n_events)),
              binding=bool(rng.random() < 0.5))
    G.add(SOURCE, SINK, 0.0, TO_SINK, -1, binding=False)
    G.freeze()
    dist, pred = G.longest()
    for _ in range(5):
        changed = np.flatnonzero(rng.random(G.w.size) < 0.2)
        w = G.w.copy()
        w[changed] /= 2.0
        want, _ = G.longest(w, base=(dist, pred), changed=changed)
        assert G.longest_to(SINK, w, dist, changed) == want[SINK]
    assert G.longest_to(SINK, G.w, dist, np.array([], dtype=np.int64)) == dist[SINK]
