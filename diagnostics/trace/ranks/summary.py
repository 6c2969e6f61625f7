"""The map of the multi-rank analysis: one rank's trace file -> a small summary (plain data).

``rank_summary(path)`` reads one rank (the streaming ingest: the columns of one trace at a time,
never the JSON document) and keeps what the cross-rank views need: its identity (distributedInfo,
versions, the wall clock of its first event), per profiler step its time, GPU busy / idle and the
computation / communication split, its collectives (each with the key that matches it across ranks,
its arrival time, duration and message size), its top kernels and its GPU idle time by cause. Every
figure comes from the trace layer's one definition of it (views.steps, views.temporal_breakdown,
comm.rank_breakdown, views.idle_time; classify.is_comm via comm_args). A summary is a few hundred
bytes per step and per collective, whatever the trace's size, and carries no path of the machine
it ran on beyond the file it read, so the same function runs in a local process or on a Dask worker.

``rank_detail(path, ...)`` is the second, optional task of a picked rank: its timeline (aligned on
its first profiler step) and one step's critical path.

The functions are pure: the same file gives the same summary, wherever it runs (``worker`` holds the
only figures that depend on where: process, host, seconds and peak RSS).
"""

from __future__ import annotations

import os
import socket
import statistics
import time

import numpy as np

from diagnostics.results import to_plain
from diagnostics.trace import classify
from diagnostics.trace.comm import event_bytes, rank_breakdown
from diagnostics.trace.comm_args import named_events
from diagnostics.trace.ingest import load_trace
from diagnostics.trace.timeline import timeline_data
from diagnostics.trace.breakdowns import _gpu_frame, gpu_step_breakdown, idle_time, steps as step_table

#: Bumped when a summary's content changes: cached summaries of another version are misses.
SUMMARY_VERSION = 1
#: Top-level trace keys that must agree between one run's ranks (versions of the recording stack).
VERSION_KEYS = ("schemaVersion", "cupti_version", "cuda_runtime_version", "cuda_driver_version",
                "hip_version", "rocm_version")
#: A first timestamp at least this large (µs) is an epoch time (after 2001): wall clock as it is.
EPOCH_US_MIN = 1e15
#: Kernels kept per rank (by summed GPU time).
TOP_KERNELS = 20
def _median(values) -> float | None:
    values = [v for v in values if v is not None and np.isfinite(v)]
    return float(statistics.median(values)) if values else None


def _versions(meta: dict) -> dict:
    out = {k: meta[k] for k in VERSION_KEYS if meta.get(k) is not None}
    info = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    for k in ("backend", "nccl_version"):
        if info.get(k) is not None:
            out[k] = info[k]
    props = meta.get("deviceProperties")
    if isinstance(props, list) and props:
        out["devices"] = ", ".join(sorted(str(d.get("name", "?")) for d in props if isinstance(d, dict)))
    return out


def _clock(trace) -> dict:
    """The wall clock of the trace's first event, in ns (an int: exact), and where it comes from.

    Kineto writes times relative to baseTimeNanoseconds (wall = base + ts); a trace whose times are
    already epoch µs is read as it is; otherwise the times are the trace's own (ranks of one machine
    share them, ranks of several may not: the reduce estimates each rank's offset from its collectives)."""
    base = trace.meta.get("baseTimeNanoseconds")
    origin = float(trace.origin_us)
    if origin >= EPOCH_US_MIN:
        return {"origin_ns": int(round(origin * 1e3)), "source": "epoch timestamps"}
    if isinstance(base, (int, float)) and base > 0:
        return {"origin_ns": int(base) + int(round(origin * 1e3)), "source": "baseTimeNanoseconds"}
    return {"origin_ns": int(round(origin * 1e3)), "source": "trace timestamps"}


def worker_stats(t0: float) -> dict:
    """Where a task ran and what it cost: host, process, seconds, the process's peak RSS so far."""
    peak = None
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if peak is None:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"host": socket.gethostname(), "pid": os.getpid(), "seconds": time.perf_counter() - t0,
            "peak_rss_bytes": int(peak)}


# ---- steps -----------------------------------------------------------------------------------

def _steps(trace, gpu_rows: list, comm: dict) -> dict:
    """Per profiler step (start order): number, start (µs from the trace's first event), time, GPU busy /
    idle over its GPU window (views.gpu_step_breakdown: temporal_breakdown's GPU part), the computation / communication split
    (comm.rank_breakdown); None where not counted (a CPU-only trace has no GPU figure)."""
    st = step_table(trace)
    number = [int(s) for s in st["step"]]
    gpu = {r["step"]: r for r in gpu_rows}
    split = {s["step"]: s for s in comm["steps"]} if number else {}

    def pick(table, f):
        return [f(table[s]) if s in table else None for s in number]

    return {
        "step": number, "start_us": [float(v) for v in st["start_us"]], "dur_us": [float(v) for v in st["dur_us"]],
        "gpu_busy_us": pick(gpu, lambda r: float(r["window_us"] - r["idle_us"])),
        "gpu_idle_us": pick(gpu, lambda r: float(r["idle_us"])),
        "compute_us": pick(split, lambda r: r["compute_ms"] * 1e3),
        "comm_us": pick(split, lambda r: r["comm_ms"] * 1e3),
        "overlap_us": pick(split, lambda r: r["overlap_ms"] * 1e3),
        "exposed_comm_us": pick(split, lambda r: r["exposed_comm_ms"] * 1e3),
        "busy_us": pick(split, lambda r: r["busy_ms"] * 1e3),
    }


def _table_row(steps: dict, gpu_rows: list, comm: dict) -> dict:
    """The per-rank table's figures (medians per profiler step, ms), as the Ranks view shows them."""
    step_ms = [x / 1e3 for x in steps["dur_us"]]
    windows = sum(r["window_us"] for r in gpu_rows)
    split = comm["steps"]
    return {
        "steps": len(step_ms),
        "step_ms_median": _median(step_ms),
        "step_ms_max": max(step_ms) if step_ms else None,
        "gpu_busy_ms_median": _median([(r["window_us"] - r["idle_us"]) / 1e3 for r in gpu_rows]) if gpu_rows else None,
        "gpu_idle_ms_median": _median([r["idle_us"] / 1e3 for r in gpu_rows]) if gpu_rows else None,
        "gpu_idle_pct": 100.0 * sum(r["idle_us"] for r in gpu_rows) / windows if gpu_rows and windows > 0 else None,
        "on_gpu": comm["on_gpu"],
        "compute_ms_median": _median([s["compute_ms"] for s in split]),
        "comm_ms_median": _median([s["comm_ms"] for s in split]),
        "overlap_ms_median": _median([s["overlap_ms"] for s in split]),
        "exposed_comm_ms_median": _median([s["exposed_comm_ms"] for s in split]),
        "busy_ms_median": _median([s["busy_ms"] for s in split]),
    }


# ---- collectives -----------------------------------------------------------------------------

def _own_rows(trace) -> tuple[np.ndarray, str]:
    """The rows standing for each collective on this rank (by classify's rules and Kineto's categories),
    and which they are: the transfer itself where the trace has it, the communication kernels of a GPU
    trace, or the collective annotations of a CPU one (gloo:all_reduce runs on gloo's own thread);
    else the host collective calls (c10d ops, record_param_comms)."""
    comm = classify.comm_mask(trace)
    kern = comm & classify.kernel_mask(trace)
    if kern.any():
        return kern, "communication kernels"
    host = comm & classify.host_mask(trace)
    notes = host & trace.cat_mask(classify.USER_ANNOTATION_CATS)
    if notes.any():
        return notes, "collective annotations"
    return host & trace.cat_mask(classify.HOST_OP_CATS), "host collective calls"


def _own_events(events: list[dict], what: str) -> list[dict]:
    """Host collective calls: those carrying a sequence number when some do (record_param_comms
    inside the c10d op), so that one collective is one event."""
    if what == "host collective calls":
        numbered = [e for e in events if isinstance((e.get("args") or {}).get("Seq"), int)]
        return numbered or events
    return events


def _collectives(trace, path: str, steps: dict) -> dict:
    """This rank's collectives, columnar, in start order: key (matches the same collective on every
    rank: "<process group>#<Seq>" where the trace records sequence numbers, else "<family>#<k>", the
    k-th of its family on this rank), name, family, step, start (µs from the trace's first event),
    duration, message bytes (-1: not recorded), group size (-1: not recorded)."""
    rows, what = _own_rows(trace)
    names = trace.labels("name")[np.unique(trace.codes("name")[rows])].tolist()
    events, unreadable = named_events(path, names)
    own = _own_events(events, what)
    own.sort(key=lambda e: float(e["ts"]))
    origin = float(trace.origin_us)
    kth: dict = {}
    cols: dict = {k: [] for k in ("key", "name", "family", "step", "start_us", "dur_us", "bytes", "group_size")}
    by_seq = bool(own) and all(isinstance((e.get("args") or {}).get("Seq"), int) for e in own)
    lo = np.asarray(steps["start_us"], dtype=float)
    hi = lo + np.asarray(steps["dur_us"], dtype=float)
    numbers = steps["step"]
    for e in own:
        args = e.get("args") or {}
        fam = classify.collective_op(str(args.get("Collective name") or e["name"]))
        if by_seq:
            key = f"{args.get('Process Group Name', '')}#{args['Seq']}"
        else:
            k = kth.get(fam, 0)
            kth[fam] = k + 1
            key = f"{fam}#{k}"
        start = float(e["ts"]) - origin
        i = int(np.searchsorted(lo, start, side="right")) - 1
        step = numbers[i] if 0 <= i < len(numbers) and start < hi[i] else -1
        b = event_bytes(args)
        size = args.get("Group size")
        cols["key"].append(key)
        cols["name"].append(e["name"])
        cols["family"].append(fam)
        cols["step"].append(int(step))
        cols["start_us"].append(start)
        cols["dur_us"].append(float(e["dur"]))
        cols["bytes"].append(int(b) if b is not None else -1)
        cols["group_size"].append(int(size) if isinstance(size, int) else -1)
    return {**cols, "events": what, "matched_by": "sequence number" if by_seq else "order",
            "unreadable": unreadable}


def _kernels(trace) -> list[dict]:
    g = _gpu_frame(trace)
    if not len(g):
        return []
    by = g.groupby("name").agg(calls=("dur_us", "size"), total_us=("dur_us", "sum"))
    by = by.sort_values("total_us", ascending=False).head(TOP_KERNELS).reset_index()
    return [{"name": str(r.name), "calls": int(r.calls), "total_us": float(r.total_us)} for r in by.itertuples()]


def _idle(trace) -> dict | None:
    rows = idle_time(trace).streams
    if not rows:
        return None
    return {k: float(sum(getattr(r, k) for r in rows)) for k in ("window_us", "busy_us", "idle_us", "host_wait_us",
                                                         "kernel_wait_us", "other_wait_us")} | {"streams": len(rows)}


# ---- the map ---------------------------------------------------------------------------------

def rank_summary(path: str, comm_kernels: str = "") -> dict:
    """One rank's summary (see the module docstring); ``comm_kernels``: the user's pattern for in-house
    communication kernels (classify.use_comm_kernels). Raises TraceError for a file that is not a trace."""
    t0 = time.perf_counter()
    path = str(path)
    trace = load_trace(path)
    classify.use_comm_kernels(trace, comm_kernels)
    meta = trace.meta
    info = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    clock = _clock(trace)
    gpu_rows = gpu_step_breakdown(trace)["gpu"]
    comm = rank_breakdown(trace, with_calls=False)
    steps = _steps(trace, gpu_rows, comm)
    has_steps = bool(steps["step"])
    source = clock["source"]
    out = {
        "version": SUMMARY_VERSION,
        "file": path,
        "dist_rank": trace.rank,
        "world_size": info.get("world_size") if isinstance(info.get("world_size"), int) else None,
        "pg_config": info.get("pg_config") if "pg_config" in info else None,
        "pg_count": info.get("pg_count"),
        "versions": _versions(meta),
        "host_name": meta["host_name"] if isinstance(meta.get("host_name"), str) else None,
        "clock": clock,
        "start_s": clock["origin_ns"] / 1e9 if source != "trace timestamps" else None,
        "step_numbers": sorted(steps["step"]),
        "aligned_on": "first profiler step" if has_steps else "first event",
        "events": len(trace.events),
        "bytes": trace.n_bytes,
        "warnings": list(trace.warnings)[:5],
        **_table_row(steps, gpu_rows, comm),
        "step_series": steps,
        "collectives": _collectives(trace, path, steps),
        "kernels": _kernels(trace),
        "idle": _idle(trace),
    }
    del trace, comm
    out["worker"] = worker_stats(t0)
    return out


def rank_detail(path: str, timeline_events: int | None = None, critical_path_step: int | None = None,
                critical_path: bool = False, cache_root: str | None = None, comm_kernels: str = "") -> dict:
    """A picked rank's timeline (at most ``timeline_events`` bars, times from its first profiler step)
    and, when asked, one step's critical path (the longest complete step unless ``critical_path_step``),
    compact: its time by kind, its longest events, the what-ifs."""
    from diagnostics.trace.cache import cached_load

    t0 = time.perf_counter()
    trace, _ = cached_load(path, cache_root)
    classify.use_comm_kernels(trace, comm_kernels)
    out: dict = {"file": str(path)}
    if timeline_events:
        st = step_table(trace)
        align = float(st["start_us"].min()) if len(st) else 0.0
        tl = to_plain(timeline_data(trace, max_events=timeline_events))   # plain: it crosses to the parent
        for e in tl["events"]:
            e["start_us"] -= align
        tl["t0"] -= align
        tl["t1"] -= align
        out["timeline"] = tl
    if critical_path:
        out["critical_path"] = _critical_path(trace, critical_path_step)
    out["worker"] = worker_stats(t0)
    return out


#: The critical path's longest events kept for a rank.
PATH_ROWS = 20


def _critical_path(trace, step: int | None) -> dict:
    from diagnostics.trace.critical_path import critical_path, step_graph
    from diagnostics.trace.errors import TraceError

    try:
        cp = to_plain(critical_path(trace, model=step_graph(trace, step)))   # plain: it crosses to the parent
    except TraceError as e:
        return {"available": False, "reason": str(e)}
    except Exception as e:  # noqa: BLE001 - the rest of the multi-rank analysis stands without it
        return {"available": False, "reason": f"the critical path could not be computed ({type(e).__name__}: {e})"}
    longest = sorted(cp["path"], key=lambda r: -r["on_path_us"])[:PATH_ROWS]
    keep = ("step", "chosen_as", "step_us", "host_span_us", "length_us", "events", "path_events", "by_kind", "what_if",
            "incomplete_steps")
    return {"available": True, **{k: cp[k] for k in keep if k in cp}, "longest": longest}
