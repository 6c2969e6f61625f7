"""Collectives on a trace: one rank's per-step split of computation, communication and their
overlap, its collective calls, and their message sizes.

Per profiler step (``classify.STEP_RE``; the whole trace as step 0 without steps):

* communication: the collectives of ``classify.comm_mask``. On a GPU trace the NCCL kernels; on a
  CPU (gloo) trace the collective calls and annotations on any thread (``gloo:all_reduce`` runs on
  gloo's own thread, ``c10d::*`` on the caller's).
* computation: on a GPU trace the other kernels, memcpys and memsets; on a CPU trace the host
  operators, less what a thread spends inside its own collective calls (a copy or a wait there
  is the collective's work).
* overlap: both at once; exposed communication: communication while nothing computes;
  other: the rest of the step. busy = step - exposed communication.

Message sizes come from event args the columnar ingest does not keep ("In msg nelems", "Input
Dims"): ``collective_bytes`` reads them in the ingest's second pass over the file (comm_args).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from diagnostics.trace import intervals as iv
from diagnostics.trace.classify import (
    COMM_RE, comm_families, comm_mask, gpu_work_mask, host_mask, host_op_mask, is_comm,
)
from diagnostics.trace.comm_args import named_events
from diagnostics.trace.errors import TraceError
from diagnostics.trace.ingest import load_trace
from diagnostics.trace.model import Trace
from diagnostics.trace.breakdowns import steps as step_table

DTYPE_BYTES = {
    "float": 4, "float32": 4, "c10::float": 4, "int": 4, "int32": 4, "unsigned int": 4,
    "double": 8, "float64": 8, "long": 8, "long int": 8, "int64": 8, "long long": 8,
    "half": 2, "float16": 2, "c10::half": 2, "bfloat16": 2, "c10::bfloat16": 2, "short": 2, "int16": 2,
    "byte": 1, "char": 1, "bool": 1, "unsigned char": 1, "signed char": 1, "uint8": 1, "int8": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1,
}


# ---- message sizes ---------------------------------------------------------------------------

def event_bytes(args: dict) -> int | None:
    """Message bytes of one collective event from its args, or None when not recorded.

    record_param_comms (NCCL) has "In msg nelems"/"Out msg nelems" and "dtype": the larger of the
    two messages counts. gloo:/nccl: annotations recorded with shapes have "Input Dims" and
    "Input type" of the tensor: elements x element size.
    """
    if "In msg nelems" in args or "Out msg nelems" in args:
        size = DTYPE_BYTES.get(str(args.get("dtype", "")).lower())
        if size is None:
            return None
        n = max(int(args.get("In msg nelems") or 0), int(args.get("Out msg nelems") or 0))
        return n * size
    dims, types = args.get("Input Dims"), args.get("Input type")
    if isinstance(dims, list) and dims and isinstance(types, list) and types:
        size = DTYPE_BYTES.get(str(types[0]).lower())
        first = dims[0]
        if size is None or not isinstance(first, list) or not all(isinstance(d, int) for d in first):
            return None
        return int(np.prod(first, dtype=np.int64)) * size if first else size
    return None


def collective_bytes(path, trace: Trace | None = None) -> tuple[dict[tuple[str, int], int], str | None]:
    """(name, k-th complete event of that name) -> bytes, for the collective events of one file,
    and a note when the file was not read.

    Events are counted as the Trace holds them (complete events with a collective's name, any
    category, in file order), so the k-th here is the k-th in ``rank_breakdown``. Only the events of
    the collective names ``trace`` holds are decoded, streaming (comm_args: any size); without the
    file's ``trace`` it is loaded first (the ingest).
    """
    path = Path(path)
    try:
        trace = load_trace(path) if trace is None else trace
        found, _ = named_events(path, [n for n in trace.labels("name").tolist() if n and is_comm(n)])
    except TraceError as e:
        return {}, f"{path.name}: collective bytes not read ({e})"
    return _kth_bytes(found), None


def _kth_bytes(events) -> dict[tuple[str, int], int]:
    """(name, k) -> bytes over collective events in file order (the k-th event of its name)."""
    seen: dict[str, int] = {}
    out = {}
    for e in events:
        name = e["name"]
        k = seen.get(name, 0)
        seen[name] = k + 1
        b = event_bytes(e.get("args") or {})
        if b is not None:
            out[(name, k)] = b
    return out


# ---- one rank --------------------------------------------------------------------------------

def _busy_intervals(trace: Trace, ts: np.ndarray, end: np.ndarray) -> tuple[bool, iv.Intervals, iv.Intervals]:
    """(on_gpu, communication, computation) as disjoint interval sets over the whole trace."""
    comm = comm_mask(trace)
    gpu = gpu_work_mask(trace)
    if gpu.any():
        c, comp = gpu & comm, gpu & ~comm
        return True, iv.union(ts[c], end[c]), iv.union(ts[comp], end[comp])
    c = host_mask(trace) & comm
    ops = host_op_mask(trace) & ~comm
    lane = trace.lane_keys()
    starts, ends = [], []
    for ln in np.unique(lane[ops]):
        o, own = ops & (lane == ln), c & (lane == ln)
        # An op inside the thread's own collective call is that call's work (copy, wait).
        piece = iv.subtract(iv.union(ts[o], end[o]), iv.union(ts[own], end[own]))
        starts.append(piece[0])
        ends.append(piece[1])
    compute = iv.union(np.concatenate(starts), np.concatenate(ends)) if starts else iv.EMPTY
    return False, iv.union(ts[c], end[c]), compute


def rank_breakdown(trace: Trace, comm_bytes: dict | None = None, with_calls: bool = True) -> dict:
    """Steps, the compute/comm/overlap/other split per step, and the collective calls of one trace.

    ``comm_bytes``: what ``collective_bytes`` read from the same file (message sizes of the calls);
    ``with_calls`` False: no "calls" list (the per-step split only).
    Returns {"on_gpu", "steps": [{step, step_ms, compute_ms, comm_ms, overlap_ms, compute_only_ms,
    exposed_comm_ms, other_ms, busy_ms}], "calls": [{name, family (classify.comm_family), where, dur_ms,
    bytes}]}.
    """
    ev = trace.events
    ts = ev["ts"].to_numpy(dtype=float)
    end = ts + np.nan_to_num(ev["dur"].to_numpy(dtype=float))
    on_gpu, comm_iv, compute_iv = _busy_intervals(trace, ts, end)

    st = step_table(trace)
    if len(st):
        windows = [(int(n), float(s), float(s + d))
                   for n, s, d in zip(st["step"], st["start_us"], st["dur_us"])]
    else:
        timed = host_mask(trace) | gpu_work_mask(trace)
        windows = [(0, float(ts[timed].min()), float(end[timed].max()))]

    # Every window at once: the lengths of communication, computation and their intersection inside it.
    lo = np.array([w[1] for w in windows], dtype=float)
    hi = np.array([w[2] for w in windows], dtype=float)
    comm_all = iv.lengths_within(comm_iv, lo, hi) / 1000.0
    comp_all = iv.lengths_within(compute_iv, lo, hi) / 1000.0
    both_all = iv.lengths_within(iv.intersect(comm_iv, compute_iv), lo, hi) / 1000.0
    steps = []
    for (number, a, b), comm_ms, comp_ms, overlap_ms in zip(windows, comm_all.tolist(), comp_all.tolist(),
                                                              both_all.tolist()):
        step_ms = (b - a) / 1000.0
        busy_union = comm_ms + comp_ms - overlap_ms
        steps.append({
            "step": number, "step_ms": step_ms,
            "compute_ms": comp_ms, "comm_ms": comm_ms, "overlap_ms": overlap_ms,
            # differences of float sums: never below 0 (a -1e-13 would read "-0.0" in a table)
            "compute_only_ms": max(0.0, comp_ms - overlap_ms), "exposed_comm_ms": max(0.0, comm_ms - overlap_ms),
            "other_ms": max(0.0, step_ms - busy_union),
            "busy_ms": max(0.0, step_ms - max(0.0, comm_ms - overlap_ms)),
        })
    calls = _calls(trace, windows, ts, end, comm_bytes or {}) if with_calls else []
    return {"on_gpu": on_gpu, "steps": steps, "calls": calls}


def _calls(trace: Trace, windows: list, ts: np.ndarray, end: np.ndarray, comm_bytes: dict) -> list:
    """Collective calls that start inside a step; on a GPU trace the host-side calls
    (record_param_comms, c10d ops) are listed too, beside the NCCL kernels."""
    rows = np.flatnonzero(comm_mask(trace))
    if not rows.size:
        return []
    names = trace.strings("name")
    gpu = gpu_work_mask(trace)
    in_step = np.zeros(rows.size, dtype=bool)
    for _, lo, hi in windows:
        in_step |= (ts[rows] >= lo) & (ts[rows] < hi)
    # k-th event of its name in file order, counted over what collective_bytes counts.
    kth: dict[int, int] = {}
    ordinal: dict[str, int] = {}
    for r in np.flatnonzero(trace.complete_mask() & trace.name_mask(COMM_RE)).tolist():
        n = names[r]
        kth[r] = ordinal.get(n, 0)
        ordinal[n] = kth[r] + 1
    calls = []
    chosen = rows[in_step]
    for r, family in zip(chosen.tolist(), comm_families(trace, chosen)):
        n = str(names[r])
        calls.append({"name": n, "family": family, "where": "GPU" if gpu[r] else "CPU",
                      "dur_ms": float(end[r] - ts[r]) / 1000.0,
                      "bytes": comm_bytes.get((n, kth[r])) if r in kth else None})
    return calls
