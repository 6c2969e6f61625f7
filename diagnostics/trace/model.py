"""Trace: one parsed Chrome/Kineto trace as columns (a DataFrame) plus its top-level metadata.

Times are microseconds relative to `origin_us` (the earliest event timestamp), so float64 keeps
nanosecond precision. The per-thread call nesting (depth, parent, self time) is derived once,
on demand, and cached on the object.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from diagnostics.trace import classify

# Columns of Trace.events, in order. Integer columns use -1 for "absent", float ones NaN.
# ext_id, corr: "External id" and "correlation" (host op <-> runtime call <-> kernel); device,
# stream: where GPU work ran; flow_id: flow arrows; nbytes, total_allocated, device_type: memory
# events (nbytes is also a memcpy's / memset's "bytes", -1 there when not recorded); seq, fwd_tid: an op's autograd "Sequence number" and, on a backward op, its "Fwd thread
# id"; grid, block ("64×1×1"), registers, occupancy (est. achieved %): a kernel's launch.
COLUMNS = (
    "ts", "dur", "ph", "cat", "name", "pid", "tid",
    "ext_id", "corr", "device", "stream", "flow_id", "nbytes", "total_allocated", "device_type",
    "seq", "fwd_tid", "grid", "block", "registers", "occupancy",
)

#: Trace._cache key of the trace cache entry a trace was read from or kept in (diagnostics.trace.cache):
#: not a computed view, so dropping the views keeps it.
CACHE_ENTRY = "trace_cache_entry"


@dataclass
class Trace:
    """A loaded trace. `events` has one row per event (COLUMNS); `meta` the other top-level keys."""

    events: pd.DataFrame
    meta: dict = field(default_factory=dict)
    origin_us: float = 0.0
    source: str = ""
    n_bytes: int = 0
    skipped_events: int = 0
    warnings: list = field(default_factory=list)
    process_names: dict = field(default_factory=dict)   # pid label -> name
    thread_names: dict = field(default_factory=dict)    # "pid/tid" label -> name
    # The user's pattern for in-house communication kernels (classify.use_comm_kernels), "" for none.
    comm_kernels: str = ""
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def drop_views(self) -> None:
        """Forget the views computed so far (they are recomputed on demand), keeping the trace cache
        entry the columns came from (CACHE_ENTRY: runs that keep the columns link its file)."""
        for key in [k for k in self._cache if k != CACHE_ENTRY]:
            del self._cache[key]

    @property
    def rank(self) -> int | None:
        info = self.meta.get("distributedInfo")
        if isinstance(info, dict) and isinstance(info.get("rank"), int):
            return info["rank"]
        return None

    def __len__(self) -> int:
        return len(self.events)

    # ---- derived columns, computed once ------------------------------------------------------

    def codes(self, col: str) -> np.ndarray:
        """Category codes of a string column (ph, cat, name, pid, tid); -1 for missing."""
        return self.events[col].cat.codes.to_numpy()

    def labels(self, col: str) -> np.ndarray:
        """The distinct strings of a column as an object array, plus "" at the end for code -1."""
        key = "labels:" + col
        if key not in self._cache:
            cats = self.events[col].cat.categories
            self._cache[key] = np.array([str(c) for c in cats] + [""], dtype=object)
        return self._cache[key]

    def strings(self, col: str, rows=None) -> np.ndarray:
        """A string column (or its `rows`) as an object array, without materialising the rest."""
        c = self.codes(col)
        return self.labels(col)[c if rows is None else c[rows]]

    def cat_mask(self, cats: frozenset) -> np.ndarray:
        """Boolean mask of events whose lower-cased category is in `cats`."""
        cat = self.events["cat"].cat
        keep = np.array([str(c).lower() in cats for c in cat.categories] + [False])
        return keep[cat.codes.to_numpy()]

    def name_mask(self, pattern) -> np.ndarray:
        """Boolean mask of events whose name matches `pattern` (tested once per distinct name)."""
        name = self.events["name"].cat
        keep = np.array([bool(pattern.search(str(n))) for n in name.categories] + [False])
        return keep[name.codes.to_numpy()]

    def complete_mask(self) -> np.ndarray:
        """Duration events (ph X) with a finite, non-negative duration."""
        if "complete" not in self._cache:
            dur = self.events["dur"].to_numpy()
            is_x = self.labels("ph") == "X"
            self._cache["complete"] = is_x[self.codes("ph")] & np.isfinite(dur) & (dur >= 0)
        return self._cache["complete"]

    def lane_keys(self) -> np.ndarray:
        """One int64 per event naming its (pid, tid) lane, for grouping events by thread."""
        if "lane_keys" not in self._cache:
            self._cache["lane_keys"] = (self.codes("pid").astype(np.int64) << 32) | \
                self.codes("tid").astype(np.int64)
        return self._cache["lane_keys"]

    def nesting(self) -> dict:
        """Per host-thread call nesting of duration events: depth, parent row, self time.

        Returns arrays over all rows: depth (-1 outside the nesting), parent (-1 for roots) and
        self_us (duration minus the durations of direct children, clipped at 0; NaN outside).
        Intervals are assumed properly nested per (pid, tid), as the profiler writes them; a child
        that overhangs its parent is still attributed to the innermost event that started before it.
        """
        if "nesting" not in self._cache:
            self._cache["nesting"] = nesting_of(self)
        return self._cache["nesting"]


def nesting_of(trace: Trace, mask: np.ndarray | None = None) -> dict:
    """Trace.nesting() over the host events in ``mask`` only (default: all of them), not cached:
    e.g. operators among operators, with Python frames or other ranges left out."""
    ev = trace.events
    n = len(ev)
    depth = np.full(n, -1, dtype=np.int32)
    parent = np.full(n, -1, dtype=np.int64)
    self_us = np.full(n, np.nan)
    rows = np.flatnonzero(classify.host_mask(trace) if mask is None else mask)
    if rows.size == 0:
        return {"depth": depth, "parent": parent, "self_us": self_us}
    ts = ev["ts"].to_numpy()[rows]
    dur = ev["dur"].to_numpy()[rows]
    lane = trace.lane_keys()[rows]
    # Sort by lane, start, longest first: a parent precedes its children.
    order = _lane_order(lane, ts, dur)
    rows, ts, dur, lane = rows[order], ts[order], dur[order], lane[order]
    end = ts + dur
    m = rows.size
    # Depth = events opened before i in its lane minus those closed by ts[i] (end <= ts[i]).
    # Zero-length events starting exactly at ts[i] and sorted at or after i are not yet opened,
    # so they are taken back out of the closed count.
    d = np.zeros(m, dtype=np.int64)
    bounds = np.r_[0, np.flatnonzero(np.diff(lane)) + 1, m]
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        t, e = ts[lo:hi], end[lo:hi]
        closed = np.searchsorted(np.sort(e), t, side="right")
        zero = dur[lo:hi] == 0
        if zero.any():
            grp = np.r_[0, np.flatnonzero(np.diff(t)) + 1, hi - lo]
            sizes = np.diff(grp)
            gid = np.repeat(np.arange(sizes.size), sizes)
            zeros_in = np.bincount(gid, weights=zero, minlength=sizes.size).astype(np.int64)
            grp_end = grp[1:][gid]
            local = np.arange(hi - lo)
            closed -= np.where(zero, grp_end - local, zeros_in[gid])
        d[lo:hi] = np.arange(hi - lo) - closed
    d = np.maximum(d, 0).astype(np.int32)
    par = np.full(m, -1, dtype=np.int64)
    # Parent = the last event before i (same lane) one level up. Looked up level by level.
    for level in range(1, int(d.max()) + 1 if m else 1):
        kids = np.flatnonzero(d == level)
        ups = np.flatnonzero(d == level - 1)
        if kids.size == 0 or ups.size == 0:
            continue
        pos = np.searchsorted(ups, kids, side="left") - 1
        ok = pos >= 0
        cand = ups[np.where(ok, pos, 0)]
        ok &= lane[cand] == lane[kids]
        par[kids[ok]] = cand[ok]
    child_sum = np.bincount(par[par >= 0], weights=dur[par >= 0], minlength=m)
    depth[rows] = d
    parent[rows] = np.where(par >= 0, rows[np.where(par >= 0, par, 0)], -1)
    self_us[rows] = np.maximum(dur - child_sum, 0.0)
    return {"depth": depth, "parent": parent, "self_us": self_us}


def _lane_order(lane: np.ndarray, ts: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """np.lexsort((-dur, ts, lane)), fast: host events come nearly sorted by start, so two stable sorts
    (start, then lane as a small integer: a radix sort) order them, and only runs of equal (lane, start)
    are sorted again, longest first. The same order, stable ties included, at a tenth of the time."""
    order = np.argsort(ts, kind="stable")
    pid, tid = lane >> 32, lane & 0xFFFFFFFF
    dense = pid * (int(tid.max()) + 1) + tid if lane.size else lane
    if lane.size and 0 <= int(dense.min()) and int(dense.max()) < 1 << 16:
        dense = dense.astype(np.uint16)
    order = order[np.argsort(dense[order], kind="stable")]
    lane_s, ts_s = lane[order], ts[order]
    tie = (lane_s[1:] == lane_s[:-1]) & (ts_s[1:] == ts_s[:-1])
    if tie.any():
        starts = np.r_[0, np.flatnonzero(~tie) + 1]
        sizes = np.diff(np.r_[starts, order.size])
        group = np.repeat(np.arange(starts.size), sizes)
        sel = np.flatnonzero(sizes[group] > 1)
        order[sel] = order[sel][np.lexsort((-dur[order][sel], group[sel]))]
    return order
