"""The profiler page's views of a profiled run, computed on loaded Traces (one per profiler cycle).

step_breakdown: each step's time in its record_function phases. device_split: the TensorBoard
plugin's split of each step into kernel / memcpy / memset / runtime / CPU / other time.
module_times: forward and backward time per module, as a tree. kernel_table: GPU kernels by
name with their launch configuration. timeline: the trace layer's Timeline record (trace/timeline.py)
with the operators' input shapes. Plain records; times in ms (the kernel table and the timeline in µs).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import msgspec
import numpy as np
import pandas as pd

from diagnostics.trace import intervals as iv
from diagnostics.trace.classify import (
    BACKWARD_NODE_PREFIX, HOST_OP_CATS, KERNEL_CATS, MEMCPY_CATS, MEMSET_CATS, MODULE_PREFIX,
    PYTHON_CATS, ROOT_MODULE, RUNTIME_CATS, STEP_PHASES, USER_ANNOTATION_CATS, kernel_mask,
    uses_tensor_cores,
)
from diagnostics.trace.comm_args import named_events
from diagnostics.trace.errors import TraceError
from diagnostics.trace.model import Trace, nesting_of
from diagnostics.trace.records.timeline import Timeline
from diagnostics.trace.timeline import timeline_data
from diagnostics.trace.breakdowns import step_spans

#: The TensorBoard plugin's step split, in priority order: a moment covered by a kernel counts as
#: kernel even when the CPU is also busy; "other" is what no event covers.
SPLIT_CATEGORIES = ("kernel", "memcpy", "memset", "runtime", "cpu_exec", "other")
_SPLIT_CATS = {"kernel": KERNEL_CATS, "memcpy": MEMCPY_CATS, "memset": MEMSET_CATS,
               "runtime": RUNTIME_CATS, "cpu_exec": HOST_OP_CATS | PYTHON_CATS}
#: The host events module ranges nest among: operators and record_function ranges. Python frames
#: (with_stack) are left out: a module range opens in one hook's frame and closes in another's,
#: so it overhangs both, and an overhanging event breaks the nesting of what follows it.
_MODULE_NEST_CATS = HOST_OP_CATS | USER_ANNOTATION_CATS
#: Slack for "inside the step" (µs): Kineto rounds ends and starts separately.
_EDGE_US = 1e-3


def _times(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    ev = trace.events
    ts = ev["ts"].to_numpy()
    return ts, ts + ev["dur"].to_numpy()


# ---- steps -----------------------------------------------------------------------------------

def step_breakdown(trace: Trace) -> list[dict]:
    """Per step: its time and the time in each record_function phase; 'other_ms' is the rest.

    A phase counts when it is a STEP_PHASES range on the step's thread inside the step's time
    range; the columns add up to ``step_ms`` (other is clamped at zero).
    """
    st = step_spans(trace)
    if not len(st):
        return []
    ts, end = _times(trace)
    lane = trace.lane_keys()
    is_phase = np.isin(trace.labels("name"), STEP_PHASES)[trace.codes("name")]
    rows = np.flatnonzero(trace.complete_mask() & trace.cat_mask(USER_ANNOTATION_CATS) & is_phase)
    rows_ts, rows_end, rows_lane = ts[rows], end[rows], lane[rows]
    rows_name = trace.strings("name", rows)
    dur = (rows_end - rows_ts) / 1e3
    out = []
    for s in st.itertuples(index=False):
        start, stop = s.start_us, s.start_us + s.dur_us
        inside = (rows_lane == lane[s.row]) & (rows_ts >= start) & (rows_end <= stop + _EDGE_US)
        row = {"step": int(s.step), "step_ms": s.dur_us / 1e3}
        for p in STEP_PHASES:
            row[f"{p}_ms"] = float(dur[inside & (rows_name == p)].sum())
        row["other_ms"] = max(0.0, row["step_ms"] - sum(row[f"{p}_ms"] for p in STEP_PHASES))
        out.append(row)
    return out


def device_split(trace: Trace) -> list[dict]:
    """The TensorBoard plugin's step split: kernel / memcpy / memset / runtime / cpu_exec / other (ms).

    Each moment of a step's window goes to the highest-priority category covering it (see
    SPLIT_CATEGORIES). A step's window runs from its start to the next step's start, the last one
    to the later of its end and the end of the last device event, so GPU work that lags its
    launching step still lands in a step. The columns add up to ``window_ms``.
    """
    st = step_spans(trace)
    if not len(st):
        return []
    ts, end = _times(trace)
    complete = trace.complete_mask()
    covered = {}
    for c, cats in _SPLIT_CATS.items():
        m = complete & trace.cat_mask(cats)
        covered[c] = iv.union(ts[m], end[m])
    device_ends = [covered[c][1][-1] for c in SPLIT_CATEGORIES[:3] if covered[c][1].size]  # device work
    last_device_end = max(device_ends, default=0.0)
    starts = st["start_us"].to_numpy()
    stops = starts + st["dur_us"].to_numpy()
    rows = []
    for i, step in enumerate(st["step"].tolist()):
        lo = float(starts[i])
        hi = float(starts[i + 1]) if i + 1 < len(st) else max(float(stops[i]), last_device_end)
        row = {"step": int(step), "window_ms": (hi - lo) / 1e3}
        taken = iv.EMPTY
        for c in SPLIT_CATEGORIES[:-1]:
            mine = iv.clip(covered[c], lo, hi)
            grown = iv.union(np.r_[taken[0], mine[0]], np.r_[taken[1], mine[1]])
            row[f"{c}_ms"] = (iv.length(grown) - iv.length(taken)) / 1e3
            taken = grown
        row["other_ms"] = (hi - lo - iv.length(taken)) / 1e3
        rows.append(row)
    return rows


# ---- modules ---------------------------------------------------------------------------------

class _ModuleTimes:
    """Forward ranges, forward-op sequence numbers and backward nodes gathered over the traces."""

    def __init__(self):
        self.forward: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.seq_owner: dict[int, str] = {}
        self.backward: list[tuple[int, float]] = []  # (sequence number or -1, ms)

    def add(self, trace: Trace) -> None:
        ev = trace.events
        mask = trace.complete_mask() & trace.cat_mask(_MODULE_NEST_CATS)
        rows = np.flatnonzero(mask)
        if not rows.size:
            return
        nest = nesting_of(trace, mask)
        depth, parent = nest["depth"], nest["parent"]
        labels = trace.labels("name")
        codes = trace.codes("name")
        module_name = np.array([n.startswith(MODULE_PREFIX) for n in labels])
        node_name = np.array([n.startswith(BACKWARD_NODE_PREFIX) for n in labels])
        is_module = mask & module_name[codes] & trace.cat_mask(USER_ANNOTATION_CATS)
        dur = ev["dur"].to_numpy()
        # owner: the name code of the innermost module range around each event (-1: none),
        # filled level by level so a parent is always done before its children.
        owner = np.full(len(ev), -1, dtype=np.int64)
        for level in range(int(depth[rows].max()) + 1):
            r = rows[depth[rows] == level]
            p = parent[r]
            inherited = np.where(p >= 0, owner[np.maximum(p, 0)], -1)
            owner[r] = np.where(is_module[r], codes[r], inherited)
        mods = np.flatnonzero(is_module)
        if mods.size:
            uniq, inv, counts = np.unique(codes[mods], return_inverse=True, return_counts=True)
            ms = np.bincount(inv.ravel(), weights=dur[mods] / 1e3)
            for code, total, n in zip(uniq.tolist(), ms.tolist(), counts.tolist()):
                name = labels[code][len(MODULE_PREFIX):]
                self.forward[name] += total
                self.calls[name] += n
        seq = ev["seq"].to_numpy()
        fwd_tid = ev["fwd_tid"].to_numpy()
        is_node = mask & node_name[codes]
        # Forward ops: a sequence number and no forward thread (that marks a backward op).
        forward_op = mask & ~is_node & (seq >= 0) & (fwd_tid <= 0) & (owner >= 0)
        self._own_sequences(trace, np.flatnonzero(forward_op), seq, owner, labels, rows)
        # Only the outermost evaluate_function owns its time (nested ones are inside it).
        outer = is_node & ~np.where(parent >= 0, is_node[np.maximum(parent, 0)], False)
        self.backward.extend(zip(seq[outer].tolist(), (dur[outer] / 1e3).tolist()))

    def _own_sequences(self, trace: Trace, cand: np.ndarray, seq, owner, labels, rows) -> None:
        """Each sequence number's module: its first forward op's, threads taken in the order they
        first appear in the trace, each thread's ops by start (longest first)."""
        if not cand.size:
            return
        lane = trace.lane_keys()
        lanes, first = np.unique(lane[rows], return_index=True)
        rank = np.empty(lanes.size, dtype=np.int64)
        rank[np.argsort(first)] = np.arange(lanes.size)
        cand_rank = rank[np.searchsorted(lanes, lane[cand])]
        ev = trace.events
        order = np.lexsort((-ev["dur"].to_numpy()[cand], ev["ts"].to_numpy()[cand], cand_rank))
        cand = cand[order]
        _, first_of_seq = np.unique(seq[cand], return_index=True)
        for r in cand[np.sort(first_of_seq)].tolist():
            self.seq_owner.setdefault(int(seq[r]), labels[owner[r]][len(MODULE_PREFIX):])

    def rows(self, module_types: dict[str, str]) -> list[dict]:
        bwd_self: dict[str, float] = defaultdict(float)
        unattributed = 0.0
        for seq, ms in self.backward:
            mod = self.seq_owner.get(seq) if seq >= 0 else None
            if mod is None:
                unattributed += ms
            else:
                bwd_self[mod] += ms
        return _module_tree(self.forward, self.calls, bwd_self, unattributed, module_types)


def module_times(traces: Trace | list[Trace], module_types: dict[str, str] | None = None) -> list[dict]:
    """Per module (qualified name): forward time from its ``module::`` ranges and backward time.

    Backward: each autograd ``evaluate_function`` event carries the sequence number of the forward
    op that created its node; that op's innermost enclosing module range owns the backward time.
    ``*_self_ms`` excludes child modules; inclusive times sum the subtree. Returns records sorted
    by name with 'parent' (None for the root) for a tree chart. Several traces (profiler cycles)
    are summed; a sequence number's module is taken from the first trace that has it.
    """
    acc = _ModuleTimes()
    for t in ([traces] if isinstance(traces, Trace) else traces):
        acc.add(t)
    return acc.rows(module_types or {})


def _module_tree(fwd_total: dict, calls: dict, bwd_self: dict, unattributed: float,
                 module_types: dict) -> list[dict]:
    names = set(fwd_total) | set(bwd_self)
    # Fill in ancestors that never ran a range of their own (e.g. containers), so the tree is whole.
    for n in list(names):
        while n != ROOT_MODULE:
            n = _parent(n)
            names.add(n)
    children: dict[str, list[str]] = defaultdict(list)
    for n in names:
        if n != ROOT_MODULE:
            children[_parent(n)].append(n)

    def bwd_incl(n: str) -> float:
        return bwd_self.get(n, 0.0) + sum(bwd_incl(c) for c in children.get(n, []))

    rows = []
    for n in sorted(names, key=_sort_key):
        fwd = fwd_total.get(n, 0.0)
        if fwd == 0.0 and n in children:  # a container without its own range: its children's sum
            fwd = sum(fwd_total.get(c, 0.0) for c in children[n])
        kids_fwd = sum(fwd_total.get(c, 0.0) for c in children.get(n, []))
        rows.append({
            "name": n, "parent": None if n == ROOT_MODULE else _parent(n), "type": module_types.get(n, ""),
            "calls": calls.get(n, 0), "forward_ms": fwd, "forward_self_ms": max(0.0, fwd - kids_fwd),
            "backward_ms": bwd_incl(n), "backward_self_ms": bwd_self.get(n, 0.0),
        })
    if rows and unattributed:
        rows.append({"name": "(backward, no module)", "parent": None, "type": "", "calls": 0, "forward_ms": 0.0,
                     "forward_self_ms": 0.0, "backward_ms": unattributed, "backward_self_ms": unattributed})
    return rows


def _parent(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name else ROOT_MODULE


def _sort_key(name: str):
    return (0, ()) if name == ROOT_MODULE else (1, tuple(int(p) if p.isdigit() else p for p in name.split(".")))


# ---- kernels ---------------------------------------------------------------------------------

def kernel_table(traces: Trace | list[Trace]) -> list[dict]:
    """GPU kernels grouped by name: calls, total / mean / max / min µs, grid, block, registers,
    occupancy (of the first launch seen) and whether the name marks a Tensor Core kernel."""
    parts = []
    for t in ([traces] if isinstance(traces, Trace) else traces):
        rows = np.flatnonzero(kernel_mask(t))
        ev = t.events
        parts.append(pd.DataFrame({
            "name": t.strings("name", rows), "dur": ev["dur"].to_numpy()[rows],
            "grid": t.strings("grid", rows), "block": t.strings("block", rows),
            "registers": ev["registers"].to_numpy()[rows], "occupancy": ev["occupancy"].to_numpy()[rows]}))
    k = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    if not len(k):
        return []
    g = k.groupby("name", sort=False)
    agg = g.agg(calls=("dur", "size"), total_us=("dur", "sum"), max_us=("dur", "max"), min_us=("dur", "min"))
    first = g[["grid", "block", "registers", "occupancy"]].first()
    agg = agg.join(first).reset_index().sort_values("total_us", ascending=False, kind="stable")
    total = float(agg["total_us"].sum()) or 1.0
    out = []
    for r in agg.itertuples(index=False):
        out.append({
            "name": r.name, "calls": int(r.calls), "total_us": float(r.total_us), "max_us": float(r.max_us),
            "min_us": float(r.min_us), "grid": r.grid or None, "block": r.block or None,
            "registers_per_thread": int(r.registers) if r.registers >= 0 else None,
            "occupancy_pct": float(r.occupancy) if np.isfinite(r.occupancy) else None,
            "tensor_cores": uses_tensor_cores(r.name),
            "mean_us": float(r.total_us) / int(r.calls), "pct_of_kernel_time": 100.0 * float(r.total_us) / total})
    return out


def tensor_core_pct(kernels: list[dict]) -> float | None:
    """Share of kernel time (%) in kernels whose names mark Tensor Cores; None without kernels."""
    total = sum(k["total_us"] for k in kernels)
    if not kernels or total <= 0:
        return None
    return 100.0 * sum(k["total_us"] for k in kernels if k["tensor_cores"]) / total


# ---- timeline --------------------------------------------------------------------------------

def timeline(trace: Trace, max_events: int, trace_file: str | Path | None = None) -> Timeline:
    """trace.timeline_data for the profiler page: the same Timeline record (lanes labelled as a user reads them:
    the thread's name where the trace has one, "GPU 0 · stream 7"). With ``trace_file`` (the same trace's file,
    recorded with shapes) each drawn operator that recorded them gets its "Input Dims" as ``shapes`` (the ingest
    skips args, for speed: they are read in its second pass, comm_args, for the drawn events' names only)."""
    data = timeline_data(trace, max_events=max_events)
    if not trace_file:
        return data
    shapes = _input_dims(trace_file, {e.name for e in data.events}, trace.origin_us)
    events = tuple(msgspec.structs.replace(e, shapes=shapes[key]) if (key := (e.name, round(e.start_us, 3))) in shapes
                   else e for e in data.events)
    return msgspec.structs.replace(data, events=events)


def _input_dims(trace_file, names, origin_us: float) -> dict:
    """(name, start µs from the trace's origin) -> "[[8, 64], [64]]" for the operators named ``names``
    that recorded input shapes; {} when the file cannot be read as a trace."""
    try:
        events, _ = named_events(trace_file, names)
    except TraceError:
        return {}
    out = {}
    for e in events:
        dims = (e.get("args") or {}).get("Input Dims")
        if dims and any(dims):
            out[(e["name"], round(float(e["ts"]) - origin_us, 3))] = str(dims).replace(" ", "")
    return out
