"""HTA-class analyses of a loaded Trace. Each view returns its typed record (records/breakdowns.py); the
helpers other views build on (steps, step_spans, gpu_step_attribution, gpu_step_breakdown) frames and dicts.

summary: duration, steps, events by category, threads, streams, memory peaks (overview.py: on the trace's
columns, without pandas, the first answer; its step spans and GPU kinds are the frames' here).
temporal_breakdown: per ProfilerStep, GPU time by kind (exclusive, priority compute >
communication > memcpy > memset, the rest idle) over GPU windows that partition the GPU timeline,
GPU work put in the step that launched it (gpu_step_attribution), and host self time by operator
family. top_operators: host operators and GPU kernels by time. idle_time: gaps between GPU work on
each stream, with their cause. (launch_stats, on the same GPU frame: launches.py.)
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diagnostics.trace import intervals as iv
from diagnostics.trace.classify import (
    FRAME_CATS, HOST_OP_CATS, LAUNCH_FLOW_CATS, RUNTIME_CATS, STEP_RE, gpu_work_mask, host_mask, host_op_mask, op_family,
)
from diagnostics.trace.model import Trace
# The Summary, the step spans and the GPU work's kinds, on the columns without pandas (the first answer, #42);
# summary is this module's view too.
from diagnostics.trace.overview import KIND_PRIORITY, gpu_kinds, gpu_places, step_rows, summary  # noqa: F401
from diagnostics.trace.records.breakdowns import (
    Attribution, CpuGroup, GpuStep, IdleStream, IdleTime, Kernel, Operator, StepWindow, TemporalBreakdown, TopOperators,
)

# A gap shorter than this between two GPU events whose launch was already queued is put down
# to launch overhead ("kernel wait"); a longer one to syncs/dependencies ("other wait").
KERNEL_WAIT_MAX_US = 5.0

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
    """steps() with the event row of each step's span (its thread: trace.lane_keys()[row]): overview.step_rows
    as a frame."""
    if "steps" in trace._cache:
        return trace._cache["steps"]
    st = step_rows(trace)
    df = pd.DataFrame({k: st[k] for k in ("step", "name", "start_us", "dur_us", "row")})
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
    """GPU kernels/memcpys/memsets with kind, launch call and times.

    The launch call of a GPU event is the runtime event with its correlation id; failing that, the
    one its "ac2g" flow arrow starts at (``launch_by``: "correlation", "flow" or None).
    """
    if "gpu" in trace._cache:
        return trace._cache["gpu"]
    ev = trace.events
    rows = np.flatnonzero(gpu_work_mask(trace))
    device, stream = gpu_places(trace, rows)
    g = pd.DataFrame({
        "row": rows, "name": trace.strings("name", rows), "kind": gpu_kinds(trace, rows),
        "start_us": ev["ts"].to_numpy()[rows], "dur_us": ev["dur"].to_numpy()[rows],
        "device": device, "stream": stream, "corr": ev["corr"].to_numpy()[rows]})
    g["end_us"] = g["start_us"] + g["dur_us"]
    launch = _runtime_calls(trace)
    by_corr = launch[launch["corr"] >= 0].drop_duplicates("corr")
    g = g.merge(by_corr.drop(columns="lane"), on="corr", how="left")
    g["launch_by"] = np.where(g["launch_start_us"].notna(), "correlation", None)
    _link_by_flow(trace, g, launch)
    g = g.sort_values("start_us", kind="stable").reset_index(drop=True)
    trace._cache["gpu"] = g
    return g


def _runtime_calls(trace: Trace) -> pd.DataFrame:
    """Runtime calls (RUNTIME_CATS duration events): corr, name, start, duration, lane."""
    ev = trace.events
    rm = trace.complete_mask() & trace.cat_mask(RUNTIME_CATS)
    return pd.DataFrame({"corr": ev["corr"].to_numpy()[rm],
                         "launch_name": trace.strings("name", rm),
                         "launch_start_us": ev["ts"].to_numpy()[rm],
                         "launch_dur_us": ev["dur"].to_numpy()[rm],
                         "lane": trace.lane_keys()[rm]})


def _link_by_flow(trace: Trace, g: pd.DataFrame, launch: pd.DataFrame) -> None:
    """Fill the launch columns of GPU events without a correlated runtime call from "ac2g" flows.

    Kineto writes a flow start ("s") at the launch call's start on its thread and a flow end ("f")
    at the GPU event's start on its stream, both with the correlation id as the flow id. The call is
    the runtime event on the start's thread that begins there; without one, the flow start's time
    stands for the launch (name and duration unknown).
    """
    todo = np.flatnonzero(g["launch_start_us"].isna().to_numpy())
    if not todo.size:
        return
    ev = trace.events
    flow = trace.cat_mask(LAUNCH_FLOW_CATS) & (ev["flow_id"].to_numpy() >= 0)
    ph = trace.strings("ph")
    ends, starts = np.flatnonzero(flow & (ph == "f")), np.flatnonzero(flow & (ph == "s"))
    if not ends.size or not starts.size:
        return
    ts, lane, fid = ev["ts"].to_numpy(), trace.lane_keys(), ev["flow_id"].to_numpy()
    rows = g["row"].to_numpy()[todo]
    want = pd.DataFrame({"i": todo, "lane": lane[rows], "ts": ts[rows]})
    fin = pd.DataFrame({"lane": lane[ends], "ts": ts[ends], "fid": fid[ends]}).drop_duplicates(["lane", "ts"])
    src = pd.DataFrame({"fid": fid[starts], "lane": lane[starts], "launch_start_us": ts[starts]}
                       ).drop_duplicates("fid")
    calls = launch[["lane", "launch_start_us", "launch_name", "launch_dur_us"]].drop_duplicates(
        ["lane", "launch_start_us"])
    hit = want.merge(fin, on=["lane", "ts"]).drop(columns=["lane", "ts"]).merge(src, on="fid")
    if not len(hit):
        return
    hit = hit.merge(calls, on=["lane", "launch_start_us"], how="left")
    i = hit["i"].to_numpy()
    for c in ("launch_name", "launch_start_us", "launch_dur_us"):
        col = g[c].to_numpy(copy=True).astype(object if c == "launch_name" else float)
        col[i] = hit[c].to_numpy()
        g[c] = col
    by = g["launch_by"].to_numpy(copy=True).astype(object)
    by[i] = "flow"
    g["launch_by"] = by




# ---- analyses --------------------------------------------------------------------------------

#: How a GPU event was put in a step, or why it is in none (gpu_step_attribution's "attributed").
ATTRIBUTION = ("launch", "time", "before_profiling", "outside_steps")


def gpu_step_attribution(trace: Trace) -> pd.DataFrame:
    """_gpu_frame with the step each GPU event belongs to: ``step_i`` (index into _step_windows,
    -1 for none) and ``attributed`` (one of ATTRIBUTION).

    * "launch": its launch call (by correlation id or ac2g flow, see _gpu_frame) starts inside the
      step's host span: the step whose CPU launched it, however late the GPU ran it.
    * "before_profiling": no launch call in the trace, and it starts before the first launch of
      any step (or its correlation id is below every runtime call's): queued before the profiler
      began, by a step that was not profiled.
    * "time": no launch call otherwise: the step whose GPU window (built from the launched events,
      see temporal_breakdown) holds its start; without any launched event, the step whose host
      span holds it.
    * "outside_steps": launched outside every step, or (by time) outside every window.
    """
    if "gpu_steps" in trace._cache:
        return trace._cache["gpu_steps"]
    win = _step_windows(trace)
    g = _gpu_frame(trace).copy()
    start = g["start_us"].to_numpy()
    launch = g["launch_start_us"].to_numpy()
    linked = np.isfinite(launch)
    step_i = np.full(len(g), -1, dtype=np.int64)
    step_i[linked] = _assign_step(launch[linked], win)
    how = np.where(linked, np.where(step_i >= 0, "launch", "outside_steps"), "").astype(object)
    by_launch = linked & (step_i >= 0)
    first = float(launch[by_launch].min()) if by_launch.any() else np.nan
    corr = g["corr"].to_numpy()
    rt = _runtime_calls(trace)["corr"].to_numpy()
    rt = rt[rt >= 0]
    early_corr = (corr >= 0) & (corr < rt.min()) if rt.size else np.zeros(len(g), dtype=bool)
    before = ~linked & ((by_launch.any() & (start < first)) | early_corr)
    how[before] = "before_profiling"
    rest = ~linked & ~before
    if rest.any():
        if by_launch.any():
            lo, hi = _gpu_windows(g[by_launch], step_i[by_launch], len(win))
            i = np.searchsorted(lo, start[rest], side="right") - 1
            ok = (i >= 0) & (start[rest] < hi[np.maximum(i, 0)])
            step_i[rest] = np.where(ok, i, -1)
        else:
            step_i[rest] = _assign_step(start[rest], win)
        how[rest] = np.where(step_i[rest] >= 0, "time", "outside_steps")
    g["step_i"], g["attributed"] = step_i, how
    trace._cache["gpu_steps"] = g
    return g


def _gpu_windows(g: pd.DataFrame, step_i: np.ndarray, n_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Per step (index into the step windows): the start and end of its GPU window. A window runs
    from the step's first GPU event start (the first window: from the first event's, whichever
    step's; never before an earlier step's) to the next such start, the last one to the end of the
    last event; a step with no GPU event gets an empty window where the next one starts. They
    partition the GPU timeline of the steps' work, however far the GPU lags the CPU."""
    lo = np.full(n_steps, np.nan)
    starts = g["start_us"].to_numpy()
    np.fmin.at(lo, step_i, starts)
    has = np.flatnonzero(np.isfinite(lo))
    if not has.size:
        return lo, lo.copy()
    lo[has[0]] = starts.min()   # the first window opens with the first event, whichever step's
    lo[has] = np.maximum.accumulate(lo[has])
    hi = np.full(n_steps, np.nan)
    hi[has[:-1]] = lo[has[1:]]
    hi[has[-1]] = max(g["end_us"].max(), lo[has[-1]])
    # searchsorted over lo needs it non-decreasing: empty steps take the next window's start (zero width).
    filled = pd.Series(lo).bfill().fillna(hi[has[-1]]).to_numpy()
    return filled, np.where(np.isfinite(hi), hi, filled)


def temporal_breakdown(trace: Trace) -> TemporalBreakdown:
    """Per step: GPU time by kind plus idle, and host self time by operator family/category.

    GPU events belong to steps as gpu_step_attribution says (the step whose CPU launched them).
    A step's GPU window runs from the start of its first GPU event to the start of the next step's
    first GPU event (the last step's: to the end of the last event), so the windows partition the
    GPU timeline and add up to its span, however far the GPU lags the CPU. In a window, busy time
    is the union of the steps' GPU work running there (with concurrent streams, the tail of one
    step's work can run in the next one's window), split by kind with overlaps given to the first
    kind in KIND_PRIORITY; idle is the window less busy. Per-step busy adds up to the steps' total
    GPU busy time. ``events`` counts the GPU events attributed to the step: each event in exactly
    one step. Work queued before profiling began, and work launched outside every step, is left
    out, counted in ``attribution`` and named in ``notes``.
    """
    win = _step_windows(trace)
    gpu = gpu_step_breakdown(trace)
    return TemporalBreakdown(steps=tuple(StepWindow(**r) for r in _records(win[["step", "start_us", "dur_us"]])),
                             gpu=tuple(GpuStep(**r) for r in gpu["gpu"]),
                             cpu=tuple(CpuGroup(**r) for r in _cpu_self_by_step(trace, win)),
                             kind_priority=KIND_PRIORITY, attribution=Attribution(**gpu["attribution"]),
                             notes=tuple(gpu["notes"]))


def gpu_step_breakdown(trace: Trace) -> dict:
    """temporal_breakdown's GPU part alone ({"gpu", "attribution", "notes"}): what a view that needs no
    host self time (the multi-rank summary) computes, without the host call nesting."""
    win = _step_windows(trace)
    g = gpu_step_attribution(trace)
    gpu_rows, notes = [], []
    counts = {a: int((g["attributed"] == a).sum()) for a in ATTRIBUTION}
    mine = g[g["step_i"] >= 0]
    if len(mine):
        lo, hi = _gpu_windows(mine, mine["step_i"].to_numpy(), len(win))
        n_events = np.bincount(mine["step_i"].to_numpy(), minlength=len(win))
        # Busy time of each kind not already covered by an earlier kind in KIND_PRIORITY: unions of
        # the kinds so far, measured window by window.
        acc = []
        for k in KIND_PRIORITY:
            sub = mine[mine["kind"].isin(KIND_PRIORITY[:KIND_PRIORITY.index(k) + 1])]
            acc.append(iv.union(sub["start_us"].to_numpy(), sub["end_us"].to_numpy()))
        have = np.flatnonzero(n_events)
        within = np.array([iv.lengths_within(u, lo[have], hi[have]) for u in acc]).T  # window x kinds so far
        numbers = win["step"].to_numpy()
        for i, covered in zip(have.tolist(), within.tolist()):
            a, b = float(lo[i]), float(hi[i])
            row = {"step": int(numbers[i]), "window_start_us": a, "window_us": b - a,
                   "events": int(n_events[i])}
            row.update({f"{k}_us": c - (covered[j - 1] if j else 0.0)
                        for j, (k, c) in enumerate(zip(KIND_PRIORITY, covered))})
            row["idle_us"] = (b - a) - covered[-1]
            gpu_rows.append(row)
    attribution = {f"{a}_events": counts[a] for a in ATTRIBUTION}
    for a in ("before_profiling", "outside_steps"):
        attribution[f"{a}_us"] = float(g.loc[g["attributed"] == a, "dur_us"].sum())
    if counts["time"]:
        notes.append(f"{counts['time']:,} GPU events have no launch call in the trace (no correlation "
                     "id or flow to one): put in the step whose GPU window holds their start")
    if counts["before_profiling"]:
        notes.append(f"{counts['before_profiling']:,} GPU events "
                     f"({attribution['before_profiling_us'] / 1e3:,.3f} ms) launched before profiling "
                     "began: left out of step figures")
    if counts["outside_steps"] and len(steps(trace)):
        notes.append(f"{counts['outside_steps']:,} GPU events ({attribution['outside_steps_us'] / 1e3:,.3f} ms) "
                     "launched outside every profiler step: left out of step figures")
    return {"gpu": gpu_rows, "attribution": attribution, "notes": notes}


def _cpu_self_by_step(trace: Trace, win: pd.DataFrame) -> list:
    """Host self time per step and group ("op: <family>" for operators, the category otherwise,
    STEP_SELF for the steps' own time), host events put in the step where they start: records sorted
    by step, then group. Summed on integer group codes (one label per distinct name or category)."""
    ev = trace.events
    nest = trace.nesting()
    cpu = np.flatnonzero(host_mask(trace))
    step_i = _assign_step(ev["ts"].to_numpy()[cpu], win)
    keep = step_i >= 0
    cpu, step_i = cpu[keep], step_i[keep]
    code, labels = _cpu_group_codes(trace)
    key = step_i.astype(np.int64) * len(labels) + code[cpu]
    uniq, inv = np.unique(key, return_inverse=True)
    self_us = nest["self_us"][cpu]
    sums = np.bincount(inv.ravel(), weights=np.nan_to_num(self_us), minlength=uniq.size)
    df = pd.DataFrame({"step": win["step"].to_numpy()[uniq // len(labels)],
                       "group": np.asarray(labels, dtype=object)[uniq % len(labels)], "self_us": sums})
    cpu_rows = df.groupby(["step", "group"], sort=True)["self_us"].sum().reset_index()
    return _records(cpu_rows)


def _cpu_group_codes(trace: Trace) -> tuple[np.ndarray, list]:
    """Per event a code into ``labels``: "op: <family>" for operators (by name), the category
    otherwise, STEP_SELF for steps), one label per code (names first, then categories)."""
    names = [str(n) for n in trace.events["name"].cat.categories]
    cats = trace.labels("cat").tolist()
    labels = ["op: " + op_family(n) for n in names] + [""] + cats + [STEP_SELF]
    n_names = len(names) + 1
    name_code = trace.codes("name").astype(np.int64)
    code = np.where(name_code >= 0, name_code, n_names - 1).astype(np.int64)
    not_op = ~trace.cat_mask(HOST_OP_CATS)
    cat_code = trace.codes("cat").astype(np.int64)
    code[not_op] = n_names + np.where(cat_code >= 0, cat_code, len(cats) - 1)[not_op]
    code[trace.name_mask(STEP_RE)] = len(labels) - 1
    return code, labels


def top_operators(trace: Trace, n: int) -> TopOperators:
    """Host operators (cpu_op, by self time) and GPU kernels (by time): calls, totals, shares."""
    ev = trace.events
    nest = trace.nesting()
    m = host_op_mask(trace)
    dup = repeated_calls(trace)
    # key_averages semantics: a call recorded twice (an only child named like its parent) is one
    # call; its self time stays with the name, so self_us sums every row.
    call_dur = np.where(dup, np.nan, ev["dur"].to_numpy())[m]
    codes = trace.codes("name")[m]
    uniq, inv = np.unique(codes, return_inverse=True)
    inv = inv.ravel()
    counted = ~np.isnan(call_dur)
    longest = np.full(uniq.size, -np.inf)
    np.maximum.at(longest, inv[counted], call_dur[counted])
    per = pd.DataFrame({"name": trace.labels("name")[uniq],
                        "calls": np.bincount(inv, weights=counted, minlength=uniq.size).astype(np.int64),
                        "total_us": np.bincount(inv, weights=np.where(counted, call_dur, 0.0), minlength=uniq.size),
                        "self_us": np.bincount(inv, weights=np.nan_to_num(nest["self_us"][m]), minlength=uniq.size),
                        "max_us": np.where(np.isfinite(longest), longest, np.nan)})
    # names of several codes with one string (rare) merge here, as a group-by of the strings would
    agg = per.groupby("name").agg(calls=("calls", "sum"), total_us=("total_us", "sum"),
                                  self_us=("self_us", "sum"), max_us=("max_us", "max"))
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
    return TopOperators(operators=tuple(Operator(**r) for r in _records(agg.head(n))),
                        kernels=tuple(Kernel(**r) for r in _records(kern.head(n))),
                        n_operators=int(len(agg)), n_kernels=int(len(kern)),
                        operator_self_us=float(agg["self_us"].sum()), kernel_us=float(kern["total_us"].sum()))


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


#: Rules of idle_time: ours, or HTA's get_idle_time_breakdown (strict comparisons, no launch call needed
#: for a kernel wait). HTA_KERNEL_WAIT_US is HTA's default consecutive_kernel_delay, 30: documented as
#: ns, but HTA 0.5.0 compares it with the trace's own timestamps, which Kineto writes in µs (checked
#: against HTA 0.5.0: with 30 µs and these rules the three categories agree to the µs on every stream).
IDLE_RULES = ("torchscope", "hta")
HTA_KERNEL_WAIT_US = 30.0


def idle_time(trace: Trace, kernel_wait_max_us: float = KERNEL_WAIT_MAX_US, rules: str = "torchscope") -> IdleTime:
    """Idle gaps between consecutive GPU events on each stream, by cause.

    For a gap before event k: "host wait" when k's launch call started after the previous event
    ended (the GPU waited for the CPU); else "kernel wait" when the gap is at most
    ``kernel_wait_max_us`` (launch overhead between queued work); else "other wait" (syncs, events,
    other streams). Events with no launch call found count as "other wait".
    ``rules="hta"``: HTA's comparisons, host wait when the call started strictly after, kernel
    wait when the gap is strictly below the threshold, with or without a launch call found.
    """
    if rules not in IDLE_RULES:
        raise ValueError(f"rules must be one of {', '.join(IDLE_RULES)}, got {rules!r}")
    hta = rules == "hta"
    g = _gpu_frame(trace)
    rows = []
    for (device, stream), sub in g.groupby(["device", "stream"]):
        sub = sub.sort_values("start_us")
        s, e = sub["start_us"].to_numpy(), sub["end_us"].to_numpy()
        prev_end = np.maximum.accumulate(e)[:-1]
        gap = np.maximum(s[1:] - prev_end, 0.0)
        launch = sub["launch_start_us"].to_numpy()[1:]
        if hta:
            host = np.isfinite(launch) & (launch > prev_end)
            kernel = ~host & (gap < kernel_wait_max_us)
        else:
            host = np.isfinite(launch) & (launch >= prev_end)
            kernel = ~host & np.isfinite(launch) & (gap <= kernel_wait_max_us)
        other = ~host & ~kernel
        window = float(e.max() - s.min()) if s.size else 0.0
        rows.append(IdleStream(
            device=device, stream=stream, events=int(s.size), window_us=window, busy_us=iv.length(iv.union(s, e)),
            idle_us=float(gap.sum()), gaps=int((gap > 0).sum()), host_wait_us=float(gap[host].sum()),
            kernel_wait_us=float(gap[kernel].sum()), other_wait_us=float(gap[other].sum())))
    return IdleTime(streams=tuple(rows), kernel_wait_max_us=float(kernel_wait_max_us), rules=rules)
