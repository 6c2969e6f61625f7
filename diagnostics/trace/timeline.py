"""timeline_data(trace, t0, t1, max_events) -> Timeline (records/timeline.py): a downsampled, drawable slice
of a trace.

Rows are lanes (a host thread at one call depth, or a GPU stream); Python frames (with_stack)
get a lane of their own per thread, so they do not push the operators down. The time range is
split into buckets (about one per pixel); each (row, bucket) keeps its longest event and the
number of events it stands for, so a GB trace draws in a few thousand bars and nothing long goes
missing. When even that is too many bars, every lane keeps its own longest share first, so a
stream of short kernels never disappears.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from diagnostics.trace.classify import (
    FRAME_CATS, GPU_ANNOTATION_CATS, GPU_SYNC_CATS, PYTHON_CATS, gpu_work_mask, host_mask,
)
from diagnostics.trace.model import Trace, nesting_of
from diagnostics.trace.records.timeline import Timeline, TimelineEvent, TimelineLane

MAX_EVENTS = 5000        # bars returned at most
MAX_DEPTH = 24           # host call depths drawn (deeper calls are counted, not drawn)
MIN_BUCKETS = 200        # buckets across the range, at least
LANE_SHARE = 4           # past max_events, each lane first keeps max_events / (LANE_SHARE x lanes) bars


def _lanes(trace: Trace) -> dict:
    """Drawable duration events: rows, lane code, depth; lane names and kinds (cached)."""
    if "lanes" in trace._cache:
        return trace._cache["lanes"]
    ev = trace.events
    m = trace.complete_mask() & ~trace.cat_mask(FRAME_CATS | GPU_ANNOTATION_CATS)
    rows = np.flatnonzero(m)
    gpu = (gpu_work_mask(trace) | trace.cat_mask(GPU_SYNC_CATS))[rows]  # device lanes: work and waits
    py_all = trace.cat_mask(PYTHON_CATS)
    py = py_all[rows]
    if py.any():  # Python frames nest among themselves, operators among themselves
        host = host_mask(trace)
        depth = np.where(py_all, nesting_of(trace, host & py_all)["depth"],
                         nesting_of(trace, host & ~py_all)["depth"])[rows]
    else:
        depth = trace.nesting()["depth"][rows]
    device = ev["device"].to_numpy()[rows].astype(np.int64)
    stream = ev["stream"].to_numpy()[rows].astype(np.int64)
    pid, tid = trace.codes("pid")[rows].astype(np.int64), trace.codes("tid")[rows].astype(np.int64)
    # Integer lane keys (GPU: device/stream when known, else pid/tid codes), labelled once each.
    use_dev, use_stream = gpu & (device >= 0), gpu & (stream >= 0)
    a = np.where(use_dev, device, pid) & 0x3FFFFFFF
    b = np.where(use_stream, stream, tid) & 0x1FFFFFFF
    key = (py.astype(np.int64) << 62) | (gpu.astype(np.int64) << 61) | (use_dev.astype(np.int64) << 60) | \
        (use_stream.astype(np.int64) << 59) | (a << 29) | b
    uniq, inv = np.unique(key, return_inverse=True)
    pid_l, tid_l = trace.labels("pid"), trace.labels("tid")
    names, kinds, parts = [], [], []
    for k in uniq.tolist():
        is_py, is_gpu, ka, kb = k >> 62 & 1, k >> 61 & 1, k >> 29 & 0x3FFFFFFF, k & 0x1FFFFFFF
        sa = str(ka) if k >> 60 & 1 else pid_l[ka]
        sb = str(kb) if k >> 59 & 1 else tid_l[kb]
        names.append(f"GPU {sa} stream {sb}" if is_gpu else f"{sa}/{sb}" + (" · Python" if is_py else ""))
        kinds.append("gpu" if is_gpu else "cpu")
        parts.append((bool(is_gpu), str(sa), str(sb), bool(is_py)))
    lane = inv.ravel()
    # The call a thread without an OS id runs most often names it (thread_label).
    top = {}
    unnamed = [i for i, (is_gpu, a, b, _) in enumerate(parts) if not is_gpu and _no_os_id(b)
               and not trace.thread_names.get(f"{a}/{b}")]
    if unnamed:
        codes = trace.codes("name")[rows]
        labels = trace.labels("name")
        for i in unnamed:
            on = codes[lane == i]
            if on.size:
                top[i] = labels[np.bincount(on[on >= 0]).argmax()] if (on >= 0).any() else None
    out = {"rows": rows, "lane": lane, "depth": np.where(gpu, 0, np.maximum(depth, 0)),
           "names": names, "kinds": kinds, "labels": _lane_labels(parts, trace.thread_names, top)}
    trace._cache["lanes"] = out
    return out


def natural_key(text: str) -> tuple:
    """Sort key that orders the numbers inside a name by value: "stream 7" before "stream 20",
    "rank 2" before "rank 10"."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", text) if p)


def _no_os_id(tid: str) -> bool:
    """A thread id that is no OS thread id: negative (a pthread handle cut to 32 bits, as CUPTI reports
    the threads it did not see start: "-247463936")."""
    return tid.startswith("-") and tid[1:].isdigit()


def thread_label(thread_names: dict, pid: str, tid: str, top_call: str | None = None) -> str:
    """A host thread as a user reads it: its own name where the trace gives one ("thread 1102
    (pt_main_thread)"), else its OS id ("thread 4242"), else, for an id that is none (_no_os_id), the
    call it runs most ("unnamed thread (cudaEventQuery)")."""
    name = (thread_names.get(f"{pid}/{tid}") or "").strip()
    if name:
        return name
    if _no_os_id(str(tid)):
        return f"unnamed thread ({top_call})" if top_call else "unnamed thread"
    return f"thread {tid}"


def _lane_labels(parts: list[tuple], thread_names: dict, top_calls: dict | None = None) -> list[str]:
    """What a user reads for each lane: "GPU 0 · stream 7", a host thread's thread_label; a
    Python-stack lane says so; the process is named only when the trace has several."""
    pids = {pa for is_gpu, pa, _, _ in parts if not is_gpu}
    labels = []
    for i, (is_gpu, a, b, is_py) in enumerate(parts):
        if is_gpu:
            labels.append(f"GPU {a} · stream {b}")
            continue
        text = thread_label(thread_names, a, b, (top_calls or {}).get(i))
        if len(pids) > 1:
            text = f"process {a} · {text}"
        labels.append(text + (" · Python stack" if is_py else ""))
    return labels


def timeline_data(trace: Trace, t0: float | None = None, t1: float | None = None,
                  max_events: int = MAX_EVENTS) -> Timeline:
    """Bars for [t0, t1] µs (default: the whole trace), at most max_events of them.

    Returns its record: t0, t1, ``lanes`` (lane, kind, name, label: what a user reads, see _lane_labels;
    lanes in natural order, host threads first), ``events`` (lane, depth, name, cat, start_us, dur_us,
    count), ``in_range``: events overlapping the range, ``shown``, ``bucket_us``, ``deeper``: events in
    range nested deeper than MAX_DEPTH (counted, not drawn). ``count`` > 1 marks a bar that stands for
    that many events of its row and bucket.
    """
    ev = trace.events
    lanes = _lanes(trace)
    rows = lanes["rows"]
    ts = ev["ts"].to_numpy()[rows]
    end = ts + ev["dur"].to_numpy()[rows]
    lo = float(ts.min()) if ts.size else 0.0
    hi = float(end.max()) if ts.size else 0.0
    t0 = lo if t0 is None else float(t0)
    t1 = hi if t1 is None else float(t1)
    if t1 <= t0:
        t1 = t0 + 1e-3
    depth = lanes["depth"]
    overlap = (end >= t0) & (ts <= t1)
    in_range = int(overlap.sum())
    idx = np.flatnonzero(overlap & (depth <= MAX_DEPTH))
    deeper = in_range - int(idx.size)
    lane_codes = lanes["lane"][idx]
    d = depth[idx]
    row_key = lane_codes.astype(np.int64) * (MAX_DEPTH + 1) + d
    # Rows (lane, depth) numbered densely by a presence count: no sort of every event.
    present = np.bincount(row_key, minlength=1) > 0 if idx.size else np.zeros(0, dtype=bool)
    n_rows = int(present.sum())
    n_buckets = max(MIN_BUCKETS, max_events // max(1, n_rows))
    bucket_us = (t1 - t0) / n_buckets
    s = np.clip(ts[idx], t0, t1)
    dur = np.minimum(end[idx], t1) - s
    count = np.ones(idx.size, dtype=np.int64)
    if idx.size > max_events:
        bucket = np.minimum(((s - t0) / bucket_us).astype(np.int64), n_buckets - 1)
        key = (np.cumsum(present) - 1)[row_key] * n_buckets + bucket
        n_keys = n_rows * n_buckets
        # Each (row, bucket) keeps its longest event (the first of equals), in key order.
        longest = np.full(n_keys, -np.inf)
        np.maximum.at(longest, key, dur)
        cand = np.flatnonzero(dur == longest[key])
        first = np.full(n_keys, idx.size, dtype=np.int64)
        np.minimum.at(first, key[cand], cand)
        keys = np.flatnonzero(first < idx.size)
        pick = first[keys]
        count = np.bincount(key, minlength=n_keys)[keys]
        if pick.size > max_events:  # still too many rows x buckets
            sel = _lane_shares(lane_codes[pick], dur[pick], max_events)
            pick, count = pick[sel], count[sel]
        idx, lane_codes, d, s, dur = idx[pick], lane_codes[pick], d[pick], s[pick], dur[pick]
    src = rows[idx]
    names = np.array(lanes["names"], dtype=object)
    out = pd.DataFrame({"lane": names[lane_codes],
                        "depth": d.astype(int), "name": trace.strings("name", src),
                        "cat": trace.strings("cat", src),
                        "start_us": s, "dur_us": dur, "count": count.astype(int)})
    out = out.sort_values(["lane", "depth", "start_us"]).reset_index(drop=True)
    lane_rows = [TimelineLane(lane=lanes["names"][c], kind=lanes["kinds"][c],
                              name=trace.thread_names.get(lanes["names"][c], ""), label=lanes["labels"][c])
                 for c in np.unique(lane_codes).tolist()]
    lane_rows.sort(key=lambda r: (r.kind != "cpu", natural_key(r.lane)))
    events = tuple(TimelineEvent(lane=lane, depth=int(dp), name=name, cat=cat, start_us=float(st), dur_us=float(du),
                                 count=int(c))
                   for lane, dp, name, cat, st, du, c in zip(out["lane"].tolist(), out["depth"].tolist(),
                                                              out["name"].tolist(), out["cat"].tolist(),
                                                              out["start_us"].tolist(), out["dur_us"].tolist(),
                                                              out["count"].tolist()))
    return Timeline(t0=t0, t1=t1, lanes=tuple(lane_rows), events=events, in_range=in_range, shown=len(events),
                    bucket_us=bucket_us if in_range - deeper > max_events else 0.0, deeper=deeper)


def _lane_shares(lane: np.ndarray, dur: np.ndarray, max_events: int) -> np.ndarray:
    """Indices of at most max_events bars: each lane's longest share first, then the longest overall."""
    order = np.lexsort((-dur, lane))
    lane_sorted = lane[order]
    starts = np.r_[0, np.flatnonzero(np.diff(lane_sorted)) + 1]
    sizes = np.diff(np.r_[starts, order.size])
    rank = np.arange(order.size) - np.repeat(starts, sizes)
    share = max(1, max_events // (LANE_SHARE * starts.size))
    chosen = np.zeros(lane.size, dtype=bool)
    chosen[order[rank < share]] = True
    if chosen.sum() > max_events:  # more lanes than bars: the longest of each lane's longest
        first = np.flatnonzero(chosen)
        chosen[:] = False
        chosen[first[np.argsort(-dur[first], kind="stable")[:max_events]]] = True
    rest = np.flatnonzero(~chosen)
    budget = max_events - int(chosen.sum())
    if budget > 0 and rest.size:
        chosen[rest[np.argsort(-dur[rest], kind="stable")[:budget]]] = True
    return np.flatnonzero(chosen)
