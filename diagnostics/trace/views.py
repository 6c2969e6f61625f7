"""HTA-class analyses of a loaded Trace. Each function returns plain, JSON-able data (records).

summary: duration, steps, events by category, threads, streams, memory peaks.
temporal_breakdown: per ProfilerStep, GPU time by kind (exclusive, priority compute >
communication > memcpy > memset, the rest idle) and host self time by operator family.
top_operators: host operators and GPU kernels by time. idle_time: gaps between GPU work on each
stream, with their cause. launch_stats: launch delay, runtime call duration, short kernels.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diagnostics.trace import intervals as iv
from diagnostics.trace.classify import (
    FRAME_CATS, HOST_OP_CATS, MEMCPY_CATS, MEMSET_CATS, RUNTIME_CATS, STEP_RE, comm_mask, gpu_work_mask,
    host_mask, host_op_mask, op_family, step_mask,
)
from diagnostics.trace.model import Trace

# A gap shorter than this between two GPU events whose launch was already queued is put down
# to launch overhead ("kernel wait"); a longer one to syncs/dependencies ("other wait").
KERNEL_WAIT_MAX_US = 5.0
# Launches whose kernel started this long after the runtime call began are flagged.
LONG_LAUNCH_DELAY_US = 100.0
LAUNCH_SAMPLE = 2000   # (cpu, gpu duration) points kept for a scatter plot

STEP_SELF = "untracked (step self time)"


def _records(df: pd.DataFrame) -> list:
    out = df.to_dict("records")
    for row in out:
        for k, v in row.items():
            if isinstance(v, np.integer):
                row[k] = int(v)
            elif isinstance(v, (float, np.floating)):
                row[k] = float(v) if np.isfinite(v) else None
    return out


# ---- steps -----------------------------------------------------------------------------------

def steps(trace: Trace) -> pd.DataFrame:
    """ProfilerStep#N host spans: columns step, name, start_us, dur_us (sorted by start)."""
    return step_spans(trace)[["step", "name", "start_us", "dur_us"]]


def step_spans(trace: Trace) -> pd.DataFrame:
    """steps() with the event row of each step's span (its thread: trace.lane_keys()[row])."""
    if "steps" in trace._cache:
        return trace._cache["steps"]
    ev = trace.events
    rows = np.flatnonzero(step_mask(trace))
    df = pd.DataFrame({"row": rows, "name": trace.strings("name", rows),
                       "start_us": ev["ts"].to_numpy()[rows],
                       "dur_us": ev["dur"].to_numpy()[rows]})
    df["step"] = df["name"].str.extract(STEP_RE, expand=False).astype(int)
    # One span per step number (the profiler writes one; merged traces may repeat it).
    df = df.sort_values(["step", "dur_us"], ascending=[True, False]).drop_duplicates("step")
    df = df.sort_values("start_us").reset_index(drop=True)[["step", "name", "start_us", "dur_us", "row"]]
    trace._cache["steps"] = df
    return df


def _step_windows(trace: Trace) -> pd.DataFrame:
    """Steps, or the whole trace as step -1 when it has no ProfilerStep."""
    st = steps(trace)
    if len(st):
        return st
    ev = trace.events
    m = trace.complete_mask() & ~trace.cat_mask(FRAME_CATS)
    ts, end = ev["ts"].to_numpy()[m], (ev["ts"] + ev["dur"]).to_numpy()[m]
    lo, hi = (float(ts.min()), float(end.max())) if ts.size else (0.0, 0.0)
    return pd.DataFrame({"step": [-1], "name": ["whole trace"], "start_us": [lo],
                         "dur_us": [hi - lo]})


def _assign_step(ts: np.ndarray, windows: pd.DataFrame) -> np.ndarray:
    """Index into `windows` of the step whose [start, end) holds each ts, else -1."""
    start = windows["start_us"].to_numpy()
    end = start + windows["dur_us"].to_numpy()
    i = np.searchsorted(start, ts, side="right") - 1
    ok = (i >= 0) & (ts < end[np.maximum(i, 0)])
    return np.where(ok, i, -1)


# ---- GPU helpers -----------------------------------------------------------------------------

def _gpu_frame(trace: Trace) -> pd.DataFrame:
    """GPU kernels/memcpys/memsets with kind, launch call (by correlation) and times."""
    if "gpu" in trace._cache:
        return trace._cache["gpu"]
    ev = trace.events
    rows = np.flatnonzero(gpu_work_mask(trace))
    kind = np.full(rows.size, "compute", dtype=object)
    kind[trace.cat_mask(MEMCPY_CATS)[rows]] = "memcpy"
    kind[trace.cat_mask(MEMSET_CATS)[rows]] = "memset"
    comm = comm_mask(trace)[rows]
    kind[comm] = "communication"
    pid = trace.strings("pid", rows)
    device = ev["device"].to_numpy()[rows]
    tid = trace.strings("tid", rows)
    stream = ev["stream"].to_numpy()[rows]
    g = pd.DataFrame({
        "row": rows, "name": trace.strings("name", rows), "kind": kind,
        "start_us": ev["ts"].to_numpy()[rows], "dur_us": ev["dur"].to_numpy()[rows],
        "device": np.where(device >= 0, device.astype(str), pid),
        "stream": np.where(stream >= 0, stream.astype(str), tid),
        "corr": ev["corr"].to_numpy()[rows]})
    g["end_us"] = g["start_us"] + g["dur_us"]
    # Launch calls: runtime events with a correlation id.
    rm = trace.complete_mask() & trace.cat_mask(RUNTIME_CATS) & (ev["corr"].to_numpy() >= 0)
    launch = pd.DataFrame({"corr": ev["corr"].to_numpy()[rm],
                           "launch_name": trace.strings("name", rm),
                           "launch_start_us": ev["ts"].to_numpy()[rm],
                           "launch_dur_us": ev["dur"].to_numpy()[rm]})
    launch = launch.drop_duplicates("corr")
    g = g.merge(launch, on="corr", how="left") if len(g) else g.assign(
        launch_name=None, launch_start_us=np.nan, launch_dur_us=np.nan)
    g = g.sort_values("start_us", kind="stable").reset_index(drop=True)
    trace._cache["gpu"] = g
    return g


def _exclusive(g: pd.DataFrame) -> dict:
    """GPU time per kind with overlaps given to the first kind in KIND_PRIORITY."""
    covered = {}
    acc_s, acc_e = np.empty(0), np.empty(0)
    base = 0.0
    for kind in KIND_PRIORITY:
        sub = g[g["kind"] == kind]
        acc_s = np.r_[acc_s, sub["start_us"].to_numpy()]
        acc_e = np.r_[acc_e, sub["end_us"].to_numpy()]
        total = iv.length(iv.union(acc_s, acc_e))
        covered[kind] = total - base
        base = total
    return covered


KIND_PRIORITY = ("compute", "communication", "memcpy", "memset")


# ---- analyses --------------------------------------------------------------------------------

def summary(trace: Trace) -> dict:
    """Duration, steps, events by category, threads, streams, memory peaks, warnings."""
    ev = trace.events
    complete = trace.complete_mask()
    frame = trace.cat_mask(FRAME_CATS)
    timed = complete & ~frame
    ts, dur = ev["ts"].to_numpy(), ev["dur"].to_numpy()
    start = float(ts[timed].min()) if timed.any() else 0.0
    end = float((ts + dur)[timed].max()) if timed.any() else 0.0
    cat = trace.strings("cat")
    cat = np.where(cat == "", "(none)", cat)
    by_cat = pd.DataFrame({"cat": cat, "dur": np.where(complete, dur, 0.0)}).groupby(
        "cat", observed=True).agg(events=("dur", "size"), total_us=("dur", "sum"))
    by_cat = by_cat.sort_values("events", ascending=False).reset_index()
    nest = trace.nesting()
    cpu = host_mask(trace)
    roots = cpu & (nest["parent"] < 0)
    th = pd.DataFrame({"pid": trace.strings("pid", cpu),
                       "tid": trace.strings("tid", cpu),
                       "busy": np.where(roots, dur, 0.0)[cpu]})
    threads = th.groupby(["pid", "tid"]).agg(events=("busy", "size"), busy_us=("busy", "sum"))
    threads = threads.reset_index()
    threads["name"] = [trace.thread_names.get(f"{p}/{t}", "") for p, t in
                       zip(threads["pid"], threads["tid"])]
    g = _gpu_frame(trace)
    streams = []
    for (device, stream), sub in g.groupby(["device", "stream"]):
        counts = sub["kind"].value_counts()
        streams.append({"device": device, "stream": stream,
                        "kernels": int(counts.get("compute", 0) + counts.get("communication", 0)),
                        "memcpy": int(counts.get("memcpy", 0)),
                        "memset": int(counts.get("memset", 0)),
                        "busy_us": iv.length(iv.union(sub["start_us"].to_numpy(),
                                                              sub["end_us"].to_numpy()))})
    mem = ev["total_allocated"].to_numpy() >= 0
    memory = []
    if mem.any():
        mdf = pd.DataFrame({"device_type": ev["device_type"].to_numpy()[mem],
                            "device": ev["device"].to_numpy()[mem],
                            "alloc": ev["total_allocated"].to_numpy()[mem]})
        for (dt, dv), sub in mdf.groupby(["device_type", "device"]):
            memory.append({"device": ("cpu" if dt == 0 else "cuda" if dt == 1 else f"type {dt}")
                           + ("" if dv < 0 else f":{dv}"),
                           "peak_allocated_bytes": int(sub["alloc"].max())})
    st = steps(trace)
    return {
        "source": trace.source,
        "bytes": trace.n_bytes,
        "events": len(ev),
        "duration_us": end - start,
        "rank": trace.rank,
        "schema_version": trace.meta.get("schemaVersion"),
        "base_time_ns": trace.meta.get("baseTimeNanoseconds"),
        "has_gpu": bool(len(g)),
        "n_steps": len(st),
        "steps": _records(st),
        "categories": _records(by_cat),
        "threads": _records(threads[["pid", "tid", "name", "events", "busy_us"]]),
        "streams": streams,
        "memory": memory,
        "skipped_events": trace.skipped_events,
        "warnings": list(trace.warnings),
    }


def temporal_breakdown(trace: Trace) -> dict:
    """Per step: GPU time by kind plus idle, and host self time by operator family/category.

    GPU work belongs to the step in which its launch call started (by correlation id; work with
    no launch call, by its own start). A step's GPU window runs from its first GPU event's start
    to its last one's end; idle is the window less the union of busy time.
    """
    win = _step_windows(trace)
    g = _gpu_frame(trace)
    gpu_rows = []
    if len(g):
        anchor = g["launch_start_us"].fillna(g["start_us"]).to_numpy()
        g = g.assign(step_i=_assign_step(anchor, win))
        for i, sub in g[g["step_i"] >= 0].groupby("step_i"):
            lo, hi = float(sub["start_us"].min()), float(sub["end_us"].max())
            ex = _exclusive(sub)
            busy = sum(ex.values())
            row = {"step": int(win["step"].iloc[i]), "window_us": hi - lo}
            row.update({f"{k}_us": v for k, v in ex.items()})
            row["idle_us"] = (hi - lo) - busy
            gpu_rows.append(row)
    ev = trace.events
    nest = trace.nesting()
    cpu = np.flatnonzero(host_mask(trace))
    step_i = _assign_step(ev["ts"].to_numpy()[cpu], win)
    keep = step_i >= 0
    cpu, step_i = cpu[keep], step_i[keep]
    groups = _cpu_groups(trace)[cpu]
    df = pd.DataFrame({"step": win["step"].to_numpy()[step_i], "group": groups,
                       "self_us": nest["self_us"][cpu]})
    cpu_rows = df.groupby(["step", "group"], sort=True)["self_us"].sum().reset_index()
    return {"steps": _records(win[["step", "start_us", "dur_us"]]),
            "gpu": gpu_rows, "cpu": _records(cpu_rows),
            "kind_priority": list(KIND_PRIORITY)}


def _cpu_groups(trace: Trace) -> np.ndarray:
    """Per event: "op: <family>" for operators, the category otherwise, STEP_SELF for steps."""
    ev = trace.events
    name_cats = ev["name"].cat.categories
    fam = np.array(["op: " + op_family(str(n)) for n in name_cats] + [""], dtype=object)
    is_step = trace.name_mask(STEP_RE)
    out = fam[ev["name"].cat.codes.to_numpy()]
    not_op = ~trace.cat_mask(HOST_OP_CATS)
    out[not_op] = trace.strings("cat")[not_op]
    out[is_step] = STEP_SELF
    return out


def top_operators(trace: Trace, n: int) -> dict:
    """Host operators (cpu_op, by self time) and GPU kernels (by time): calls, totals, shares."""
    ev = trace.events
    nest = trace.nesting()
    m = host_op_mask(trace)
    dup = repeated_calls(trace)
    # key_averages semantics: a call recorded twice (an only child named like its parent) is one
    # call; its self time stays with the name, so self_us sums every row.
    ops = pd.DataFrame({"name": trace.strings("name", m), "dur": ev["dur"].to_numpy()[m],
                        "call_dur": np.where(dup, np.nan, ev["dur"].to_numpy())[m], "self": nest["self_us"][m]})
    agg = ops.groupby("name").agg(calls=("call_dur", "count"), total_us=("call_dur", "sum"),
                                  self_us=("self", "sum"), max_us=("call_dur", "max"))
    agg["mean_us"] = agg["total_us"] / agg["calls"]
    all_self = float(agg["self_us"].sum()) or 1.0
    agg["self_pct"] = 100.0 * agg["self_us"] / all_self
    agg = agg.sort_values(["self_us", "total_us"], ascending=False).reset_index()
    g = _gpu_frame(trace)
    kern = g.groupby(["name", "kind"]).agg(calls=("dur_us", "size"), total_us=("dur_us", "sum"),
                                           max_us=("dur_us", "max")).reset_index()
    kern["mean_us"] = kern["total_us"] / kern["calls"]
    all_gpu = float(kern["total_us"].sum()) or 1.0
    kern["pct"] = 100.0 * kern["total_us"] / all_gpu
    kern = kern.sort_values("total_us", ascending=False)
    return {"operators": _records(agg.head(n)), "kernels": _records(kern.head(n)),
            "n_operators": int(len(agg)), "n_kernels": int(len(kern)),
            "operator_self_us": float(agg["self_us"].sum()),
            "kernel_us": float(kern["total_us"].sum())}


def repeated_calls(trace: Trace) -> np.ndarray:
    """Rows that torch's EventList drops as duplicates (_remove_dup_nodes): an event whose parent
    has the same name and no other child (one call recorded twice; the outer one stands for it)."""
    parent = trace.nesting()["parent"]
    n = parent.size
    has = parent >= 0
    children = np.bincount(parent[has], minlength=n) if has.any() else np.zeros(n, dtype=np.int64)
    codes = trace.codes("name")
    safe = np.where(has, parent, 0)
    return has & (codes[safe] == codes) & (children[safe] == 1)


def idle_time(trace: Trace) -> dict:
    """Idle gaps between consecutive GPU events on each stream, by cause.

    For a gap before event k: "host wait" when k's launch call started after the previous event
    ended (the GPU waited for the CPU); else "kernel wait" when the gap is at most
    KERNEL_WAIT_MAX_US (launch overhead between queued work); else "other wait" (syncs, events,
    other streams). Events with no launch call found count as "other wait".
    """
    g = _gpu_frame(trace)
    rows = []
    for (device, stream), sub in g.groupby(["device", "stream"]):
        sub = sub.sort_values("start_us")
        s, e = sub["start_us"].to_numpy(), sub["end_us"].to_numpy()
        prev_end = np.maximum.accumulate(e)[:-1]
        gap = np.maximum(s[1:] - prev_end, 0.0)
        launch = sub["launch_start_us"].to_numpy()[1:]
        host = np.isfinite(launch) & (launch >= prev_end)
        kernel = ~host & np.isfinite(launch) & (gap <= KERNEL_WAIT_MAX_US)
        other = ~host & ~kernel
        window = float(e.max() - s.min()) if s.size else 0.0
        rows.append({
            "device": device, "stream": stream, "events": int(s.size), "window_us": window,
            "busy_us": iv.length(iv.union(s, e)),
            "idle_us": float(gap.sum()), "gaps": int((gap > 0).sum()),
            "host_wait_us": float(gap[host].sum()), "kernel_wait_us": float(gap[kernel].sum()),
            "other_wait_us": float(gap[other].sum())})
    return {"streams": rows, "kernel_wait_max_us": KERNEL_WAIT_MAX_US}


def launch_stats(trace: Trace, n: int) -> dict:
    """Per GPU event with a launch call: launch delay (GPU start - call start), call duration.

    Flags kernels shorter than their launch call (launch-bound) and launch delays over
    LONG_LAUNCH_DELAY_US. Returns totals, per-name aggregates and a sample for scatter plots.
    """
    g = _gpu_frame(trace)
    g = g[g["launch_start_us"].notna()].copy()
    if not len(g):
        return {"launches": 0, "by_name": [], "sample": [], "short_kernels": 0,
                "long_delays": 0, "long_launch_delay_us": LONG_LAUNCH_DELAY_US}
    g["delay_us"] = g["start_us"] - g["launch_start_us"]
    g["short"] = g["dur_us"] < g["launch_dur_us"]
    g["long_delay"] = g["delay_us"] > LONG_LAUNCH_DELAY_US
    by = g.groupby("name").agg(launches=("dur_us", "size"), gpu_us=("dur_us", "sum"),
                               runtime_us=("launch_dur_us", "sum"),
                               mean_delay_us=("delay_us", "mean"),
                               max_delay_us=("delay_us", "max"),
                               short_kernels=("short", "sum"),
                               long_delays=("long_delay", "sum")).reset_index()
    by = by.sort_values(["short_kernels", "launches"], ascending=False)
    step = max(1, len(g) // LAUNCH_SAMPLE)
    sample = g.iloc[::step][["name", "kind", "launch_dur_us", "dur_us", "delay_us"]]
    return {
        "launches": int(len(g)),
        "mean_delay_us": float(g["delay_us"].mean()),
        "max_delay_us": float(g["delay_us"].max()),
        "mean_runtime_us": float(g["launch_dur_us"].mean()),
        "short_kernels": int(g["short"].sum()),
        "long_delays": int(g["long_delay"].sum()),
        "long_launch_delay_us": LONG_LAUNCH_DELAY_US,
        "by_name": _records(by.head(n)),
        "sample": _records(sample),
    }


ANALYSES = {
    "summary": summary,
    "temporal_breakdown": temporal_breakdown,
    "top_operators": top_operators,
    "idle_time": idle_time,
    "launch_stats": launch_stats,
}
