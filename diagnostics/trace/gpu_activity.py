"""The analyses Holistic Trace Analysis (HTA) offers beyond the trace explorer's core views, on the one
Trace model and the one set of classifiers (classify.py, through breakdowns._gpu_frame's ``kind``):

* kernel_sequences: runs of consecutive kernels on a stream seen more than once (fusion candidates).
* queue_length: launched GPU work not yet done per stream over time, and the time spent with a
  full launch queue (HTA's max_queue_length, 1024).
* memcpy_bandwidth: bytes / duration of copies and sets per direction (HtoD, DtoH, DtoD, Memset).
* annotations: time per GPU user annotation (record_function ranges mirrored on the GPU).
* launch_delay: from a launch call's start to its GPU work's start, per kernel, with the CPU operator
  that made the call.
* comm_overlap: how much of the communication time computation runs beside it (HTA's
  get_comm_comp_overlap ratio), over all GPU work or compute kernels only.

Definitions follow HTA's analyzers where it has one (read, not copied: trace_counters.py,
breakdown_analysis.py, communication_analysis.py); where a figure cannot be counted from the trace
it says so (None and a note), never 0. Each returns its record (records/gpu_activity.py).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diagnostics.trace import intervals as iv
from diagnostics.trace.classify import (
    GPU_ANNOTATION_CATS, RUNTIME_CATS, communication, host_op_mask, is_graph_launch, memcpy_direction,
)
from diagnostics.trace.model import Trace
from diagnostics.trace.breakdowns import _gpu_frame, _records
from diagnostics.trace.records.gpu_activity import (
    Annotation, Annotations, CommOverlap, CopyDirection, DelayBin, DelayName, KernelSequence, KernelSequences,
    LaunchDelay, MemcpyBandwidth, QueueLength, QueueSeries, QueueStream,
)

#: Longest kernel sequence looked for by default, and the shortest there is.
SEQ_MAX_LEN = 3
SEQ_MIN_LEN = 2
#: HTA's default max_queue_length: a stream's launch queue holding this many launches is full and
#: the next launch call blocks the CPU thread.
QUEUE_FULL = 1024
#: Queue length points kept per stream for a chart (the statistics use every change).
QUEUE_POINTS = 2000
#: How a stream's queue counts a launch: until its GPU work ends ("kernel_end": launched, not
#: finished) or until it starts ("kernel_start": HTA's trace_counters definition).
QUEUE_UNTIL = ("kernel_end", "kernel_start")
#: Launch delay histogram edges (µs); delays below 0 (clock skew) are counted apart.
DELAY_EDGES_US = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 100_000, np.inf)
#: What "computation" is in comm_overlap: all non-communication GPU work, or compute kernels only (HTA).
OVERLAP_COMPUTE = ("gpu_work", "kernels")
NOT_COUNTED = "not counted"


def _covered_within(u: iv.Intervals, starts: np.ndarray, ends: np.ndarray) -> float:
    """Summed length of the sorted disjoint intervals ``u`` inside each [starts[k], ends[k]) (vectorised:
    the covered length before t is a cumulative sum read with searchsorted)."""
    s, e = u
    if not s.size or not len(starts):
        return 0.0
    cum = np.r_[0.0, np.cumsum(e - s)]

    def before(t):
        i = np.searchsorted(s, t, side="right")   # intervals starting at or before t
        last = np.maximum(i - 1, 0)
        return cum[np.maximum(i - 1, 0)] + np.where(i > 0, np.minimum(t, e[last]) - s[last], 0.0)

    return float(np.sum(before(np.asarray(ends, float)) - before(np.asarray(starts, float))))


def _stream_order(g: pd.DataFrame) -> pd.DataFrame:
    return g.sort_values(["device", "stream", "start_us"], kind="stable").reset_index(drop=True)


# ---- 1. frequent kernel sequences --------------------------------------------------------------

def kernel_sequences(trace: Trace, max_len: int = SEQ_MAX_LEN, n: int = 20) -> KernelSequences:
    """Sequences of 2..``max_len`` consecutive compute kernels on one stream that occur at least twice.

    On each (device, stream), GPU work in start order; every window of ``length`` consecutive events
    that are all compute kernels (a copy, a set or a collective between two kernels breaks the run)
    is one occurrence of the sequence of their names; overlapping windows all count ("A A A" holds
    "A A" twice). Per sequence: ``count`` occurrences, ``total_us`` the kernels' summed GPU time over
    all occurrences, ``span_us`` first start to last end summed, ``gap_us`` = span - total (idle
    time between the kernels, which a fused kernel would also save). ``by_time``: the top ``n`` by
    total_us; ``by_count``: by count.
    """
    if max_len < SEQ_MIN_LEN:
        raise ValueError(f"max_len must be at least {SEQ_MIN_LEN}, got {max_len}")
    g = _stream_order(_gpu_frame(trace))
    n_kernels = int((g["kind"] == "compute").sum())
    none = KernelSequences(max_len=int(max_len), kernels=n_kernels, sequences=0, by_time=(), by_count=(), notes=())
    if not n_kernels:
        return KernelSequences(max_len=int(max_len), kernels=0, sequences=0, by_time=(), by_count=(),
                               notes=(f"{NOT_COUNTED}: no GPU compute kernels in this trace",))
    code, names = pd.factorize(g["name"])
    code = code.astype(np.int64)
    grp = pd.factorize(g["device"].astype(str) + "/" + g["stream"].astype(str))[0]
    is_k = (g["kind"] == "compute").to_numpy()
    start, end, dur = g["start_us"].to_numpy(), g["end_us"].to_numpy(), g["dur_us"].to_numpy()
    ck = np.r_[0, np.cumsum(is_k)]
    cdur = np.r_[0.0, np.cumsum(dur)]
    parts = []
    # key[i]: one integer per distinct name sequence code[i:i + length], grown one kernel at a time
    # (the pair (previous key, next name) factorised, so keys stay below the number of windows).
    key = code
    for length in range(SEQ_MIN_LEN, max_len + 1):
        m = len(g) - length + 1
        if m <= 0:
            break
        key = pd.factorize(key[:m] * len(names) + code[length - 1:length - 1 + m])[0].astype(np.int64)
        i = np.arange(m)
        ok = (ck[i + length] - ck[i] == length) & (grp[i] == grp[i + length - 1])
        i = i[ok]
        if not i.size:
            continue
        uniq, first, inv, count = np.unique(key[i], return_index=True, return_inverse=True, return_counts=True)
        keep = count >= 2
        if not keep.any():
            continue
        parts.append(pd.DataFrame({
            "length": length, "count": count[keep], "pos": i[first[keep]],
            "total_us": np.bincount(inv, weights=cdur[i + length] - cdur[i], minlength=uniq.size)[keep],
            "span_us": np.bincount(inv, weights=end[i + length - 1] - start[i], minlength=uniq.size)[keep]}))
    if not parts:
        return none
    seqs = pd.concat(parts, ignore_index=True)
    seqs["gap_us"] = seqs["span_us"] - seqs["total_us"]
    seqs["mean_us"] = seqs["total_us"] / seqs["count"]
    cols = ["sequence", "length", "count", "total_us", "mean_us", "span_us", "gap_us", "kernels"]

    def top(order: list[str]) -> tuple[KernelSequence, ...]:
        rows = seqs.sort_values(order, ascending=False, kind="stable").head(n).copy()
        # Names only for the rows kept: from the first occurrence's position.
        rows["kernels"] = [tuple(str(x) for x in names[code[p:p + ln]]) for p, ln in zip(rows["pos"], rows["length"])]
        rows["sequence"] = [" → ".join(k) for k in rows["kernels"]]
        return tuple(KernelSequence(**r) for r in _records(rows[cols]))

    return KernelSequences(max_len=int(max_len), kernels=n_kernels, sequences=int(len(seqs)),
                           by_time=top(["total_us", "count"]), by_count=top(["count", "total_us"]), notes=())


# ---- 2. launch queue length --------------------------------------------------------------------

def queue_length(trace: Trace, until: str = "kernel_end", full: int = QUEUE_FULL,
                 max_points: int = QUEUE_POINTS) -> QueueLength:
    """Per stream, launched GPU work not yet done over time, and the time at a full queue.

    Each GPU event whose launch call is in the trace (correlation id or flow arrow) adds 1 at the
    call's start and takes it back when it ends (``until="kernel_end"``) or starts
    (``"kernel_start"``, as HTA's trace_counters counts); at one instant, completions count before
    launches. Per stream: ``max``, ``mean`` (time-weighted from the first launch to the last
    change) and ``full_us``, the time with ``full`` or more queued (HTA's time blocked on a full
    queue). ``blocked_us``: the union of those times over all streams, when some launch call had to
    wait. GPU work with no launch call in the trace is left out and counted (``unlinked``).
    """
    if until not in QUEUE_UNTIL:
        raise ValueError(f"until must be one of {', '.join(QUEUE_UNTIL)}, got {until!r}")
    g = _gpu_frame(trace)
    linked = g["launch_start_us"].notna().to_numpy()
    unlinked = int((~linked).sum())

    def result(streams=(), series=(), blocked_us=None, note=None) -> QueueLength:
        return QueueLength(until=until, full=int(full), unlinked=unlinked, streams=tuple(streams),
                           series=tuple(series), blocked_us=blocked_us, notes=(note,) if note else ())

    if not len(g):
        return result(note=f"{NOT_COUNTED}: no GPU work in this trace")
    g = g[linked]
    if not len(g):
        return result(note=f"{NOT_COUNTED}: no GPU event has a launch call in the trace (no correlation ids "
                           "or flow arrows)")
    note = f"{unlinked:,} GPU events have no launch call in the trace: left out of the queue" if unlinked else None
    streams, series = [], []
    done_col = "end_us" if until == "kernel_end" else "start_us"
    full_s, full_e = [], []
    for (device, stream), sub in g.groupby(["device", "stream"], sort=True):
        t = np.r_[sub["launch_start_us"].to_numpy(float), sub[done_col].to_numpy(float)]
        d = np.r_[np.ones(len(sub), np.int64), -np.ones(len(sub), np.int64)]
        order = np.lexsort((d, t))      # by time; at one time -1 before +1
        t, q = t[order], np.cumsum(d[order])
        last = np.r_[t[1:] != t[:-1], True]  # one point per instant: the count after all its changes
        t, q = t[last], q[last]
        dt = np.diff(t)
        span = float(t[-1] - t[0])
        at_full = q[:-1] >= full
        full_s.append(t[:-1][at_full])
        full_e.append(t[1:][at_full])
        streams.append(QueueStream(
            device=device, stream=stream, launches=int(len(sub)), max=int(q.max()),
            mean=float(np.sum(q[:-1] * dt) / span) if span > 0 else None,
            full_us=float(dt[at_full].sum()), span_us=span))
        step = max(1, -(-t.size // max_points))
        keep = np.unique(np.r_[np.arange(0, t.size, step), np.argmax(q), t.size - 1])
        series.append(QueueSeries(device=device, stream=stream, t_us=tuple(t[keep].tolist()),
                                  queued=tuple(q[keep].astype(int).tolist()), sampled=bool(step > 1)))
    return result(streams, series, iv.length(iv.union(np.concatenate(full_s), np.concatenate(full_e))), note)


# ---- 3. memcpy / memset bandwidth ----------------------------------------------------------------

def memcpy_bandwidth(trace: Trace) -> MemcpyBandwidth:
    """Copies and sets per direction (HtoD, DtoH, DtoD, PtoP, Memset; "other" when the name says none):
    events, bytes, time and bandwidth = bytes / duration (bytes per second).

    Bytes are Kineto's "bytes" arg of each copy / set. Events without it (older Kineto) are counted
    in ``events`` but not in ``bytes`` or ``time_us``; a direction with none counted has bytes and
    bandwidths None ("not counted"). ``median_bytes_per_s`` / ``max_bytes_per_s``: over the counted
    events with a duration above 0.
    """
    g = _gpu_frame(trace)
    g = g[(g["kind"] == "memcpy") | (g["kind"] == "memset")]  # _gpu_frame's kinds (classify's categories)
    if not len(g):
        return MemcpyBandwidth(directions=(), events=0, counted_events=0,
                               notes=(f"{NOT_COUNTED}: no memcpy or memset in this trace",))
    nbytes = trace.events["nbytes"].to_numpy()[g["row"].to_numpy()]
    direction = np.array([("Memset" if k == "memset" else memcpy_direction(nm) or "other")
                          for k, nm in zip(g["kind"], g["name"])], dtype=object)
    df = pd.DataFrame({"direction": direction, "bytes": nbytes.astype(float), "dur": g["dur_us"].to_numpy()})
    df["counted"] = df["bytes"] >= 0
    rows = []
    for d, sub in df.groupby("direction", sort=True):
        c = sub[sub["counted"]]
        row = {"direction": d, "events": int(len(sub)), "counted_events": int(len(c)),
               "time_us": float(sub["dur"].sum()), "bytes": None, "bytes_per_s": None,
               "median_bytes_per_s": None, "max_bytes_per_s": None}
        if len(c):
            t = float(c["dur"].sum())
            row["bytes"] = int(c["bytes"].sum())
            row["bytes_per_s"] = row["bytes"] / (t * 1e-6) if t > 0 else None
            timed = c[c["dur"] > 0]
            if len(timed):
                per = timed["bytes"] / (timed["dur"] * 1e-6)
                row["median_bytes_per_s"], row["max_bytes_per_s"] = float(per.median()), float(per.max())
        rows.append(CopyDirection(**row))
    events, counted = int(len(g)), int(df["counted"].sum())
    missing = events - counted
    notes = (f"{missing:,} of {events:,} copies/sets carry no \"bytes\" (older Kineto): their bytes and bandwidth "
             f"are {NOT_COUNTED}",) if missing else ()
    return MemcpyBandwidth(directions=tuple(rows), events=events, counted_events=counted, notes=notes)


# ---- 4. GPU user annotations ---------------------------------------------------------------------

def annotations(trace: Trace, n: int = 20) -> Annotations:
    """Time per GPU user annotation name (gpu_user_annotation events: record_function ranges as the
    GPU ran them): ``count``, ``total_us`` (summed durations, nested names each counting their own),
    ``mean_us``, ``max_us`` and ``gpu_busy_us``: the time GPU work ran on the annotation's device
    while it was open (the union of both, so concurrent streams count once)."""
    ev = trace.events
    m = trace.complete_mask() & trace.cat_mask(GPU_ANNOTATION_CATS)
    if not m.any():
        return Annotations(annotations=(), n_annotations=0, events=0, notes=(
            f"{NOT_COUNTED}: no gpu_user_annotation events in this trace (record_function ranges appear on the "
            "GPU timeline only in traces of CUDA runs by recent Kineto)",))
    rows = np.flatnonzero(m)
    device = ev["device"].to_numpy()[rows]
    a = pd.DataFrame({"name": trace.strings("name", rows),
                      "device": np.where(device >= 0, device.astype(str), trace.strings("pid", rows)),
                      "start": ev["ts"].to_numpy()[rows], "dur": ev["dur"].to_numpy()[rows]})
    a["end"] = a["start"] + a["dur"]
    g = _gpu_frame(trace)
    work = {d: iv.union(s["start_us"].to_numpy(), s["end_us"].to_numpy()) for d, s in g.groupby("device")}
    busy = {}
    for (name, d), sub in a.groupby(["name", "device"], sort=False):
        u = iv.union(sub["start"].to_numpy(), sub["end"].to_numpy())
        busy[name] = busy.get(name, 0.0) + (_covered_within(work[d], *u) if d in work else 0.0)
    agg = a.groupby("name").agg(count=("dur", "size"), total_us=("dur", "sum"), mean_us=("dur", "mean"),
                                max_us=("dur", "max")).reset_index()
    agg["gpu_busy_us"] = agg["name"].map(busy)
    agg = agg.sort_values(["total_us", "name"], ascending=[False, True], kind="stable")
    return Annotations(annotations=tuple(Annotation(**r) for r in _records(agg.head(n))), n_annotations=int(len(agg)),
                       events=int(m.sum()), notes=())


# ---- 5. launch delay -----------------------------------------------------------------------------

def _launching_ops(trace: Trace, g: pd.DataFrame) -> np.ndarray:
    """Per row of ``g``: the innermost host operator (cpu_op) around its launch call, or "" when the
    call is not found by correlation id or sits in no operator."""
    ev = trace.events
    rm = np.flatnonzero(trace.complete_mask() & trace.cat_mask(RUNTIME_CATS))
    corr = ev["corr"].to_numpy()[rm]
    ok = corr >= 0
    by_corr = pd.Series(rm[ok], index=corr[ok])
    by_corr = by_corr[~by_corr.index.duplicated()]
    call = g["corr"].map(by_corr).fillna(-1).to_numpy(np.int64)
    parent = trace.nesting()["parent"]
    is_op = host_op_mask(trace)
    found = np.full(len(g), -1, np.int64)
    cur = np.where(call >= 0, parent[np.maximum(call, 0)], -1)
    while (cur >= 0).any():
        hit = (cur >= 0) & (found < 0) & is_op[np.maximum(cur, 0)]
        found[hit] = cur[hit]
        cur = np.where((cur >= 0) & (found < 0), parent[np.maximum(cur, 0)], -1)
    names = trace.strings("name", np.maximum(found, 0))
    return np.where(found >= 0, names, "")


def _most_common_op(ops: pd.Series) -> str:
    """The operator named most often (ties: the first in name order); "" when none was found."""
    found = ops[ops != ""]
    if not len(found):
        return ""
    counts = found.value_counts()
    return str(min(counts.index[counts == counts.max()]))


#: Where launch_delay measures from: the launch call's start, or its end with negative delays clipped to
#: 0 (HTA's cuda_kernel_launch_stats).
DELAY_FROM = ("call_start", "call_end")


def launch_delay(trace: Trace, n: int = 20, since: str = "call_start") -> LaunchDelay:
    """From a launch call's start (``since="call_end"``: its end, as HTA measures, negative delays
    clipped to 0 and counted in ``negative``) to its GPU work's start (µs), per kernel name and overall.

    GPU events whose launch call is in the trace (correlation id or flow arrow), graph launches left
    out (one call starts all of a graph's kernels: see launch_stats' graphs) and counted. Per name:
    ``launches``, ``mean_us``, ``min_us``, ``p50_us``, ``p90_us``, ``max_us`` (linear-interpolated
    percentiles) and ``op``, the host operator that launched it most often (of the launches whose call
    sits in one; "" when none does).
    ``histogram``: counts per DELAY_EDGES_US bin; ``negative``: delays below 0 (clock skew).
    """
    g = _gpu_frame(trace)
    g = g[g["launch_start_us"].notna()]
    calls = g["launch_name"].fillna("").astype(str)
    graph = calls.isin([x for x in calls.unique() if is_graph_launch(x)]).to_numpy()   # once per distinct name
    graph_kernels = int(graph.sum())
    if since not in DELAY_FROM:
        raise ValueError(f"since must be one of {', '.join(DELAY_FROM)}, got {since!r}")
    g = g[~graph].copy()
    untimed = {}
    if since == "call_end":   # a call found through a flow arrow alone has no duration: left out, counted
        timed = g["launch_dur_us"].notna()
        untimed["no_call_duration"] = int((~timed).sum())
        g = g[timed]
    if not len(g):
        return LaunchDelay(launches=0, graph_kernels=graph_kernels, by_name=(), histogram=(), negative=0,
                           notes=(f"{NOT_COUNTED}: no GPU work with its launch call in this trace",), since=since,
                           **untimed)
    g["delay_us"] = g["start_us"] - g["launch_start_us"]
    if since == "call_end":
        g["delay_us"] -= g["launch_dur_us"]
        negative = int((g["delay_us"] < 0).sum())
        g["delay_us"] = g["delay_us"].clip(lower=0.0)
    g["op"] = _launching_ops(trace, g)
    d = g["delay_us"]
    if since == "call_start":
        negative = int((d < 0).sum())
    counts, _ = np.histogram(d[d >= 0], bins=np.array(DELAY_EDGES_US, dtype=float))
    histogram = tuple(DelayBin(lo_us=float(lo), hi_us=float(hi) if np.isfinite(hi) else None, count=int(c))
                      for lo, hi, c in zip(DELAY_EDGES_US[:-1], DELAY_EDGES_US[1:], counts))
    by = g.groupby("name")
    agg = by.agg(kind=("kind", "first"), launches=("delay_us", "size"), mean_us=("delay_us", "mean"),
                 min_us=("delay_us", "min"), max_us=("delay_us", "max"))
    agg["p50_us"] = by["delay_us"].quantile(0.5)
    agg["p90_us"] = by["delay_us"].quantile(0.9)
    agg["op"] = by["op"].agg(_most_common_op)
    agg = agg.reset_index().sort_values(["launches", "mean_us"], ascending=False, kind="stable")
    by_name = tuple(DelayName(**r) for r in _records(agg[["name", "kind", "op", "launches", "mean_us", "min_us",
                                                          "p50_us", "p90_us", "max_us"]].head(n)))
    notes = (f"{graph_kernels:,} kernels of CUDA graph launches left out (one call starts a whole graph)",) \
        if graph_kernels else ()
    return LaunchDelay(launches=int(len(g)), graph_kernels=graph_kernels, by_name=by_name, histogram=histogram,
                       negative=negative, notes=notes, since=since, **untimed, mean_us=float(d.mean()),
                       p50_us=float(d.quantile(0.5)), p90_us=float(d.quantile(0.9)), max_us=float(d.max()))


# ---- 6. communication / computation overlap -------------------------------------------------------

def comm_overlap(trace: Trace, compute: str = "gpu_work") -> CommOverlap:
    """The share of communication time with computation running beside it (HTA's comm/comp overlap):
    overlap_pct = 100 x |comm ∩ comp| / |comm|, over unions of GPU events (so concurrent streams
    count once); communication is every family classify.communication names (``families``). ``compute="gpu_work"``: computation is all non-communication GPU work (kernels,
    copies, sets; the distributed analysis' definition); ``"kernels"``: compute kernels only, as HTA
    counts it. Without communication kernels, overlap_pct is None (not counted)."""
    if compute not in OVERLAP_COMPUTE:
        raise ValueError(f"compute must be one of {', '.join(OVERLAP_COMPUTE)}, got {compute!r}")
    g = _gpu_frame(trace)
    is_comm = (g["kind"] == "communication").to_numpy()
    is_comp = (g["kind"] == "compute").to_numpy() if compute == "kernels" else ~is_comm
    s, e = g["start_us"].to_numpy(), g["end_us"].to_numpy()
    comm_u, comp_u = iv.union(s[is_comm], e[is_comm]), iv.union(s[is_comp], e[is_comp])
    comm_us, comp_us = iv.length(comm_u), iv.length(comp_u)
    overlap = _covered_within(comp_u, *comm_u)
    found = communication(trace)
    notes = (f"{NOT_COUNTED}: no communication kernels in this trace",) if not comm_us else ()
    return CommOverlap(compute=compute, comm_us=comm_us, compute_us=comp_us, overlap_us=overlap,
                       overlap_pct=100.0 * overlap / comm_us if comm_us > 0 else None,
                       families=tuple(f.family for f in found.families if f.where == "GPU"),
                       # kernels that look like communication but match no family, say so
                       notes=notes + found.notes)


ANALYSES = {
    "kernel_sequences": kernel_sequences,
    "queue_length": queue_length,
    "memcpy_bandwidth": memcpy_bandwidth,
    "annotations": annotations,
    "launch_delay": launch_delay,
    "comm_overlap": comm_overlap,
}
