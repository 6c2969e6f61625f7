"""The critical path of one profiler step: the chain of host ops, launches, kernels, copies and syncs
whose summed length is the step's time, with what-if estimates from re-running it.

The step becomes a graph (HTA's critical-path design, written afresh here): every event has a start
and an end node; edges carry time.

* host thread order: a call's start -> its first child's start -> ... -> its last child's end -> its
  end (the gaps are the call's self time), and one root call's end -> the next one's start (host time
  no call covers);
* launch -> GPU work: the runtime call's start -> the kernel's / copy's start (correlation id or
  "ac2g" flow, as diagnostics.trace.breakdowns links them);
* stream order: a GPU event's end -> the next event's start on the same stream; work launched
  before the step that still holds the stream is a fixed wait from the step's start;
* syncs (classify.SYNC_CALL_RE: cudaDeviceSynchronize, cudaStreamSynchronize, cudaEventSynchronize,
  synchronous cudaMemcpy): the GPU event it waited for -> the call's end;
* the sink: the step span's end and the end of every GPU event the step launched.

A GPU event starts when both its launch and its stream allow; the later of the two *decided* the
start (launch start + the step's typical launch latency against the previous event's end) and its
edge carries the observed gap. An edge that did not decide (a kernel queued long
after its launch) carries the median latency of that edge type among the edges that did, capped at
its observed gap: shorten the kernel ahead of it and the queued kernel moves up, as it would. A sync
call that waited keeps only its return latency as its own time. Built this way the longest path
from the step's start to the sink is the step's observed time, and a what-if (an event ``factor``
times faster) re-runs the longest-path computation with that event's edges shortened.

Not modelled: dependencies between host threads (another thread's first call is a fixed offset
from the step's start), cross-stream waits (cudaStreamWaitEvent: such a wait shows as an idle gap on
the stream), and CPU work outside the step's threads.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pandas as pd

from diagnostics.trace.classify import (
    GPU_SYNC_CATS, LAUNCH_CALL_RE, PYTHON_CATS, RUNTIME_CATS, STEP_RE, SYNC_CALL_RE, host_mask, step_label,
)
from diagnostics.trace.errors import TraceError
from diagnostics.trace.model import Trace, nesting_of
from diagnostics.trace.timeline import thread_label
from diagnostics.trace.breakdowns import gpu_step_attribution, step_spans, temporal_breakdown

#: The kinds of time on a path, in the order the breakdown lists them. cpu: host calls and the host
#: time between them; launch: runtime calls that started GPU work and the launch latency to the GPU
#: event's start; runtime: the other runtime calls (cudaMalloc, cudaFree, stream creation); kernel,
#: copy (memcpy and memset): GPU work; sync: what a blocking call took once the GPU was done (and its
#: own time when it did not wait); earlier-steps: a stream still running work launched before the step
#: (the GPU a step or more behind the CPU: busy, not idle); idle-wait: a stream idle between queued
#: events, or a thread's first call offset from the step's start.
KINDS = ("cpu", "launch", "runtime", "kernel", "copy", "sync", "earlier-steps", "idle-wait")
#: The default speed-up of a what-if ("this kernel 2x faster").
WHAT_IF_FACTOR = 2.0
#: Names whose what-if is computed (the largest by time on the path).
WHAT_IF_TOP = 10
#: Path events kept in the result (the breakdown counts them all).
MAX_PATH_ROWS = 2000
#: Events of a step, at most, whose critical path is computed when no step is named (the trace job
#: computes it on every open: about 3 s per 100,000 events here) and when one is (a minute or so).
MAX_EVENTS_AUTO = 250_000
MAX_EVENTS = 1_500_000
#: A wait on the path (earlier-steps, idle-wait) longer than this share of the step is explained in the
#: result's notes: what it waited for, as far as the trace tells.
EXPLAIN_SHARE = 0.10
#: An idle gap on a stream "ends as" another stream's event ends when that end is at most this far
#: before the gap's end (µs): a sign of a cross-stream wait (cudaStreamWaitEvent), which is not modelled.
CROSS_STREAM_SLACK_US = 50.0
#: Float slack when comparing path lengths (µs).
EPS = 1e-6

SOURCE, SINK = 0, 1
# Edge types: an event's own time (leaf duration or a parent's self gap), and the dependencies.
OWN, GAP, LAUNCH, STREAM, PRIOR, SYNC_TAIL, THREAD_START, TO_SINK = range(8)
_EDGE_KIND = {GAP: "cpu", LAUNCH: "launch", STREAM: "idle-wait", PRIOR: "earlier-steps", SYNC_TAIL: "sync",
              THREAD_START: "idle-wait", TO_SINK: "idle-wait"}


class UnknownStep(TraceError):
    """The step asked for is not in the trace."""


class _Graph:
    """Nodes (2 per event plus source and sink) and edges as growing lists, frozen into arrays."""

    def __init__(self, n_events: int):
        self.n_nodes = 2 + 2 * n_events
        self.src, self.dst, self.w, self.type, self.event, self.binding = [], [], [], [], [], []

    def add(self, u, v, w, etype, event=-1, binding=True):
        self.src.append(u)
        self.dst.append(v)
        self.w.append(max(float(w), 0.0))
        self.type.append(etype)
        self.event.append(event)
        self.binding.append(binding)

    def freeze(self):
        for k in ("src", "dst", "type", "event"):
            setattr(self, k, np.asarray(getattr(self, k), dtype=np.int64))
        self.w = np.asarray(self.w, dtype=float)
        self.binding = np.asarray(self.binding, dtype=bool)
        # Kahn's order, and incoming edges per node (CSR over edges sorted by destination).
        order = np.argsort(self.dst, kind="stable")
        self.in_edges = order
        self.in_ptr = np.r_[0, np.cumsum(np.bincount(self.dst, minlength=self.n_nodes))]
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
        return self

    def longest(self, w: np.ndarray | None = None, base: tuple | None = None,
                changed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Longest distance from SOURCE to every node, and the edge each node's best path came in on.

        ``base`` (dist, pred of the unchanged graph) with ``changed`` (the edges whose weight ``w``
        changed): nodes ordered before every changed edge's head keep their base values, and only the
        rest is computed again."""
        w = (self.w if w is None else w).tolist()
        src, ins, ptr = self.src.tolist(), self.in_edges.tolist(), self.in_ptr.tolist()
        binding = self.binding.tolist()
        topo = self.topo
        if base is not None and changed is not None and changed.size:
            first = int(self.topo_pos[self.dst[changed]].min())
            dist, pred = base[0].tolist(), base[1].tolist()
            topo = topo[first:]
        else:
            dist, pred = [-np.inf] * self.n_nodes, [-1] * self.n_nodes
            dist[SOURCE] = 0.0
        for v in topo:
            lo, hi = ptr[v], ptr[v + 1]
            if hi - lo == 1:   # one way in: most nodes
                e = ins[lo]
                dist[v], pred[v] = dist[src[e]] + w[e], e
                continue
            best, bp, bb = -np.inf, -1, False
            for e in ins[lo:hi]:
                d = dist[src[e]] + w[e]
                # Ties (common: the observed edges are tight) go to the edge that decided the start.
                if d > best + EPS or (d >= best - EPS and binding[e] and not bb):
                    best, bp, bb = (d if d > best else best), e, binding[e]
            if bp >= 0:
                dist[v], pred[v] = best, bp
        return np.asarray(dist), np.asarray(pred)


def _median_or_zero(values: list) -> float:
    return float(np.median(values)) if values else 0.0


def _pick_step(trace: Trace, step: int | None) -> pd.Series:
    spans = step_spans(trace)
    if not len(spans):
        raise TraceError(f"critical path: the trace has no profiler step ranges ({step_label(0)}, ...; record "
                         "it with torch.profiler's schedule and prof.step())")
    if step is not None:
        hit = spans[spans["step"] == int(step)]
        if not len(hit):
            have = ", ".join(str(s) for s in spans["step"].tolist()[:20])
            raise UnknownStep(f"critical path: no {step_label(step)} in this trace (steps: {have})")
        return hit.iloc[0]
    return None


def incomplete_steps(trace: Trace) -> list[int]:
    """Steps cut short by the end of profiling: a kernel launch call in the step's span (LAUNCH_CALL_RE,
    with a correlation id) whose GPU work is not in the trace. None when the trace has no GPU work
    at all (then nothing can be told)."""
    ev = trace.events
    gpu = gpu_step_attribution(trace)
    if not len(gpu):
        return []
    spans = step_spans(trace)
    rt = trace.complete_mask() & trace.cat_mask(RUNTIME_CATS) & trace.name_mask(LAUNCH_CALL_RE)
    corr = ev["corr"].to_numpy()
    rows = np.flatnonzero(rt & (corr >= 0) & ~np.isin(corr, gpu["corr"].to_numpy()))
    if not rows.size:
        return []
    ts = ev["ts"].to_numpy()[rows]
    lo = spans["start_us"].to_numpy()
    hi = lo + spans["dur_us"].to_numpy()
    cut = {int(n) for n, a, b in zip(spans["step"], lo, hi) if ((ts >= a) & (ts <= b)).any()}
    return sorted(cut)


def step_graph(trace: Trace, step: int | None = None) -> dict:
    """The dependency graph of profiler step ``step`` (default: the longest complete step, by its time
    from its host span's start to the end of its span or of its last GPU work, whichever is later;
    see incomplete_steps), with its events; what critical_path and what_if compute on."""
    chosen = _pick_step(trace, step)
    spans = step_spans(trace)
    cut = incomplete_steps(trace)
    how = f"step {step}, as asked"
    if chosen is None:
        g = gpu_step_attribution(trace)
        ends = (spans["start_us"] + spans["dur_us"]).to_numpy().copy()
        mine = g[g["attributed"].isin(["launch", "time"]) & (g["step_i"] >= 0)]
        for i, e in mine.groupby("step_i")["end_us"].max().items():
            ends[int(i)] = max(ends[int(i)], float(e))
        took = ends - spans["start_us"].to_numpy()
        complete = ~spans["step"].isin(cut).to_numpy()
        if complete.any():
            took = np.where(complete, took, -np.inf)
            how = "the longest complete step"
        else:
            how = "the longest step (none is complete)"
        chosen = spans.iloc[int(np.argmax(took))]
    model = _build(trace, chosen, MAX_EVENTS if step is not None else MAX_EVENTS_AUTO)
    model["chosen_as"], model["incomplete_steps"] = how, cut
    dist, pred = model["graph"].longest()
    model["length_us"], model["pred"], model["dist"] = float(dist[SINK]), pred, dist
    return model


def critical_path(trace: Trace, step: int | None = None, factor: float = WHAT_IF_FACTOR,
                  what_if_top: int = WHAT_IF_TOP, model: dict | None = None) -> dict:
    """The critical path of one step as plain data: the path's events, time by kind and what-ifs
    (see the module docstring). ``model``: a step_graph already built for this trace."""
    if not factor > 1.0:
        raise TraceError(f"critical path: the what-if factor must be above 1 (x times faster), got {factor}")
    model = model if model is not None else step_graph(trace, step)
    out = _report(model, factor, what_if_top)
    window = next((r for r in temporal_breakdown(trace)["gpu"] if r["step"] == out["step"]), None)
    out["gpu_window_us"] = window["window_us"] if window else None
    out["notes"] = span_notes(out) + out["notes"]
    return out


def span_notes(cp: dict) -> list[str]:
    """What each step time spans, said when they differ: the CPU step (the ProfilerStep range, the Steps
    table's figure), the path's (from the step's start to the end of its last GPU work) and the GPU
    window of the step (the per-step GPU figures')."""
    host, total, window = cp["host_span_us"], cp["step_us"], cp.get("gpu_window_us")
    if total <= host * 1.01 + 1.0:
        return []
    text = (f"This step's time here, {total / 1e3:,.3f} ms, runs from its start on the CPU to the end of its last GPU "
            f"work; its CPU step (its range on the CPU, as the Steps table gives it) is {host / 1e3:,.3f} ms")
    if window is not None:
        text += f", and the GPU ran its work in a {window / 1e3:,.3f} ms window (GPU time per step)"
    lag = cp.get("gpu_start_us")
    if lag is not None and lag > 0.25 * host:
        text += (f". Its first GPU work started {lag / 1e3:,.3f} ms after the CPU step began: the GPU runs "
                 f"{lag / host:.1f} steps behind the CPU, so a step's CPU and GPU time overlap the neighbours'"
                 " and the two figures are not one step's length")
    return [text + "."]


# ---- building the graph ------------------------------------------------------------------------

def _build(trace: Trace, span: pd.Series, max_events: int = MAX_EVENTS) -> dict:
    ev = trace.events
    ts_all, dur_all = ev["ts"].to_numpy(), ev["dur"].to_numpy()
    t0, t1 = float(span["start_us"]), float(span["start_us"] + span["dur_us"])
    step_row = int(span["row"])
    lanes_all = trace.lane_keys()
    step_lane = lanes_all[step_row]

    # GPU work of this step: the events its host calls launched (and, with no launch call, those put
    # in it by time). Index of this step among the step windows (views' step_i) is its rank by start.
    spans = step_spans(trace)
    step_i = int(np.flatnonzero(spans["row"].to_numpy() == step_row)[0])
    gall = gpu_step_attribution(trace)
    gsel = gall[(gall["step_i"] == step_i) & gall["attributed"].isin(["launch", "time"])]

    # Host events: the step's thread within the span, and the other threads that launched its GPU work.
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
    hrows = np.flatnonzero(hmask)
    nest = nesting_of(trace, hmask)
    parent = nest["parent"]
    # Call depth as diagnostics.trace.timeline draws its rows (operators among operators), so that
    # the path can be marked on that timeline.
    py = trace.cat_mask(PYTHON_CATS)
    draw_depth = (nesting_of(trace, host_mask(trace) & ~py) if py.any() else trace.nesting())["depth"]

    # Event table: host rows, then GPU rows.
    grows = gsel["row"].to_numpy()
    rows = np.r_[hrows, grows].astype(np.int64)
    n_h = hrows.size
    n = rows.size
    if n > max_events:
        how = ("name a step to go up to " + f"{MAX_EVENTS:,}") if max_events < MAX_EVENTS else "pick a smaller step"
        raise TraceError(f"critical path: step {int(span['step'])} has {n:,} events, more than {max_events:,} "
                         f"({how})")
    index = {int(r): i for i, r in enumerate(rows.tolist())}
    start = ts_all[rows] - t0
    end = start + dur_all[rows]
    names = trace.strings("name", rows)
    cats = np.array([c.lower() for c in trace.strings("cat", rows)], dtype=object)
    kind = np.full(n, "cpu", dtype=object)
    is_rt = np.isin(cats, list(RUNTIME_CATS))
    sync_call = is_rt & np.array([bool(SYNC_CALL_RE.match(x)) for x in names], dtype=bool)
    kind[is_rt] = "runtime"      # "launch" once it is known to have started GPU work (below)
    kind[sync_call] = "sync"
    gkind = gsel["kind"].to_numpy()
    kind[n_h:] = np.where(np.isin(gkind, ["compute", "communication"]), "kernel", "copy")
    where = np.empty(n, dtype=object)
    pid_l, tid_l = trace.strings("pid", rows), trace.strings("tid", rows)
    where[:n_h] = [thread_label(trace.thread_names, p, t) for p, t in zip(pid_l[:n_h], tid_l[:n_h])]
    where[n_h:] = [f"GPU {d} stream {s}" for d, s in zip(gsel["device"], gsel["stream"])]
    row_label = where.copy()   # the timeline's row label: "pid/tid" (" · depth" below the top) or the stream's
    depth = np.zeros(n, dtype=np.int64)
    depth[:n_h] = np.maximum(draw_depth[hrows], 0)
    row_label[:n_h] = [f"{p}/{t}" + (f" · {d}" if d else "") for p, t, d in zip(pid_l[:n_h], tid_l[:n_h], depth[:n_h])]
    # The timeline's lane key (timeline_data's "lane": "pid/tid", "GPU d stream s"), without the depth.
    lane_key = where.copy()
    lane_key[:n_h] = [f"{p}/{t}" for p, t in zip(pid_l[:n_h], tid_l[:n_h])]

    S = lambda i: 2 + 2 * i      # noqa: E731  start node of event i
    E = lambda i: 3 + 2 * i      # noqa: E731  end node of event i
    G = _Graph(n)
    ev_parent = np.full(n, -1, dtype=np.int64)

    # Host thread order.
    children = defaultdict(list)
    roots = defaultdict(list)
    for i in range(n_h):
        p = int(parent[rows[i]])
        if p >= 0 and p in index:
            ev_parent[i] = index[p]
            children[index[p]].append(i)
        else:
            roots[int(lanes_all[rows[i]])].append(i)
    order_key = lambda i: (start[i], -(end[i] - start[i]))  # noqa: E731
    for i in range(n_h):
        kids = sorted(children.get(i, ()), key=order_key)
        if not kids:
            if not sync_call[i]:
                G.add(S(i), E(i), end[i] - start[i], OWN, i)
            continue
        G.add(S(i), S(kids[0]), start[kids[0]] - start[i], OWN, i)
        for a, b in zip(kids, kids[1:]):
            G.add(E(a), S(b), start[b] - end[a], OWN, i)
        G.add(E(kids[-1]), E(i), end[i] - end[kids[-1]], OWN, i)
    for lane, rs in roots.items():
        rs = sorted(rs, key=order_key)
        if lane == int(step_lane):
            G.add(SOURCE, S(rs[0]), start[rs[0]], GAP, rs[0])
        else:
            G.add(SOURCE, S(rs[0]), start[rs[0]], THREAD_START, rs[0])
        for a, b in zip(rs, rs[1:]):
            G.add(E(a), S(b), start[b] - end[a], GAP, b)
        G.add(E(rs[-1]), SINK, 0.0, TO_SINK, rs[-1])

    # GPU events: launch and stream edges; the later predecessor decided the start.
    launch_of = {}
    rt_idx = np.flatnonzero(is_rt[:n_h])
    by_corr, by_time = {}, {}
    for i in rt_idx.tolist():
        c = int(corr[rows[i]])
        if c >= 0:
            by_corr.setdefault(c, i)
        by_time.setdefault(round(float(start[i]), 3), i)
    gcorr, glaunch = gsel["corr"].to_numpy(), gsel["launch_start_us"].to_numpy() - t0
    for j in range(len(gsel)):
        li = by_corr.get(int(gcorr[j])) if gcorr[j] >= 0 else None
        if li is None and np.isfinite(glaunch[j]):  # linked by an ac2g flow: the call that starts there
            li = by_time.get(round(float(glaunch[j]), 3))
        if li is not None:
            launch_of[n_h + j] = li
            if kind[li] == "runtime":
                kind[li] = "launch"
    gdev, gstream = gsel["device"].to_numpy(), gsel["stream"].to_numpy()
    mine = set(grows.tolist())
    pending = []  # (edge type, u, v, observed gap, event, decided)
    lat_seen, gap_seen = [], []
    chains = []   # per stream: its events in order, and the end of earlier steps' work still on it
    for key in sorted({(a, b) for a, b in zip(gdev, gstream)}):
        js = sorted((n_h + j for j in np.flatnonzero((gdev == key[0]) & (gstream == key[1]))),
                    key=lambda i: (start[i], end[i]))
        # Work of other steps on this stream that started before this step's first event there.
        other = gall[(gall["device"] == key[0]) & (gall["stream"] == key[1]) & ~gall["row"].isin(mine)
                     & (gall["start_us"] < t0 + start[js[0]])]
        chains.append((js, float(other["end_us"].max()) - t0 if len(other) else None))
    # The launch latency of the events whose launch came after the stream was free (they can only
    # have waited for it) says how long a launch takes here; with it, an event whose launch came
    # shortly before the previous event ended is still put down to its launch when launch plus
    # latency is the later of the two.
    plain = [start[i] - start[launch_of[i]] for js, prior in chains for k, i in enumerate(js)
             if i in launch_of and start[launch_of[i]] >= (end[js[k - 1]] if k else (prior or -np.inf))]
    lat_est = max(_median_or_zero(plain), 0.0)
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

    # Syncs: a blocking call ends when the GPU work it waited for has ended.
    sync_rows = np.flatnonzero(sync_call[:n_h])
    scopes = _sync_streams(trace, corr, rows[sync_rows])
    g_launch = np.array([start[launch_of[n_h + j]] if (n_h + j) in launch_of else np.inf
                         for j in range(len(gsel))])
    g_end = end[n_h:]
    tail_seen = []
    for i in sync_rows.tolist():
        c = int(corr[rows[i]])
        target = _waited_on(start[i], end[i], c, gcorr, g_launch, g_end, gdev, gstream, scopes.get(c))
        target = None if target is None else n_h + target
        waited = target is not None and end[target] >= start[i]
        if target is not None:
            pending.append((SYNC_TAIL, E(target), E(i), end[i] - end[target], i, waited))
            if waited:
                tail_seen.append(max(end[i] - end[target], 0.0))
        own = (end[i] - end[target]) if waited else end[i] - start[i]
        G.add(S(i), E(i), own, OWN, i, binding=not waited)

    typical = {LAUNCH: _median_or_zero(lat_seen), STREAM: _median_or_zero(gap_seen),
               SYNC_TAIL: _median_or_zero(tail_seen), PRIOR: 0.0}
    for etype, u, v, gap, i, decided in pending:
        w = gap if decided or etype == PRIOR else min(max(gap, 0.0), typical[etype])
        G.add(u, v, w, etype, i, binding=decided)
    G.add(SOURCE, SINK, 0.0, TO_SINK, -1, binding=False)  # an empty step still has a length
    G.freeze()
    step_end = max([t1 - t0] + [float(x) for x in end[n_h:]]) if n else t1 - t0
    return {"graph": G, "rows": rows, "n_host": n_h, "names": names, "kind": kind, "start": start, "end": end,
            # every GPU event of the trace (ends from the step's start, names, device/stream), and the
            # step's own events' device/stream: what explains a wait on the path (_explain)
            "all_gpu": (gall["end_us"].to_numpy() - t0, gall["name"].to_numpy(),
                        (gall["device"].astype(str) + "/" + gall["stream"].astype(str)).to_numpy()),
            "gpu_key": np.array([f"{d}/{s}" for d, s in zip(gdev, gstream)], dtype=object),
            "where": where, "lane": row_label, "lane_key": lane_key, "parent": ev_parent, "step": int(span["step"]), "t0": t0, "step_us": step_end,
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


# ---- the report --------------------------------------------------------------------------------

def path_edges(model: dict) -> list[int]:
    """The critical path's edges (indices into the graph's edge arrays), from the step's start to its end."""
    G, pred = model["graph"], model["pred"]
    edges, v = [], SINK
    while v != SOURCE and pred[v] >= 0:
        e = int(pred[v])
        edges.append(e)
        v = int(G.src[e])
    return edges[::-1]


def _edge_kind(model: dict, e: int) -> str:
    G = model["graph"]
    t = int(G.type[e])
    return model["kind"][int(G.event[e])] if t == OWN else _EDGE_KIND[t]


def _subtree(model: dict, events: set) -> np.ndarray:
    """Boolean mask over the events: ``events`` and every host call nested in them."""
    parent = model["parent"]
    out = np.zeros(parent.size, dtype=bool)
    out[list(events)] = True
    has = parent >= 0
    while True:
        grown = out | (has & out[np.where(has, parent, 0)])
        if (grown == out).all():
            return out
        out = grown


def what_if(model: dict, events, factor: float = WHAT_IF_FACTOR) -> dict:
    """The step's time with ``events`` (indices into the model's events; a host call with the calls
    nested in it) ``factor`` times faster: their own edges divided by ``factor``, the longest path
    computed again. Returns step_us (after) and saving_us."""
    G = model["graph"]
    chosen = _subtree(model, {int(x) for x in events})
    w = G.w.copy()
    hit = (G.event >= 0) & chosen[np.maximum(G.event, 0)] & (G.type == OWN) & (G.w > 0)
    w[hit] /= factor
    dist, _ = G.longest(w, base=(model["dist"], model["pred"]), changed=np.flatnonzero(hit))
    return {"step_us": float(dist[SINK]), "saving_us": float(model["length_us"] - dist[SINK])}


def on_path(model: dict) -> dict:
    """Event index -> its time on the critical path (own time; a sync call's return after the GPU)."""
    G = model["graph"]
    out = defaultdict(float)
    for e in path_edges(model):
        t, i = int(G.type[e]), int(G.event[e])
        if t in (OWN, SYNC_TAIL):
            out[i] += float(G.w[e])
    return dict(out)


def _report(model: dict, factor: float, what_if_top: int) -> dict:
    G = model["graph"]
    by_kind = {k: 0.0 for k in KINDS}
    rows, row_of, time_of = [], {}, defaultdict(float)
    wait_us, wait_text = 0.0, ""
    for e in path_edges(model):
        w, t, i = float(G.w[e]), int(G.type[e]), int(G.event[e])
        by_kind[_edge_kind(model, e)] += w
        if t == TO_SINK:
            continue
        if t not in (OWN, SYNC_TAIL):   # a dependency: charged to the event it leads to
            wait_us += w
            wait_text = _describe_wait(model, e) if (w > 0 or t in (LAUNCH, STREAM, PRIOR)) else wait_text
            continue
        time_of[i] += w
        if i not in row_of:
            row_of[i] = len(rows)
            rows.append({"event": i, "wait_before_us": wait_us, "waited_on": wait_text})
            wait_us, wait_text = 0.0, ""
        if t == SYNC_TAIL:
            rows[row_of[i]]["waited_on"] = _describe_wait(model, e)
    names, kinds, start, end = model["names"], model["kind"], model["start"], model["end"]
    path = [{"name": str(names[r["event"]]), "kind": str(kinds[r["event"]]), "where": str(model["where"][r["event"]]),
             "lane": str(model["lane"][r["event"]]), "lane_key": str(model["lane_key"][r["event"]]),
             "start_us": float(start[r["event"]]), "dur_us": float(end[r["event"]] - start[r["event"]]),
             "on_path_us": float(time_of[r["event"]]), "wait_before_us": float(r["wait_before_us"]),
             "waited_on": r["waited_on"]} for r in rows]
    # What-ifs: all of a name's calls in the step `factor` times faster, the largest on the path first.
    per_name = defaultdict(float)
    for i, us in time_of.items():
        # A sync is faster only when what it waits for is: no what-if of its own.
        if kinds[i] != "sync" and not _is_step_name(names[i]):
            per_name[(str(kinds[i]), str(names[i]))] += us
    ranked = [kv for kv in sorted(per_name.items(), key=lambda kv: -kv[1]) if kv[1] > 0][:what_if_top]
    what_ifs = []
    for (kind, name), us in ranked:
        members = np.flatnonzero((names == name) & (kinds == kind))
        r = what_if(model, members, factor)
        what_ifs.append({"name": name, "kind": kind, "calls": int(members.size), "on_path_us": float(us),
                         "saving_us": max(r["saving_us"], 0.0), "step_us_after": r["step_us"]})
    total = model["step_us"]
    gpu_starts = start[model["n_host"]:]
    return {
        "notes": _explain(model, total),
        "gpu_start_us": float(gpu_starts.min()) if gpu_starts.size else None,
        "step": model["step"], "chosen_as": model.get("chosen_as", ""),
        "incomplete_steps": list(model.get("incomplete_steps", [])), "step_start_us": model["t0"], "step_us": total,
        "host_span_us": model["host_span_us"], "length_us": model["length_us"], "factor": factor,
        "events": int(model["rows"].size), "edges": int(G.src.size),
        "path_events": len(path), "path": path[:MAX_PATH_ROWS],
        "by_kind": [{"kind": k, "us": by_kind[k], "pct": 100.0 * by_kind[k] / total if total else None}
                    for k in KINDS],
        "what_if": what_ifs,
        "typical_us": {"launch": model["typical"][LAUNCH], "stream_gap": model["typical"][STREAM],
                       "sync_return": model["typical"][SYNC_TAIL]},
    }


def _explain(model: dict, total: float) -> list[str]:
    """A sentence for each wait on the path (earlier-steps, idle-wait) longer than EXPLAIN_SHARE of the
    step: what the trace says it waited for."""
    G, n_h = model["graph"], model["n_host"]
    out = []
    for e in path_edges(model):
        t, w = int(G.type[e]), float(G.w[e])
        if t == OWN or _EDGE_KIND.get(t) not in ("earlier-steps", "idle-wait") or w <= EXPLAIN_SHARE * total:
            continue
        i = int(G.event[e])
        name, where = model["names"][i], model["where"][i]
        share = f"{w / 1e3:,.3f} ms ({100 * w / total:.0f} % of the step)"
        if t == PRIOR:
            out.append(f"{share} waiting for {where} to finish work launched before this step (the GPU was busy "
                       f"with earlier steps, not idle) before it could start {_short(name)}.")
        elif t == STREAM:
            gap_end = float(model["start"][i])
            ends, names, keys = model["all_gpu"]
            key = model["gpu_key"][i - n_h] if i >= n_h else None
            near = np.flatnonzero((keys != key) & (ends <= gap_end + EPS) & (ends >= gap_end - CROSS_STREAM_SLACK_US))
            if near.size:
                j = near[np.argmax(ends[near])]
                dev, stream = str(keys[j]).split("/", 1)
                cause = (f"the gap ended {gap_end - ends[j]:.1f} µs after {_short(str(names[j]))} ended on GPU {dev} "
                         f"stream {stream}: a wait on another stream (cudaStreamWaitEvent), which the path does not "
                         "follow")
            else:
                cause = "no other stream's work ended then: a wait the trace does not show (an event or a sync)"
            out.append(f"{share} with {where} idle before {_short(name)} although it had been launched; {cause}.")
        elif t == THREAD_START:
            out.append(f"{share} before the first call of {where} in the step ({_short(name)}): threads wait on one "
                       "another in ways the trace does not record.")
    return out


def _short(name: str, n: int = 60) -> str:
    """A kernel's name short enough for a sentence (templated C++ names run to hundreds of characters)."""
    name = str(name)
    return name if len(name) <= n else name[: n - 1] + "…"


def _is_step_name(name: str) -> bool:
    return bool(STEP_RE.match(str(name)))


def _describe_wait(model: dict, e: int) -> str:
    G = model["graph"]
    t, u, w = int(G.type[e]), int(G.src[e]), float(G.w[e])
    src = (u - 2) // 2 if u >= 2 else None
    if t == LAUNCH and src is not None:
        return f"launch by {model['names'][src]} ({w:.1f} µs latency)"
    if t == STREAM and src is not None:
        return f"{model['names'][src]} before it on {model['where'][src]} ({w:.1f} µs gap)"
    if t == SYNC_TAIL and src is not None:
        return f"{model['kind'][src]} {model['names'][src]} on {model['where'][src]} (returned {w:.1f} µs after it ended)"
    if t == PRIOR:
        return "work launched before the step, still running on its stream"
    if t == THREAD_START:
        return "its thread's first call in the step (offset from the step's start)"
    if t == GAP:
        return "host time between calls"
    return ""


# ---- export ----------------------------------------------------------------------------------

#: The category of the flow arrows that chain the path's events in an exported trace.
FLOW_CAT = "critical_path"
_FLOW_ID_BASE = 1 << 40   # above any correlation id, so the path's arrows never join a launch arrow


def _id(label: str):
    return int(label) if label.lstrip("-").isdigit() else label


def chrome_trace(trace: Trace, model: dict) -> dict:
    """The step's events as a Chrome / Kineto trace (opens in Perfetto and chrome://tracing, and in
    diagnostics.trace.load_trace): the path's events carry args {"critical": 1, "critical_path_us": its
    time on the path}, arrows of category FLOW_CAT chain them in path order, and the launch arrows
    ("ac2g") of the step's GPU work are kept."""
    ev = trace.events
    rows = model["rows"]
    time_of = on_path(model)
    order, seen = [], set()   # a set: `i not in order` made this quadratic (issue #42: 9 s for 17,571 path events)
    for e in path_edges(model):
        i = int(model["graph"].event[e])
        if int(model["graph"].type[e]) in (OWN, SYNC_TAIL) and i not in seen:
            seen.add(i)
            order.append(i)
    pid, tid = trace.strings("pid", rows), trace.strings("tid", rows)
    names, cats = trace.strings("name", rows), trace.strings("cat", rows)
    base = trace.origin_us
    ts = ev["ts"].to_numpy()[rows] + base
    dur = ev["dur"].to_numpy()[rows]
    cols = {"correlation": ev["corr"].to_numpy()[rows], "External id": ev["ext_id"].to_numpy()[rows],
            "device": ev["device"].to_numpy()[rows], "stream": ev["stream"].to_numpy()[rows]}
    out = []
    for label, name in trace.process_names.items():
        out.append({"ph": "M", "name": "process_name", "pid": _id(label), "tid": 0, "args": {"name": name}})
    for label, name in trace.thread_names.items():
        p, _, t = label.partition("/")
        out.append({"ph": "M", "name": "thread_name", "pid": _id(p), "tid": _id(t), "args": {"name": name}})
    for i in range(rows.size):
        args = {k: int(v[i]) for k, v in cols.items() if v[i] >= 0}
        if i in time_of:
            args.update({"critical": 1, "critical_path_us": round(time_of[i], 3)})
        out.append({"ph": "X", "cat": cats[i], "name": names[i], "pid": _id(pid[i]), "tid": _id(tid[i]),
                    "ts": float(ts[i]), "dur": float(dur[i]), "args": args})
    for k, i in model["launch_of"].items():   # launch call -> GPU event, as Kineto draws them
        c = int(cols["correlation"][k])
        if c >= 0:
            out += [{"ph": "s", "cat": "ac2g", "name": "ac2g", "id": c, "pid": _id(pid[i]), "tid": _id(tid[i]),
                     "ts": float(ts[i])},
                    {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": c, "bp": "e", "pid": _id(pid[k]),
                     "tid": _id(tid[k]), "ts": float(ts[k])}]
    for n, (a, b) in enumerate(zip(order, order[1:])):
        fid = _FLOW_ID_BASE + n
        out += [{"ph": "s", "cat": FLOW_CAT, "name": "critical path", "id": fid, "pid": _id(pid[a]),
                 "tid": _id(tid[a]), "ts": float(ts[a])},
                {"ph": "f", "cat": FLOW_CAT, "name": "critical path", "id": fid, "bp": "e", "pid": _id(pid[b]),
                 "tid": _id(tid[b]), "ts": float(ts[b])}]
    return {"schemaVersion": 1, "displayTimeUnit": "ms", "traceEvents": out,
            "critical_path": {"step": model["step"], "step_us": model["step_us"], "events": len(order)}}
