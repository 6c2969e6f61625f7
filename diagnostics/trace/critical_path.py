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

The graph is built in critical_graph.py; this module picks the step, reports the path and its what-ifs, and
writes the step out as a Chrome trace with the path marked.

Not modelled: dependencies between host threads (another thread's first call is a fixed offset
from the step's start), cross-stream waits (cudaStreamWaitEvent: such a wait shows as an idle gap on
the stream), and CPU work outside the step's threads.
"""

from __future__ import annotations

from collections import defaultdict

import msgspec
import numpy as np
import pandas as pd

from diagnostics.trace.classify import LAUNCH_CALL_RE, RUNTIME_CATS, STEP_RE, step_label
from diagnostics.trace.critical_graph import (  # noqa: F401  (MAX_EVENTS: the limit when a step is named)
    EPS, GAP, LAUNCH, MAX_EVENTS, OWN, PRIOR, SINK, SOURCE, STREAM, SYNC_TAIL, THREAD_START, TO_SINK, build,
)
from diagnostics.trace.errors import TraceError
from diagnostics.trace.model import Trace
from diagnostics.trace.records.critical_path import CriticalPath, PathEvent, PathKind, TypicalLatency, WhatIf
from diagnostics.trace.breakdowns import gpu_step_attribution, gpu_step_breakdown, step_spans

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
#: computes it on every open: about 3 s per 100,000 events here); when one is named, critical_graph.MAX_EVENTS
#: (a minute or so).
MAX_EVENTS_AUTO = 250_000
#: A wait on the path (earlier-steps, idle-wait) longer than this share of the step is explained in the
#: result's notes: what it waited for, as far as the trace tells.
EXPLAIN_SHARE = 0.10
#: An idle gap on a stream "ends as" another stream's event ends when that end is at most this far
#: before the gap's end (µs): a sign of a cross-stream wait (cudaStreamWaitEvent), which is not modelled.
CROSS_STREAM_SLACK_US = 50.0
# The graph (critical_graph.py): SOURCE, SINK and the edge types, each shown as a kind of time on the path.
_EDGE_KIND = {GAP: "cpu", LAUNCH: "launch", STREAM: "idle-wait", PRIOR: "earlier-steps", SYNC_TAIL: "sync",
              THREAD_START: "idle-wait", TO_SINK: "idle-wait"}


class UnknownStep(TraceError):
    """The step asked for is not in the trace."""


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
    model = build(trace, chosen, MAX_EVENTS if step is not None else MAX_EVENTS_AUTO)
    model["chosen_as"], model["incomplete_steps"] = how, cut
    dist, pred = model["graph"].longest()
    model["length_us"], model["pred"], model["dist"] = float(dist[SINK]), pred, dist
    return model


def critical_path(trace: Trace, step: int | None = None, factor: float = WHAT_IF_FACTOR,
                  what_if_top: int = WHAT_IF_TOP, model: dict | None = None) -> CriticalPath:
    """The critical path of one step: the path's events, time by kind and what-ifs (see the module
    docstring). ``model``: a step_graph already built for this trace."""
    if not factor > 1.0:
        raise TraceError(f"critical path: the what-if factor must be above 1 (x times faster), got {factor}")
    model = model if model is not None else step_graph(trace, step)
    cp = _report(model, factor, what_if_top)
    # the GPU part of temporal_breakdown alone: its host part (the call nesting's self times) is not needed here
    window = next((r for r in gpu_step_breakdown(trace)["gpu"] if r["step"] == cp.step), None)
    cp = msgspec.structs.replace(cp, gpu_window_us=window["window_us"] if window else None)
    return msgspec.structs.replace(cp, notes=tuple(span_notes(cp)) + cp.notes)


def span_notes(cp: CriticalPath) -> list[str]:
    """What each step time spans, said when they differ: the CPU step (the ProfilerStep range, the Steps
    table's figure), the path's (from the step's start to the end of its last GPU work) and the GPU
    window of the step (the per-step GPU figures')."""
    host, total, window = cp.host_span_us, cp.step_us, cp.gpu_window_us
    if total <= host * 1.01 + 1.0:
        return []
    text = (f"This step's time here, {total / 1e3:,.3f} ms, runs from its start on the CPU to the end of its last GPU "
            f"work; its CPU step (its range on the CPU, as the Steps table gives it) is {host / 1e3:,.3f} ms")
    if window is not None:
        text += f", and the GPU ran its work in a {window / 1e3:,.3f} ms window (GPU time per step)"
    lag = cp.gpu_start_us
    if lag is not None and lag > 0.25 * host:
        text += (f". Its first GPU work started {lag / 1e3:,.3f} ms after the CPU step began: the GPU runs "
                 f"{lag / host:.1f} steps behind the CPU, so a step's CPU and GPU time overlap the neighbours'"
                 " and the two figures are not one step's length")
    return [text + "."]


# ---- the report --------------------------------------------------------------------------------

def path_edges(model: dict) -> list[int]:
    """The critical path's edges (indices into the graph's edge arrays), from the step's start to its end.
    Walked once per model (the report, its notes and the export all ask for it)."""
    got = model.get("path_edges")
    if got is not None:
        return got
    G = model["graph"]
    pred, src = model["pred"].tolist(), G.src_list
    edges, v = [], SINK
    while v != SOURCE and pred[v] >= 0:
        e = pred[v]
        edges.append(e)
        v = src[e]
    model["path_edges"] = edges = edges[::-1]
    return edges


def _edge_kind(model: dict, e: int) -> str:
    G = model["graph"]
    t = G.type_list[e]
    return model["kind"][G.event_list[e]] if t == OWN else _EDGE_KIND[t]


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


def what_if(model: dict, events, factor: float = WHAT_IF_FACTOR, chosen: np.ndarray | None = None) -> dict:
    """The step's time with ``events`` (indices into the model's events; a host call with the calls
    nested in it) ``factor`` times faster: their own edges divided by ``factor``, the longest path
    computed again. Returns step_us (after) and saving_us. ``chosen``: their _subtree, where known."""
    G = model["graph"]
    if chosen is None:
        chosen = _subtree(model, {int(x) for x in events})
    w = G.w.copy()
    hit = (G.event >= 0) & chosen[np.maximum(G.event, 0)] & (G.type == OWN) & (G.w > 0)
    w[hit] /= factor
    after = G.longest_to(SINK, w, model["dist"], np.flatnonzero(hit))
    return {"step_us": after, "saving_us": float(model["length_us"] - after)}


def on_path(model: dict) -> dict:
    """Event index -> its time on the critical path (own time; a sync call's return after the GPU)."""
    G = model["graph"]
    out = defaultdict(float)
    edges = np.asarray(path_edges(model), dtype=np.int64)
    own = edges[np.isin(G.type[edges], (OWN, SYNC_TAIL))]
    for i, w in zip(G.event[own].tolist(), G.w[own].tolist()):
        out[i] += w
    return dict(out)


def _report(model: dict, factor: float, what_if_top: int) -> CriticalPath:
    G = model["graph"]
    by_kind = {k: 0.0 for k in KINDS}
    rows, row_of, time_of = [], {}, defaultdict(float)
    wait_us, wait_edge = 0.0, -1    # the wait is described (_describe_wait) only for the rows kept
    kinds = model["kind"]
    w_l, t_l, ev_l = G.w_list, G.type_list, G.event_list
    for e in path_edges(model):
        w, t, i = w_l[e], t_l[e], ev_l[e]
        by_kind[kinds[i] if t == OWN else _EDGE_KIND[t]] += w
        if t == TO_SINK:
            continue
        if t not in (OWN, SYNC_TAIL):   # a dependency: charged to the event it leads to
            wait_us += w
            wait_edge = e if (w > 0 or t in (LAUNCH, STREAM, PRIOR)) else wait_edge
            continue
        time_of[i] += w
        if i not in row_of:
            row_of[i] = len(rows)
            rows.append([i, wait_us, wait_edge])
            wait_us, wait_edge = 0.0, -1
        if t == SYNC_TAIL:
            rows[row_of[i]][2] = e
    names, start, end = model["names"], model["start"], model["end"]
    path = [PathEvent(name=str(names[i]), kind=str(kinds[i]), where=str(model["where"][i]), lane=str(model["lane"][i]),
                      lane_key=str(model["lane_key"][i]), start_us=float(start[i]), dur_us=float(end[i] - start[i]),
                      on_path_us=float(time_of[i]), wait_before_us=float(wait),
                      waited_on=_describe_wait(model, we) if we >= 0 else "")
            for i, wait, we in rows[:MAX_PATH_ROWS]]
    # What-ifs: all of a name's calls in the step `factor` times faster, the largest on the path first.
    per_name = defaultdict(float)
    step_name = {}   # name -> whether it is a profiler step's (asked once per name)
    for i, us in time_of.items():
        # A sync is faster only when what it waits for is: no what-if of its own.
        name = names[i]
        if name not in step_name:
            step_name[name] = _is_step_name(name)
        if kinds[i] != "sync" and not step_name[name]:
            per_name[(str(kinds[i]), str(name))] += us
    ranked = [kv for kv in sorted(per_name.items(), key=lambda kv: -kv[1]) if kv[1] > 0][:what_if_top]
    what_ifs = []
    on_path_at = np.zeros(names.size)
    on_path_at[list(time_of)] = list(time_of.values())
    for (kind, name), us in ranked:
        members = np.flatnonzero((names == name) & (kinds == kind))
        chosen = _subtree(model, {int(x) for x in members})
        r = what_if(model, members, factor, chosen)
        # what the what-if cuts on the path: the calls' own time and their nested calls' (an aten::linear's
        # addmm and launches): the saving is never more than (1 - 1/factor) of it
        what_ifs.append(WhatIf(name=name, kind=kind, calls=int(members.size), on_path_us=float(us),
                               saving_us=max(r["saving_us"], 0.0), step_us_after=r["step_us"],
                               sped_up_us=float(on_path_at[chosen].sum())))
    total = model["step_us"]
    gpu_starts = start[model["n_host"]:]
    return CriticalPath(
        available=True, notes=tuple(_explain(model, total)),
        gpu_start_us=float(gpu_starts.min()) if gpu_starts.size else None,
        step=model["step"], chosen_as=model.get("chosen_as", ""),
        incomplete_steps=tuple(model.get("incomplete_steps", [])), step_start_us=model["t0"], step_us=total,
        host_span_us=model["host_span_us"], length_us=model["length_us"], factor=factor,
        events=int(model["rows"].size), edges=int(G.src.size),
        path_events=len(rows), path=tuple(path),
        by_kind=tuple(PathKind(kind=k, us=by_kind[k], pct=100.0 * by_kind[k] / total if total else None) for k in KINDS),
        what_if=tuple(what_ifs),
        typical_us=TypicalLatency(launch=model["typical"][LAUNCH], stream_gap=model["typical"][STREAM],
                                  sync_return=model["typical"][SYNC_TAIL]))


def _explain(model: dict, total: float) -> list[str]:
    """A sentence for each wait on the path (earlier-steps, idle-wait) longer than EXPLAIN_SHARE of the
    step: what the trace says it waited for."""
    G, n_h = model["graph"], model["n_host"]
    out = []
    for e in path_edges(model):
        t, w = G.type_list[e], G.w_list[e]
        if t == OWN or _EDGE_KIND.get(t) not in ("earlier-steps", "idle-wait") or w <= EXPLAIN_SHARE * total:
            continue
        i = G.event_list[e]
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
    t, u, w = G.type_list[e], G.src_list[e], G.w_list[e]
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
        i = model["graph"].event_list[e]
        if model["graph"].type_list[e] in (OWN, SYNC_TAIL) and i not in seen:
            seen.add(i)
            order.append(i)
    # Python lists, each label's id made once: one step holds ~66k events on xDiT SD3.5 (issue #42)
    ids = {}
    for col in ("pid", "tid"):
        ids.update((label, _id(label)) for label in trace.labels(col).tolist())
    pid = [ids[x] for x in trace.strings("pid", rows).tolist()]
    tid = [ids[x] for x in trace.strings("tid", rows).tolist()]
    names, cats = trace.strings("name", rows).tolist(), trace.strings("cat", rows).tolist()
    base = trace.origin_us
    ts = (ev["ts"].to_numpy()[rows] + base).tolist()
    dur = ev["dur"].to_numpy()[rows].tolist()
    cols = {"correlation": ev["corr"].to_numpy()[rows].tolist(), "External id": ev["ext_id"].to_numpy()[rows].tolist(),
            "device": ev["device"].to_numpy()[rows].tolist(), "stream": ev["stream"].to_numpy()[rows].tolist()}
    out = []
    for label, name in trace.process_names.items():
        out.append({"ph": "M", "name": "process_name", "pid": _id(label), "tid": 0, "args": {"name": name}})
    for label, name in trace.thread_names.items():
        p, _, t = label.partition("/")
        out.append({"ph": "M", "name": "thread_name", "pid": _id(p), "tid": _id(t), "args": {"name": name}})
    # Each event's args: the id columns it has (>= 0), in the order of ``cols``, then the path's marks.
    marks = {i: round(us, 3) for i, us in time_of.items()}
    for i, (c, x, d, st) in enumerate(zip(*cols.values())):
        args = {}
        if c >= 0:
            args["correlation"] = c
        if x >= 0:
            args["External id"] = x
        if d >= 0:
            args["device"] = d
        if st >= 0:
            args["stream"] = st
        if i in marks:
            args["critical"], args["critical_path_us"] = 1, marks[i]
        out.append({"ph": "X", "cat": cats[i], "name": names[i], "pid": pid[i], "tid": tid[i],
                    "ts": ts[i], "dur": dur[i], "args": args})
    for k, i in model["launch_of"].items():   # launch call -> GPU event, as Kineto draws them
        c = cols["correlation"][k]
        if c >= 0:
            out += [{"ph": "s", "cat": "ac2g", "name": "ac2g", "id": c, "pid": pid[i], "tid": tid[i],
                     "ts": ts[i]},
                    {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": c, "bp": "e", "pid": pid[k],
                     "tid": tid[k], "ts": ts[k]}]
    for n, (a, b) in enumerate(zip(order, order[1:])):
        fid = _FLOW_ID_BASE + n
        out += [{"ph": "s", "cat": FLOW_CAT, "name": "critical path", "id": fid, "pid": pid[a],
                 "tid": tid[a], "ts": ts[a]},
                {"ph": "f", "cat": FLOW_CAT, "name": "critical path", "id": fid, "bp": "e", "pid": pid[b],
                 "tid": tid[b], "ts": ts[b]}]
    return {"schemaVersion": 1, "displayTimeUnit": "ms", "traceEvents": out,
            "critical_path": {"step": model["step"], "step_us": model["step_us"], "events": len(order)}}
