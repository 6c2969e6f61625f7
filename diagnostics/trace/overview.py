"""summary(trace) -> TraceSummary, the first answer of a trace (issue #42), from the trace's numpy columns.

Duration, steps, events by category, threads, streams and memory peaks, computed on the column codes
with the classify rules (the same masks every view asks) and no pandas: the trace job sends it before
any view that needs a DataFrame is imported. The step spans (step_rows) and the GPU work's kinds
(gpu_kinds) are defined here once; breakdowns.py builds its frames on them.
"""

from __future__ import annotations

import numpy as np

from diagnostics.trace import intervals as iv
from diagnostics.trace.classify import (
    FRAME_CATS, MEMCPY_CATS, MEMSET_CATS, MTIA_CATS, MTIA_DMA_RE, comm_mask, gpu_work_mask, host_mask, step_mask,
    step_number,
)
from diagnostics.trace.model import Trace
from diagnostics.trace.records.breakdowns import Category, MemoryPeak, Step, Stream, Thread, TraceSummary

#: GPU work's kinds (gpu_kinds), in the order temporal_breakdown gives overlapping time to them.
KIND_PRIORITY = ("compute", "communication", "memcpy", "memset")


def step_rows(trace: Trace) -> dict:
    """ProfilerStep#N host spans, one per step number (the longest where a merged trace repeats one),
    sorted by start (stable): arrays ``row`` (the span's event), ``step``, ``name``, ``start_us``, ``dur_us``."""
    if "step_rows" in trace._cache:
        return trace._cache["step_rows"]
    rows = np.flatnonzero(step_mask(trace))
    names = trace.strings("name", rows)
    number = {n: step_number(n) for n in set(names.tolist())}
    step = np.array([number[n] for n in names.tolist()], dtype=np.int64)
    start, dur = trace.column("ts")[rows], trace.column("dur")[rows]
    # One span per step number (the profiler writes one; merged traces may repeat it): the longest.
    order = np.lexsort((-dur, step))
    first = np.r_[True, step[order][1:] != step[order][:-1]] if order.size else np.zeros(0, dtype=bool)
    keep = order[first]
    # by start as pandas' sort_values did before #42 (numpy's quicksort: the same order, ties included)
    keep = keep[np.argsort(start[keep], kind="quicksort")]
    out = {"row": rows[keep], "step": step[keep], "name": names[keep], "start_us": start[keep],
           "dur_us": dur[keep]}
    trace._cache["step_rows"] = out
    return out


def gpu_kinds(trace: Trace, rows: np.ndarray) -> np.ndarray:
    """The kind of each GPU work event of ``rows`` (KIND_PRIORITY's names): memcpy and memset by category
    (MTIA's DMA events are copies), communication by classify.comm_mask, compute the rest."""
    kind = np.full(rows.size, "compute", dtype=object)
    kind[trace.cat_mask(MEMCPY_CATS)[rows]] = "memcpy"
    kind[trace.cat_mask(MEMSET_CATS)[rows]] = "memset"
    kind[(trace.cat_mask(MTIA_CATS) & trace.name_mask(MTIA_DMA_RE))[rows]] = "memcpy"
    kind[comm_mask(trace)[rows]] = "communication"
    return kind


def gpu_places(trace: Trace, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Device and stream of GPU events as strings: the event's own device / stream numbers, else its pid / tid."""
    device, stream = trace.column("device")[rows], trace.column("stream")[rows]
    return (np.where(device >= 0, device.astype(str), trace.strings("pid", rows)),
            np.where(stream >= 0, stream.astype(str), trace.strings("tid", rows)))


def summary(trace: Trace) -> TraceSummary:
    """Duration, steps, events by category, threads, streams, memory peaks, warnings."""
    timed = trace.complete_mask() & ~trace.cat_mask(FRAME_CATS)
    ts, dur = trace.column("ts"), trace.column("dur")
    start = float(ts[timed].min()) if timed.any() else 0.0
    end = float((ts + dur)[timed].max()) if timed.any() else 0.0
    gpu = np.flatnonzero(gpu_work_mask(trace))
    st = step_rows(trace)
    notes = []
    if trace.cat_mask(MTIA_CATS).any():
        notes.append("MTIA trace: its device events (mtia_ccp_events) are read as kernels (DMA ones as "
                     "copies) and mtia_runtime events as runtime calls; \"GPU\" below means the MTIA device")
    return TraceSummary(
        source=trace.source, bytes=trace.n_bytes, events=len(trace), duration_us=end - start, rank=trace.rank,
        schema_version=trace.meta.get("schemaVersion"), base_time_ns=trace.meta.get("baseTimeNanoseconds"),
        has_gpu=bool(gpu.size), n_steps=len(st["step"]),
        steps=tuple(Step(step=int(s), name=str(n), start_us=float(a), dur_us=float(d))
                    for s, n, a, d in zip(st["step"], st["name"], st["start_us"], st["dur_us"])),
        categories=_categories(trace), threads=_threads(trace), streams=_streams(trace, gpu),
        memory=_memory_peaks(trace),
        skipped_events=trace.skipped_events, warnings=tuple(trace.warnings), notes=tuple(notes),
    )


def _categories(trace: Trace) -> tuple[Category, ...]:
    """Events and their summed duration per category (no category: "(none)"), the most events first (ties:
    by name)."""
    complete, dur = trace.complete_mask(), trace.column("dur")
    cat_codes = trace.codes("cat").astype(np.int64)
    n_cat = len(trace.labels("cat"))
    slot = np.where(cat_codes >= 0, cat_codes, n_cat - 1)  # code -1 (no category) -> the "" label's slot
    count = np.bincount(slot, minlength=n_cat)
    total = np.bincount(slot, weights=np.where(complete, dur, 0.0), minlength=n_cat)
    labels = np.where(trace.labels("cat") == "", "(none)", trace.labels("cat"))
    by: dict = {}
    for i in np.flatnonzero(count).tolist():   # a label held by two slots ("" and no category) is one
        events, us = by.get(labels[i], (0, 0.0))
        by[labels[i]] = (events + int(count[i]), us + float(total[i]))
    named = sorted(by.items())
    return tuple(Category(cat=str(c), events=e, total_us=_finite(t))
                 for c, (e, t) in (named[i] for i in _descending([e for _, (e, _t) in named])))


def _threads(trace: Trace) -> tuple[Thread, ...]:
    """Host threads by (pid, tid): events and busy time (their root calls' spans as the nesting ends them:
    never more than the thread's wall time), with the trace's thread names."""
    ts = trace.column("ts")
    nest = trace.nesting()
    cpu = host_mask(trace)
    roots = cpu & (nest["parent"] < 0)
    pid_l, tid_l = trace.labels("pid"), trace.labels("tid")
    # Each (pid code, tid code) pair as one small integer, counted with bincount (no sort of the events).
    width = len(tid_l)
    dense = len(pid_l) * width < 1 << 24
    if dense:
        # (code -1, missing, reads the labels' last entry "", as in lane_keys' grouping below)
        lane = (trace.codes("pid")[cpu].astype(np.int64) % len(pid_l)) * width + \
            trace.codes("tid")[cpu].astype(np.int64) % width
        size = len(pid_l) * width
    else:  # (a trace with millions of distinct pairs) group by sorting
        uniq, lane = np.unique(trace.lane_keys()[cpu], return_inverse=True)
        lane, size = lane.ravel(), uniq.size
    events = np.bincount(lane, minlength=size)
    busy = np.bincount(lane, weights=np.where(roots, nest["end_us"] - ts, 0.0)[cpu], minlength=size)
    seen = np.flatnonzero(events)
    if dense:
        pids, tids = pid_l[seen // width], tid_l[seen % width]
    else:
        pids, tids = pid_l[(uniq[seen] >> 32).astype(np.int64)], tid_l[(uniq[seen] & 0xFFFFFFFF).astype(np.int64)]
    events, busy = events[seen], busy[seen]
    by: dict = {}
    for p, t, e, b in zip(pids.tolist(), tids.tolist(), events.tolist(), busy.tolist()):
        n0, b0 = by.get((p, t), (0, 0.0))   # two lanes of one label pair (rare) are one thread
        by[(p, t)] = (n0 + int(e), b0 + b)
    return tuple(Thread(pid=str(p), tid=str(t), name=trace.thread_names.get(f"{p}/{t}", ""), events=e,
                        busy_us=_finite(b)) for (p, t), (e, b) in sorted(by.items()))


def _streams(trace: Trace, rows: np.ndarray) -> tuple[Stream, ...]:
    """GPU streams (of the GPU work ``rows``) by (device, stream): kernels (compute and communication),
    copies and sets, and busy time (the union of their events)."""
    if not rows.size:
        return ()
    kind = gpu_kinds(trace, rows)
    device, stream = gpu_places(trace, rows)
    start = trace.column("ts")[rows]
    end = start + trace.column("dur")[rows]
    pairs = sorted(set(zip(device.tolist(), stream.tolist())))
    out = []
    for d, s in pairs:
        on = (device == d) & (stream == s)
        k = kind[on]
        out.append(Stream(device=d, stream=s, kernels=int(np.count_nonzero((k == "compute") | (k == "communication"))),
                          memcpy=int(np.count_nonzero(k == "memcpy")), memset=int(np.count_nonzero(k == "memset")),
                          busy_us=iv.length(iv.union(start[on], end[on]))))
    return tuple(out)


def _memory_peaks(trace: Trace) -> tuple[MemoryPeak, ...]:
    """The peak of the allocator's total allocated bytes per device (memory events), if the trace has any."""
    alloc = trace.column("total_allocated")
    mem = alloc >= 0
    if not mem.any():
        return ()
    dt, dv, a = trace.column("device_type")[mem], trace.column("device")[mem], alloc[mem]
    # The largest per (device type, device): the distinct pairs (few) with np.unique, each one's maximum.
    t64, d64 = dt.astype(np.int64) + 1, dv.astype(np.int64) + 1
    if t64.min() >= 0 and d64.min() >= 0 and d64.max() < 1 << 40:
        uniq, group = np.unique((t64 << 40) | d64, return_inverse=True)
        keys = [(int(u >> 40) - 1, int(u & ((1 << 40) - 1)) - 1) for u in uniq.tolist()]
    else:  # odd device ids: the pairs one by one
        keys = sorted(set(zip(dt.tolist(), dv.tolist())))
        group = np.zeros(a.size, np.int64)
        for i, (t, d) in enumerate(keys):
            group[(dt == t) & (dv == d)] = i
    top = np.full(len(keys), np.iinfo(np.int64).min, np.int64)
    np.maximum.at(top, group.ravel(), a.astype(np.int64))
    peaks = [int(v) for v in top]
    return tuple(MemoryPeak(device=("cpu" if t == 0 else "cuda" if t == 1 else f"type {t}") + ("" if d < 0 else f":{d}"),
                            peak_allocated_bytes=v) for (t, d), v in zip(keys, peaks))


def _descending(values: list) -> np.ndarray:
    """Positions of ``values`` from the largest down, ties in the order pandas' sort_values(ascending=False)
    leaves them (numpy's quicksort of the reversed values, reversed): the order of the Summary before #42."""
    a = np.asarray(values, dtype=np.int64)[::-1]
    return np.arange(a.size)[::-1][a.argsort(kind="quicksort")][::-1]


def _finite(x: float) -> float | None:
    """A float as the records hold it: None for NaN or infinity."""
    return float(x) if np.isfinite(x) else None
