"""Views computed from one exported Chrome/Kineto trace (the dict `export_chrome_trace` writes).

Pure functions over the trace's ``traceEvents``: the per-step breakdown from record_function
ranges, the TensorBoard plugin's device split, per-module forward/backward time, the GPU kernel
table and a downsampled timeline. They return plain records (lists of dicts), times in ms.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from diagnostics.trace.classify import (
    KERNEL_CATS, MEMCPY_CATS, MEMSET_CATS, MODULE_PREFIX, ROOT_MODULE as ROOT, RUNTIME_CATS, STEP_PHASES, STEP_RE,
    GPU_CATS as DEVICE_CATS, uses_tensor_cores,
)

CPU_CATS = frozenset({"cpu_op", "user_annotation", "python_function"})

#: The TensorBoard plugin's step split, in priority order: a moment covered by a kernel counts as
#: kernel even when the CPU is also busy; "other" is what no event covers.
SPLIT_CATEGORIES = ("kernel", "memcpy", "memset", "runtime", "cpu_exec", "other")

#: Timeline default: at most this many events drawn; the longest are kept.
TIMELINE_MAX_EVENTS = 4000
TIMELINE_MAX_DEPTH = 24


def complete_events(trace: dict) -> list[dict]:
    """The 'X' (complete) events with a duration, deduplicated (Kineto can write a step twice)."""
    seen = set()
    out = []
    for e in trace.get("traceEvents", []):
        if e.get("ph") != "X" or "dur" not in e or e.get("cat") == "Trace":
            continue
        key = (e.get("name"), e.get("ts"), e.get("dur"), e.get("pid"), e.get("tid"), e.get("cat"))
        if key in seen:
            continue
        seen.add(key)
        out.append(e)
    return out


def _by_thread(events: list[dict]) -> dict:
    lanes = defaultdict(list)
    for e in events:
        lanes[(e.get("pid"), e.get("tid"))].append(e)
    for evs in lanes.values():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
    return lanes


def nest(events: list[dict]) -> list[int]:
    """Parent index (or -1) of each event of ONE thread, sorted by (ts, -dur): containment nesting."""
    parents = [-1] * len(events)
    stack: list[int] = []
    for i, e in enumerate(events):
        end = e["ts"] + e["dur"]
        while stack:
            top = events[stack[-1]]
            if e["ts"] >= top["ts"] + top["dur"] or end > top["ts"] + top["dur"] + 1e-3:
                stack.pop()
            else:
                break
        parents[i] = stack[-1] if stack else -1
        stack.append(i)
    return parents


def profiler_steps(events: list[dict]) -> list[dict]:
    """The ProfilerStep#N ranges, in order: {'step', 'ts', 'dur', 'pid', 'tid'}."""
    steps = []
    for e in events:
        m = STEP_RE.match(e.get("name", ""))
        if m and e.get("cat") in ("user_annotation", "cpu_op"):
            steps.append({"step": int(m.group(1)), "ts": e["ts"], "dur": e["dur"], "pid": e.get("pid"),
                          "tid": e.get("tid")})
    steps.sort(key=lambda s: s["ts"])
    return steps


def step_breakdown(events: list[dict]) -> list[dict]:
    """Per step: its time and the time in each record_function phase; 'other_ms' is the rest.

    Phases are the top-most ranges named in STEP_PHASES on the step's thread and inside the step's
    time range; the columns add up to ``step_ms`` (other is clamped at zero).
    """
    steps = profiler_steps(events)
    phase_events = [e for e in events if e.get("name") in STEP_PHASES and e.get("cat") == "user_annotation"]
    rows = []
    for s in steps:
        start, end = s["ts"], s["ts"] + s["dur"]
        row = {"step": s["step"], "step_ms": s["dur"] / 1e3}
        for phase in STEP_PHASES:
            row[f"{phase}_ms"] = 0.0
        for e in phase_events:
            if e.get("tid") == s["tid"] and e.get("pid") == s["pid"] and e["ts"] >= start and e["ts"] + e["dur"] <= end + 1e-3:
                row[f"{e['name']}_ms"] += e["dur"] / 1e3
        row["other_ms"] = max(0.0, row["step_ms"] - sum(row[f"{p}_ms"] for p in STEP_PHASES))
        rows.append(row)
    return rows


def _category(cat: str) -> str | None:
    cat = (cat or "").lower()
    if cat in KERNEL_CATS:
        return "kernel"
    if cat in MEMCPY_CATS:
        return "memcpy"
    if cat in MEMSET_CATS:
        return "memset"
    if cat in RUNTIME_CATS:
        return "runtime"
    if cat in ("cpu_op", "python_function"):
        return "cpu_exec"
    return None


def device_split(events: list[dict]) -> list[dict]:
    """The TensorBoard plugin's step split: kernel / memcpy / memset / runtime / cpu_exec / other (ms).

    Each moment of a step's window goes to the highest-priority category covering it (see
    SPLIT_CATEGORIES). A step's window runs from its start to the next step's start, the last one
    to the later of its end and the end of the last device event, so GPU work that lags its
    launching step still lands in a step. The columns add up to ``window_ms``.
    """
    steps = profiler_steps(events)
    if not steps:
        return []
    intervals = {c: [] for c in SPLIT_CATEGORIES[:-1]}
    last_device_end = None
    for e in events:
        c = _category(e.get("cat"))
        if c is None:
            continue
        intervals[c].append((e["ts"], e["ts"] + e["dur"]))
        if c in ("kernel", "memcpy", "memset"):
            last_device_end = max(last_device_end or 0.0, e["ts"] + e["dur"])
    arrays = {c: np.array(v, dtype=float).reshape(-1, 2) for c, v in intervals.items()}
    rows = []
    for i, s in enumerate(steps):
        start = s["ts"]
        if i + 1 < len(steps):
            end = steps[i + 1]["ts"]
        else:
            end = max(s["ts"] + s["dur"], last_device_end or 0.0)
        row = {"step": s["step"], "window_ms": (end - start) / 1e3}
        row.update(_split_window(arrays, start, end))
        rows.append(row)
    return rows


def _split_window(arrays: dict, start: float, end: float) -> dict:
    clipped = {}
    bounds = [start, end]
    for c, a in arrays.items():
        if len(a):
            a = a[(a[:, 1] > start) & (a[:, 0] < end)]
            a = np.clip(a, start, end)
        clipped[c] = a
        bounds.extend(a.ravel().tolist())
    edges = np.unique(np.array(bounds, dtype=float))
    seg = np.diff(edges)
    taken = np.zeros(len(seg), dtype=bool)
    out = {}
    for c in SPLIT_CATEGORIES[:-1]:
        a = clipped[c]
        cover = np.zeros(len(edges), dtype=int)
        if len(a):
            np.add.at(cover, np.searchsorted(edges, a[:, 0]), 1)
            np.add.at(cover, np.searchsorted(edges, a[:, 1]), -1)
        covered = np.cumsum(cover)[:-1] > 0
        mine = covered & ~taken
        out[f"{c}_ms"] = float(seg[mine].sum()) / 1e3
        taken |= covered
    out["other_ms"] = float(seg[~taken].sum()) / 1e3
    return out


def module_times(events: list[dict], module_types: dict[str, str] | None = None) -> list[dict]:
    """Per module (qualified name): forward time from its ``module::`` ranges and backward time.

    Backward: each autograd ``evaluate_function`` event carries the sequence number of the forward
    op that created its node; that op's innermost enclosing module range owns the backward time.
    ``*_self_ms`` excludes child modules; inclusive times sum the subtree. Returns records sorted
    by name with 'parent' (None for the root) for a tree chart.
    """
    module_types = module_types or {}
    fwd_total: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    seq_owner: dict[int, str] = {}
    bwd_self: dict[str, float] = defaultdict(float)
    unattributed = 0.0
    lanes = _by_thread([e for e in events if e.get("cat") in CPU_CATS])
    backward_events = []
    for evs in lanes.values():
        parents = nest(evs)
        owner: list[str | None] = [None] * len(evs)
        for i, e in enumerate(evs):
            name = e.get("name", "")
            p = parents[i]
            if name.startswith(MODULE_PREFIX) and e.get("cat") == "user_annotation":
                mod = name[len(MODULE_PREFIX):]
                owner[i] = mod
                fwd_total[mod] += e["dur"] / 1e3
                calls[mod] += 1
            else:
                owner[i] = owner[p] if p >= 0 else None
            args = e.get("args") or {}
            seq = args.get("Sequence number")
            if name.startswith("autograd::engine::evaluate_function"):
                # Only the outermost evaluate_function owns its time (nested ones are inside it).
                if p < 0 or not evs[p].get("name", "").startswith("autograd::engine::evaluate_function"):
                    backward_events.append((seq, e["dur"] / 1e3))
            elif seq is not None and not args.get("Fwd thread id") and owner[i] is not None:
                seq_owner.setdefault(int(seq), owner[i])
    for seq, dur in backward_events:
        mod = seq_owner.get(int(seq)) if seq is not None else None
        if mod is None:
            unattributed += dur
        else:
            bwd_self[mod] += dur
    names = set(fwd_total) | set(bwd_self)
    # Fill in ancestors that never ran a range of their own (e.g. containers), so the tree is whole.
    for n in list(names):
        while n != ROOT:
            n = _parent(n)
            names.add(n)
    children: dict[str, list[str]] = defaultdict(list)
    for n in names:
        if n != ROOT:
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
            "name": n, "parent": None if n == ROOT else _parent(n), "type": module_types.get(n, ""),
            "calls": calls.get(n, 0), "forward_ms": fwd, "forward_self_ms": max(0.0, fwd - kids_fwd),
            "backward_ms": bwd_incl(n), "backward_self_ms": bwd_self.get(n, 0.0),
        })
    if rows and unattributed:
        rows.append({"name": "(backward, no module)", "parent": None, "type": "", "calls": 0, "forward_ms": 0.0,
                     "forward_self_ms": 0.0, "backward_ms": unattributed, "backward_self_ms": unattributed})
    return rows


def _parent(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name else ROOT


def _sort_key(name: str):
    return (0, ()) if name == ROOT else (1, tuple(int(p) if p.isdigit() else p for p in name.split(".")))


def kernel_table(events: list[dict]) -> list[dict]:
    """GPU kernels grouped by name: calls, total / mean / max / min µs, grid, block, Tensor Cores."""
    groups: dict[str, dict] = {}
    for e in events:
        if (e.get("cat") or "").lower() not in KERNEL_CATS:
            continue
        name = e.get("name", "")
        args = e.get("args") or {}
        g = groups.get(name)
        if g is None:
            g = groups[name] = {"name": name, "calls": 0, "total_us": 0.0, "max_us": 0.0, "min_us": float("inf"),
                                "grid": _dims(args.get("grid")), "block": _dims(args.get("block")),
                                "registers_per_thread": args.get("registers per thread"),
                                "occupancy_pct": args.get("est. achieved occupancy %"),
                                "tensor_cores": uses_tensor_cores(name)}
        g["calls"] += 1
        g["total_us"] += e["dur"]
        g["max_us"] = max(g["max_us"], e["dur"])
        g["min_us"] = min(g["min_us"], e["dur"])
    total = sum(g["total_us"] for g in groups.values()) or 1.0
    rows = []
    for g in sorted(groups.values(), key=lambda g: -g["total_us"]):
        g["mean_us"] = g["total_us"] / g["calls"]
        g["pct_of_kernel_time"] = 100.0 * g["total_us"] / total
        rows.append(g)
    return rows


def _dims(v) -> str | None:
    if v is None:
        return None
    if isinstance(v, (list, tuple)):
        return "×".join(str(int(x)) for x in v)
    return str(v)


def _lane_name(e: dict, thread_names: dict) -> str:
    cat = (e.get("cat") or "").lower()
    args = e.get("args") or {}
    if cat in DEVICE_CATS:
        return f"GPU {args.get('device', e.get('pid'))} · stream {args.get('stream', e.get('tid'))}"
    return thread_names.get((e.get("pid"), e.get("tid"))) or f"CPU thread {e.get('tid')}"


def timeline(trace: dict, max_events: int = TIMELINE_MAX_EVENTS, max_depth: int = TIMELINE_MAX_DEPTH) -> dict:
    """A downsampled timeline: a lane per CPU thread / GPU stream; each event's lane, depth, start, duration.

    When there are more events than ``max_events`` the longest are kept, after each lane's own
    longest share (so a stream of short kernels still shows), and everything deeper than
    ``max_depth`` is dropped first; a large trace thus still draws quickly. ``total_events``
    and ``shown_events`` say how much was left out. Times are ms from the first event.
    """
    events = complete_events(trace)
    thread_names = {}
    for e in trace.get("traceEvents", []):
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            thread_names[(e.get("pid"), e.get("tid"))] = (e.get("args") or {}).get("name")
    if not events:
        return {"events": [], "lanes": [], "total_events": 0, "shown_events": 0, "span_ms": 0.0}
    origin = min(e["ts"] for e in events)
    span = max(e["ts"] + e["dur"] for e in events) - origin
    rows = []
    for evs in _by_thread(events).values():
        parents = nest(evs)
        depth = [0] * len(evs)
        for i, p in enumerate(parents):
            depth[i] = depth[p] + 1 if p >= 0 else 0
        for i, e in enumerate(evs):
            rows.append({"lane": _lane_name(e, thread_names), "name": e.get("name", ""), "cat": e.get("cat") or "",
                         "start_ms": (e["ts"] - origin) / 1e3, "dur_ms": e["dur"] / 1e3, "depth": depth[i]})
    total = len(rows)
    kept = [r for r in rows if r["depth"] <= max_depth]
    deeper = total - len(kept)
    if len(kept) > max_events:
        kept = _downsample(kept, max_events)
    kept.sort(key=lambda r: (r["lane"], r["start_ms"]))
    lanes = sorted({r["lane"] for r in kept}, key=lambda l: (l.startswith("GPU"), l))
    return {"events": kept, "lanes": lanes, "total_events": total, "shown_events": len(kept), "span_ms": span / 1e3,
            "deeper": deeper, "builder": "profiler_trace.timeline"}


def _downsample(rows: list[dict], max_events: int) -> list[dict]:
    """Each lane keeps its longest max_events / (4 x lanes) events; the rest of the budget goes to
    the longest events overall."""
    by_lane = defaultdict(list)
    for r in rows:
        by_lane[r["lane"]].append(r)
    share = max(1, max_events // (4 * len(by_lane)))
    chosen = set()
    for lane_rows in by_lane.values():
        lane_rows.sort(key=lambda r: -r["dur_ms"])
        chosen.update(id(r) for r in lane_rows[:share])
    rest = sorted((r for r in rows if id(r) not in chosen), key=lambda r: -r["dur_ms"])
    budget = max(0, max_events - len(chosen))
    chosen.update(id(r) for r in rest[:budget])
    return [r for r in rows if id(r) in chosen]
