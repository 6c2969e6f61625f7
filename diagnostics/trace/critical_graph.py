"""One profiler step as a dependency graph: its events (host calls, then the GPU work they launched), the
edges between their start and end nodes, and the longest path through them (``Graph.longest``).

``build(trace, span)`` is what critical_path.step_graph computes the path on; the rules the edges follow
(host thread order, launch -> GPU work, stream order, syncs, the sink) and how an edge that did not decide
its event's start is weighted are critical_path's module docstring's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from diagnostics.trace.breakdowns import gpu_step_attribution, step_spans
from diagnostics.trace.classify import GPU_SYNC_CATS, PYTHON_CATS, RUNTIME_CATS, SYNC_CALL_RE, host_mask
from diagnostics.trace.errors import TraceError
from diagnostics.trace.model import Trace, nesting_of
from diagnostics.trace.timeline import thread_label

#: Events of a step, at most, whose critical path is computed when a step is named.
MAX_EVENTS = 1_500_000
#: Float slack when comparing path lengths (µs).
EPS = 1e-6

SOURCE, SINK = 0, 1
# Edge types: an event's own time (leaf duration or a parent's self gap), and the dependencies.
OWN, GAP, LAUNCH, STREAM, PRIOR, SYNC_TAIL, THREAD_START, TO_SINK = range(8)


class Graph:
    """Nodes (2 per event plus source and sink) and edges, added one at a time (``add``) or as arrays
    (``add_many``) and frozen into arrays in the order they were added."""

    def __init__(self, n_events: int):
        self.n_nodes = 2 + 2 * n_events
        self._chunks = []   # (src, dst, w, type, event, binding) arrays, in order
        self.src, self.dst, self.w, self.type, self.event, self.binding = [], [], [], [], [], []

    def add(self, u, v, w, etype, event=-1, binding=True):
        self.src.append(u)
        self.dst.append(v)
        self.w.append(max(float(w), 0.0))
        self.type.append(etype)
        self.event.append(event)
        self.binding.append(binding)

    def _flush(self):
        if self.src:
            self._chunks.append((np.asarray(self.src, dtype=np.int64), np.asarray(self.dst, dtype=np.int64),
                                 np.asarray(self.w, dtype=float), np.asarray(self.type, dtype=np.int64),
                                 np.asarray(self.event, dtype=np.int64), np.asarray(self.binding, dtype=bool)))
            self.src, self.dst, self.w, self.type, self.event, self.binding = [], [], [], [], [], []

    def add_many(self, u, v, w, etype, event, binding=True):
        """Edges as arrays (``etype`` and ``binding`` may be scalars), after those added so far; weights
        below zero become zero, as ``add`` makes them."""
        self._flush()
        u = np.asarray(u, dtype=np.int64)
        n = u.size
        self._chunks.append((u, np.asarray(v, dtype=np.int64), np.maximum(np.asarray(w, dtype=float), 0.0),
                             np.broadcast_to(np.asarray(etype, dtype=np.int64), (n,)),
                             np.asarray(event, dtype=np.int64), np.broadcast_to(np.asarray(binding, dtype=bool), (n,))))

    def freeze(self):
        self._flush()
        dtypes = (np.int64, np.int64, float, np.int64, np.int64, bool)
        cols = list(zip(*self._chunks)) if self._chunks else [[np.zeros(0, dtype=t)] for t in dtypes]
        self._chunks = []
        self.src, self.dst, self.w, self.type, self.event, self.binding = (
            np.concatenate(c).astype(t, copy=False) for c, t in zip(cols, dtypes))
        # Python lists of the arrays, made once: the longest-path passes and the report walk them edge by edge.
        self.src_list, self.type_list, self.event_list = self.src.tolist(), self.type.tolist(), self.event.tolist()
        self.w_list, self.binding_list = self.w.tolist(), self.binding.tolist()
        # Kahn's order, and incoming edges per node (CSR over edges sorted by destination).
        order = np.argsort(self.dst, kind="stable")
        self.in_edges = order
        self.in_ptr = np.r_[0, np.cumsum(np.bincount(self.dst, minlength=self.n_nodes))]
        self._ins, self._ptr = self.in_edges.tolist(), self.in_ptr.tolist()
        indeg = np.bincount(self.dst, minlength=self.n_nodes)
        out_order = np.argsort(self.src, kind="stable")
        out_ptr = np.r_[0, np.cumsum(np.bincount(self.src, minlength=self.n_nodes))]
        ready = [int(v) for v in np.flatnonzero(indeg == 0)]
        indeg = indeg.tolist()
        dst, topo = self.dst.tolist(), []
        out_order, out_ptr = out_order.tolist(), out_ptr.tolist()
        while ready:
            u = ready.pop()
            topo.append(u)
            for e in out_order[out_ptr[u]:out_ptr[u + 1]]:
                v = dst[e]
                indeg[v] -= 1
                if indeg[v] == 0:
                    ready.append(v)
        if len(topo) != self.n_nodes:
            raise TraceError("critical path: the step's dependencies form a cycle (host and GPU clocks "
                             "disagree in this trace); it cannot be computed")
        self.topo = topo
        self.topo_pos = np.empty(self.n_nodes, dtype=np.int64)
        self.topo_pos[np.asarray(topo, dtype=np.int64)] = np.arange(self.n_nodes)
        # The topological order as runs: a node with one way in (most nodes) is (node, that edge), one with
        # several is (node, -1); the passes below read it instead of the in-edge pointers.
        n_in = np.diff(self.in_ptr)
        one_way = np.where(n_in == 1, order[np.minimum(self.in_ptr[:-1], max(order.size - 1, 0))], -1) \
            if order.size else np.full(self.n_nodes, -1, dtype=np.int64)
        self._steps = list(zip(topo, one_way[np.asarray(topo, dtype=np.int64)].tolist()))
        return self

    def longest(self, w: np.ndarray | None = None, base: tuple | None = None,
                changed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Longest distance from SOURCE to every node, and the edge each node's best path came in on.

        ``base`` (dist, pred of the unchanged graph) with ``changed`` (the edges whose weight ``w``
        changed): nodes ordered before every changed edge's head keep their base values, and only the
        rest is computed again."""
        w = self.w_list if w is None else w.tolist()
        src, ins, ptr, binding = self.src_list, self._ins, self._ptr, self.binding_list
        steps = self._steps
        if base is not None and changed is not None and changed.size:
            first = int(self.topo_pos[self.dst[changed]].min())
            dist, pred = base[0].tolist(), base[1].tolist()
            steps = steps[first:]
        else:
            dist, pred = [-np.inf] * self.n_nodes, [-1] * self.n_nodes
            dist[SOURCE] = 0.0
        for v, e in steps:
            if e >= 0:   # one way in: most nodes
                dist[v], pred[v] = dist[src[e]] + w[e], e
                continue
            lo, hi = ptr[v], ptr[v + 1]
            best, bp, bb = -np.inf, -1, False
            for e in ins[lo:hi]:
                d = dist[src[e]] + w[e]
                # Ties (common: the observed edges are tight) go to the edge that decided the start.
                if d > best + EPS or (d >= best - EPS and binding[e] and not bb):
                    best, bp, bb = (d if d > best else best), e, binding[e]
            if bp >= 0:
                dist[v], pred[v] = best, bp
        return np.asarray(dist), np.asarray(pred)

    def longest_to(self, target: int, w: np.ndarray, base_dist: np.ndarray, changed: np.ndarray) -> float:
        """``longest(w, base, changed)``'s distance to ``target`` alone (a what-if needs only the sink's): the
        same pass, ties and sums, without keeping the edges the paths came in on or making arrays of them."""
        if not changed.size:
            return float(base_dist[target])
        w = w.tolist()
        src, ins, ptr, binding = self.src_list, self._ins, self._ptr, self.binding_list
        first = int(self.topo_pos[self.dst[changed]].min())
        dist = base_dist.tolist()
        for v, e in self._steps[first:]:
            if e >= 0:
                dist[v] = dist[src[e]] + w[e]
                continue
            best, bp, bb = -np.inf, -1, False
            for e in ins[ptr[v]:ptr[v + 1]]:
                d = dist[src[e]] + w[e]
                if d > best + EPS or (d >= best - EPS and binding[e] and not bb):
                    best, bp, bb = (d if d > best else best), e, binding[e]
            if bp >= 0:
                dist[v] = best
        return float(dist[target])


def median_or_zero(values: list) -> float:
    return float(np.median(values)) if values else 0.0


def S(i: int) -> int:
    """The start node of event i."""
    return 2 + 2 * i


def E(i: int) -> int:
    """The end node of event i."""
    return 3 + 2 * i


@dataclass
class _Selected:
    """Which trace rows the step's graph holds: its host calls (``hrows``), then its GPU work (``gsel``)."""

    t0: float
    t1: float
    lanes_all: np.ndarray      # lane key per trace row
    step_lane: int
    gall: pd.DataFrame         # every GPU event with its step (breakdowns.gpu_step_attribution)
    gsel: pd.DataFrame         # this step's GPU events
    hrows: np.ndarray
    parent: np.ndarray         # nesting parent per trace row (host calls among host calls)
    draw_depth: np.ndarray     # the timeline's call depth per trace row


@dataclass
class _Events:
    """The step's events as the graph numbers them (host rows first, then GPU rows; ``rows``: trace rows),
    with what the path reports of each."""

    rows: np.ndarray
    n_h: int
    corr: np.ndarray           # correlation id per trace row
    start: np.ndarray          # µs from the step's start
    end: np.ndarray
    names: np.ndarray
    kind: np.ndarray
    is_rt: np.ndarray
    sync_call: np.ndarray
    where: np.ndarray
    row_label: np.ndarray
    lane_key: np.ndarray


def _select(trace: Trace, span: pd.Series) -> _Selected:
    """The step's host calls (its thread within the span, and the other threads that launched its GPU work)
    and its GPU work: the events its host calls launched (and, with no launch call, those put in it by time)."""
    ev = trace.events
    ts_all, dur_all = ev["ts"].to_numpy(), ev["dur"].to_numpy()
    t0, t1 = float(span["start_us"]), float(span["start_us"] + span["dur_us"])
    step_row = int(span["row"])
    lanes_all = trace.lane_keys()
    step_lane = lanes_all[step_row]
    # Index of this step among the step windows (views' step_i) is its rank by start.
    spans = step_spans(trace)
    step_i = int(np.flatnonzero(spans["row"].to_numpy() == step_row)[0])
    gall = gpu_step_attribution(trace)
    gsel = gall[(gall["step_i"] == step_i) & gall["attributed"].isin(["launch", "time"])]
    host = host_mask(trace) & ~trace.cat_mask(PYTHON_CATS)
    launch_lanes = set()
    rt = trace.complete_mask() & trace.cat_mask(RUNTIME_CATS)
    corr = ev["corr"].to_numpy()
    if len(gsel):
        want = set(gsel.loc[gsel["corr"] >= 0, "corr"].tolist())
        rows_rt = np.flatnonzero(rt & np.isin(corr, list(want))) if want else np.array([], dtype=np.int64)
        launch_lanes = set(lanes_all[rows_rt].tolist())
    lanes = {int(step_lane)} | {int(x) for x in launch_lanes}
    in_win = (ts_all >= t0) & (ts_all + dur_all <= t1 + EPS)   # calls inside the step's span
    hmask = host & in_win & np.isin(lanes_all, list(lanes))
    # Call depth as diagnostics.trace.timeline draws its rows (operators among operators), so that
    # the path can be marked on that timeline.
    py = trace.cat_mask(PYTHON_CATS)
    draw_depth = (nesting_of(trace, host_mask(trace) & ~py) if py.any() else trace.nesting())["depth"]
    return _Selected(t0=t0, t1=t1, lanes_all=lanes_all, step_lane=step_lane, gall=gall, gsel=gsel,
                     hrows=np.flatnonzero(hmask), parent=nesting_of(trace, hmask)["parent"], draw_depth=draw_depth)


def _events(trace: Trace, sel: _Selected, step: int, max_events: int) -> _Events:
    """The event table: host rows, then GPU rows, each with its times, kind and where it ran; a step with
    more than ``max_events`` events is refused, saying how to go on."""
    ev, gsel, hrows = trace.events, sel.gsel, sel.hrows
    rows = np.r_[hrows, gsel["row"].to_numpy()].astype(np.int64)
    n_h, n = hrows.size, rows.size
    if n > max_events:
        how = ("name a step to go up to " + f"{MAX_EVENTS:,}") if max_events < MAX_EVENTS else "pick a smaller step"
        raise TraceError(f"critical path: step {step} has {n:,} events, more than {max_events:,} ({how})")
    start = ev["ts"].to_numpy()[rows] - sel.t0
    end = start + ev["dur"].to_numpy()[rows]
    names = trace.strings("name", rows)
    cats = np.array([c.lower() for c in trace.strings("cat", rows)], dtype=object)
    kind = np.full(n, "cpu", dtype=object)
    is_rt = np.isin(cats, list(RUNTIME_CATS))
    sync_call = is_rt & np.array([bool(SYNC_CALL_RE.match(x)) for x in names], dtype=bool)
    kind[is_rt] = "runtime"      # "launch" once it is known to have started GPU work (_launches)
    kind[sync_call] = "sync"
    gkind = gsel["kind"].to_numpy()
    kind[n_h:] = np.where(np.isin(gkind, ["compute", "communication"]), "kernel", "copy")
    where = np.empty(n, dtype=object)
    pid_l, tid_l = trace.strings("pid", rows), trace.strings("tid", rows)
    where[:n_h] = [thread_label(trace.thread_names, p, t) for p, t in zip(pid_l[:n_h], tid_l[:n_h])]
    where[n_h:] = [f"GPU {d} stream {s}" for d, s in zip(gsel["device"], gsel["stream"])]
    row_label = where.copy()   # the timeline's row label: "pid/tid" (" · depth" below the top) or the stream's
    depth = np.zeros(n, dtype=np.int64)
    depth[:n_h] = np.maximum(sel.draw_depth[hrows], 0)
    row_label[:n_h] = [f"{p}/{t}" + (f" · {d}" if d else "") for p, t, d in zip(pid_l[:n_h], tid_l[:n_h], depth[:n_h])]
    # The timeline's lane key (timeline_data's "lane": "pid/tid", "GPU d stream s"), without the depth.
    lane_key = where.copy()
    lane_key[:n_h] = [f"{p}/{t}" for p, t in zip(pid_l[:n_h], tid_l[:n_h])]
    return _Events(rows=rows, n_h=n_h,
                   corr=ev["corr"].to_numpy(), start=start, end=end, names=names, kind=kind, is_rt=is_rt,
                   sync_call=sync_call, where=where, row_label=row_label, lane_key=lane_key)


def _host_edges(G: Graph, sel: _Selected, e: _Events) -> np.ndarray:
    """Host thread order: a call's start -> its children in order -> its end, one root call's end -> the
    next one's start. Returns each event's parent event (-1: a root, or GPU work).

    Built with array passes (issue #42: ~58k host calls a step on xDiT SD3.5), the edges in the order
    a loop over the calls adds them: each call's own edges by call, then each lane's roots, the lanes in
    the order their first root comes. Children and roots are ordered by (start, longest first, index)."""
    n_h, start, end = e.n_h, e.start[:e.n_h], e.end[:e.n_h]
    ev_parent = np.full(e.rows.size, -1, dtype=np.int64)
    hrows = e.rows[:n_h]   # ascending (np.flatnonzero in _select)
    prow = sel.parent[hrows]
    # parent trace row -> its event, when the parent is one of the step's host calls (else: a root)
    pos = np.minimum(np.searchsorted(hrows, prow), max(n_h - 1, 0))
    lookup = np.where((prow >= 0) & (hrows[pos] == prow), pos, -1) if n_h else np.zeros(0, dtype=np.int64)
    ev_parent[:n_h] = lookup
    idx = np.arange(n_h, dtype=np.int64)
    dur = end - start
    # Children: grouped by parent, each group in (start, longest first, index) order.
    kids = idx[lookup >= 0]
    kids = kids[np.lexsort((kids, -dur[kids], start[kids], lookup[kids]))]
    kp = lookup[kids]
    first = np.r_[True, kp[1:] != kp[:-1]] if kids.size else np.zeros(0, dtype=bool)
    last = np.r_[kp[1:] != kp[:-1], True] if kids.size else np.zeros(0, dtype=bool)
    has_kids = np.zeros(n_h, dtype=bool)
    has_kids[kp] = True
    # Each call's own edges, keyed (call, place): a leaf's S->E (not a sync call's: _sync_edges adds it);
    # a parent's S -> first child's S (place 0), child's E -> next child's S (place k), last child's E -> E.
    leaf = idx[~has_kids & ~e.sync_call[:n_h]]
    place = np.arange(kids.size) - np.maximum.accumulate(np.where(first, np.arange(kids.size), 0)) if kids.size \
        else np.zeros(0, dtype=np.int64)
    f, l_ = kids[first], kids[last]
    mid_a, mid_b = kids[:-1][~last[:-1]], kids[1:][~first[1:]]
    u = np.concatenate([S(leaf), S(kp[first]), E(mid_a), E(l_)])
    v = np.concatenate([E(leaf), S(f), S(mid_b), E(kp[last])])
    w = np.concatenate([dur[leaf], start[f] - start[kp[first]], start[mid_b] - end[mid_a], end[kp[last]] - end[l_]])
    owner = np.concatenate([leaf, kp[first], kp[1:][~first[1:]], kp[last]])
    key2 = np.concatenate([np.zeros(leaf.size, np.int64), np.zeros(f.size, np.int64), place[1:][~first[1:]],
                           place[last] + 1])
    order = np.lexsort((key2, owner))
    G.add_many(u[order], v[order], w[order], OWN, owner[order])
    # Roots, per lane: SOURCE -> the first root's start, root's end -> the next root's start, the last -> SINK.
    roots = idx[lookup < 0]
    if roots.size:
        lane = sel.lanes_all[e.rows[roots]].astype(np.int64)
        uniq, first_at, inv = np.unique(lane, return_index=True, return_inverse=True)
        rank_of = np.empty(uniq.size, dtype=np.int64)
        rank_of[np.argsort(first_at, kind="stable")] = np.arange(uniq.size)
        lane_rank = rank_of[inv]
        o = np.lexsort((roots, -dur[roots], start[roots], lane_rank))
        r, lr = roots[o], lane_rank[o]
        rfirst = np.r_[True, lr[1:] != lr[:-1]]
        rlast = np.r_[lr[1:] != lr[:-1], True]
        step_lane = int(sel.step_lane)
        firsts = r[rfirst]
        n_lanes = firsts.size
        # per lane, in lane order: the SOURCE edge, the edges between its roots, the SINK edge
        a_, b_ = r[:-1][~rlast[:-1]], r[1:][~rfirst[1:]]
        grp_mid = lr[1:][~rfirst[1:]]
        u = np.concatenate([np.full(n_lanes, SOURCE), E(a_), E(r[rlast])])
        v = np.concatenate([S(firsts), S(b_), np.full(n_lanes, SINK)])
        w = np.concatenate([start[firsts], start[b_] - end[a_], np.zeros(n_lanes)])
        t = np.concatenate([np.where(lane[o][rfirst] == step_lane, GAP, THREAD_START), np.full(b_.size, GAP),
                            np.full(n_lanes, TO_SINK)])
        ev = np.concatenate([firsts, b_, r[rlast]])
        grp = np.concatenate([lr[rfirst], grp_mid, lr[rlast]])
        sub = np.concatenate([np.zeros(n_lanes, np.int64), np.ones(b_.size, np.int64), np.full(n_lanes, 2)])
        o2 = np.lexsort((sub, grp))   # stable: the edges between roots keep their order
        G.add_many(u[o2], v[o2], w[o2], t[o2], ev[o2])
    return ev_parent


def _launches(sel: _Selected, e: _Events) -> dict:
    """GPU event -> the runtime call that launched it (by correlation id, or an "ac2g" flow's start time);
    such calls become kind "launch"."""
    launch_of, by_corr, by_time = {}, {}, {}
    for i in np.flatnonzero(e.is_rt[:e.n_h]).tolist():
        c = int(e.corr[e.rows[i]])
        if c >= 0:
            by_corr.setdefault(c, i)
        by_time.setdefault(round(float(e.start[i]), 3), i)
    gcorr, glaunch = sel.gsel["corr"].to_numpy(), sel.gsel["launch_start_us"].to_numpy() - sel.t0
    for j in range(len(sel.gsel)):
        li = by_corr.get(int(gcorr[j])) if gcorr[j] >= 0 else None
        if li is None and np.isfinite(glaunch[j]):  # linked by an ac2g flow: the call that starts there
            li = by_time.get(round(float(glaunch[j]), 3))
        if li is not None:
            launch_of[e.n_h + j] = li
            if e.kind[li] == "runtime":
                e.kind[li] = "launch"
    return launch_of


def _stream_chains(sel: _Selected, e: _Events) -> list:
    """Per stream: its events in order, and the end of earlier steps' work still on it (None: none)."""
    gall, gdev, gstream = sel.gall, sel.gsel["device"].to_numpy(), sel.gsel["stream"].to_numpy()
    mine = set(sel.gsel["row"].tolist())
    chains = []
    for key in sorted({(a, b) for a, b in zip(gdev, gstream)}):
        js = sorted((e.n_h + j for j in np.flatnonzero((gdev == key[0]) & (gstream == key[1]))),
                    key=lambda i: (e.start[i], e.end[i]))
        # Work of other steps on this stream that started before this step's first event there.
        other = gall[(gall["device"] == key[0]) & (gall["stream"] == key[1]) & ~gall["row"].isin(mine)
                     & (gall["start_us"] < sel.t0 + e.start[js[0]])]
        chains.append((js, float(other["end_us"].max()) - sel.t0 if len(other) else None))
    return chains


def _gpu_edges(G: Graph, sel: _Selected, e: _Events, launch_of: dict, pending: list) -> tuple[list, list]:
    """Launch and stream edges of the GPU events (into ``pending``: weighted once the typical latencies are
    known); the later predecessor decided the start. Returns the launch latencies and stream gaps seen on
    the edges that decided."""
    start, end = e.start, e.end
    chains = _stream_chains(sel, e)
    # The launch latency of the events whose launch came after the stream was free (they can only
    # have waited for it) says how long a launch takes here; with it, an event whose launch came
    # shortly before the previous event ended is still put down to its launch when launch plus
    # latency is the later of the two.
    plain = [start[i] - start[launch_of[i]] for js, prior in chains for k, i in enumerate(js)
             if i in launch_of and start[launch_of[i]] >= (end[js[k - 1]] if k else (prior or -np.inf))]
    lat_est = max(median_or_zero(plain), 0.0)
    lat_seen, gap_seen = [], []
    for js, prior_end in chains:
        prev = None
        for i in js:
            li = launch_of.get(i)
            a = start[li] if li is not None else None
            b = end[prev] if prev is not None else prior_end
            launch_decides = a is not None and (b is None or a + min(lat_est, start[i] - a) >= b)
            if a is not None:
                pending.append((LAUNCH, S(li), S(i), start[i] - a, i, launch_decides))
                if launch_decides:
                    lat_seen.append(max(start[i] - a, 0.0))
            if prev is not None:
                pending.append((STREAM, E(prev), S(i), start[i] - end[prev], i, not launch_decides))
                if not launch_decides:
                    gap_seen.append(max(start[i] - end[prev], 0.0))
            elif (b is not None and b > 0) or a is None:
                # The stream still ran earlier steps' work (or no launch call is known): a fixed wait
                # from the step's start.
                pending.append((PRIOR, SOURCE, S(i), start[i], i, not launch_decides))
            G.add(S(i), E(i), end[i] - start[i], OWN, i)
            G.add(E(i), SINK, 0.0, TO_SINK, i)
            prev = i
    return lat_seen, gap_seen


def _sync_edges(G: Graph, trace: Trace, sel: _Selected, e: _Events, launch_of: dict, pending: list) -> list:
    """Syncs: a blocking call ends when the GPU work it waited for has ended. Returns the return latencies
    of the syncs that waited."""
    n_h, start, end = e.n_h, e.start, e.end
    gsel = sel.gsel
    gcorr, gdev, gstream = gsel["corr"].to_numpy(), gsel["device"].to_numpy(), gsel["stream"].to_numpy()
    sync_rows = np.flatnonzero(e.sync_call[:n_h])
    scopes = _sync_streams(trace, e.corr, e.rows[sync_rows])
    g_launch = np.array([start[launch_of[n_h + j]] if (n_h + j) in launch_of else np.inf
                         for j in range(len(gsel))])
    g_end = end[n_h:]
    tail_seen = []
    for i in sync_rows.tolist():
        c = int(e.corr[e.rows[i]])
        target = _waited_on(start[i], end[i], c, gcorr, g_launch, g_end, gdev, gstream, scopes.get(c))
        target = None if target is None else n_h + target
        waited = target is not None and end[target] >= start[i]
        if target is not None:
            pending.append((SYNC_TAIL, E(target), E(i), end[i] - end[target], i, waited))
            if waited:
                tail_seen.append(max(end[i] - end[target], 0.0))
        own = (end[i] - end[target]) if waited else end[i] - start[i]
        G.add(S(i), E(i), own, OWN, i, binding=not waited)
    return tail_seen


def build(trace: Trace, span: pd.Series, max_events: int = MAX_EVENTS) -> dict:
    """The step ``span`` (a step_spans row) as a frozen Graph with its events: the model critical_path
    reports on (the longest path is computed by step_graph)."""
    sel = _select(trace, span)
    e = _events(trace, sel, int(span["step"]), max_events)
    n, n_h, t0, t1 = e.rows.size, e.n_h, sel.t0, sel.t1
    G = Graph(n)
    ev_parent = _host_edges(G, sel, e)
    launch_of = _launches(sel, e)
    pending = []  # (edge type, u, v, observed gap, event, decided)
    lat_seen, gap_seen = _gpu_edges(G, sel, e, launch_of, pending)
    tail_seen = _sync_edges(G, trace, sel, e, launch_of, pending)
    typical = {LAUNCH: median_or_zero(lat_seen), STREAM: median_or_zero(gap_seen),
               SYNC_TAIL: median_or_zero(tail_seen), PRIOR: 0.0}
    for etype, u, v, gap, i, decided in pending:
        w = gap if decided or etype == PRIOR else min(max(gap, 0.0), typical[etype])
        G.add(u, v, w, etype, i, binding=decided)
    G.add(SOURCE, SINK, 0.0, TO_SINK, -1, binding=False)  # an empty step still has a length
    G.freeze()
    step_end = max([t1 - t0] + [float(x) for x in e.end[n_h:]]) if n else t1 - t0
    gall, gsel = sel.gall, sel.gsel
    return {"graph": G, "rows": e.rows, "n_host": n_h, "names": e.names, "kind": e.kind, "start": e.start,
            "end": e.end,
            # every GPU event of the trace (ends from the step's start, names, device/stream), and the
            # step's own events' device/stream: what explains a wait on the path (_explain)
            "all_gpu": (gall["end_us"].to_numpy() - t0, gall["name"].to_numpy(),
                        (gall["device"].astype(str) + "/" + gall["stream"].astype(str)).to_numpy()),
            "gpu_key": np.array([f"{d}/{s}" for d, s in zip(gsel["device"].to_numpy(), gsel["stream"].to_numpy())],
                                dtype=object),
            "where": e.where, "lane": e.row_label, "lane_key": e.lane_key, "parent": ev_parent,
            "step": int(span["step"]), "t0": t0, "step_us": step_end,
            "host_span_us": t1 - t0, "launch_of": launch_of, "typical": typical}


def _sync_streams(trace: Trace, corr: np.ndarray, sync_rows: np.ndarray) -> dict:
    """Correlation id -> (device, stream or None) of the GPU-timeline sync events ("cuda_sync":
    "Stream Sync" names a stream, "Context Sync" / "Event Sync" do not)."""
    want = {int(corr[r]) for r in sync_rows if corr[r] >= 0}
    if not want:
        return {}
    ev = trace.events
    m = trace.complete_mask() & trace.cat_mask(GPU_SYNC_CATS) & np.isin(corr, list(want))
    out = {}
    rows = np.flatnonzero(m)
    names = trace.strings("name", rows)
    for r, name in zip(rows, names):
        dev, st = int(ev["device"].iat[r]), int(ev["stream"].iat[r])
        scoped = "stream" in name.lower() and st >= 0
        out[int(corr[r])] = (str(dev) if dev >= 0 else None, str(st) if scoped else None)
    return out


def _waited_on(s0, s1, c, gcorr, g_launch, g_end, gdev, gstream, scope) -> int | None:
    """Index (into the step's GPU events) of what a blocking call over [s0, s1] waited for: its own
    copy (a synchronous memcpy), else the latest-ending event launched before the call began that
    ended by the call's end, on the stream a "Stream Sync" names (on any stream otherwise)."""
    if c >= 0:
        own = np.flatnonzero(gcorr == c)
        if own.size:
            return int(own[np.argmax(g_end[own])])
    ok = (g_launch < s0) & (g_end <= s1 + EPS)
    dev, stream = scope if scope else (None, None)
    if dev is not None:
        ok &= gdev == dev
    if stream is not None:
        ok &= gstream == stream
    cand = np.flatnonzero(ok)
    return int(cand[np.argmax(g_end[cand])]) if cand.size else None
