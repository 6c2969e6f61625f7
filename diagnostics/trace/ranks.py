"""Several ranks' traces side by side: analyse_ranks(paths) -> per-rank table, "not one run" problems,
one merged multi-rank timeline.

Each rank's trace is loaded and analysed in its own process (a ProcessPoolExecutor with the spawn
context, at most MAX_RANK_WORKERS / the CPU count workers); where processes cannot be started (a
daemonic parent, a refused fork) the ranks are analysed one after another, and ``mode`` says so.
Every figure comes from the trace layer's one definition of it: steps (views.steps), GPU busy / idle
per step (views.temporal_breakdown), computation / communication / overlap per step
(comm.rank_breakdown).

A rank's number is its trace's distributedInfo.rank, else the number in its file name ("rank3",
"worker_3"), else its place in the list; ``rank_source`` says which.

"Not one run" checks (each a named problem): ranks disagreeing on world_size or on their process-
group configs, a rank number twice, ranks of 0..world_size-1 missing, different trace schema /
CUDA / NCCL versions or devices, trace starts further apart than START_SKEW_MAX_S, different sets
of profiler step numbers, files that are not traces.

The merged timeline is every rank's timeline_data, its lanes named "rank N · <lane>" and ordered by
rank number (rank 2 before rank 10), each rank's times shifted so that its first profiler step
starts at 0 (a rank without steps: its first event), within one overall max_events budget.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import statistics
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from diagnostics.trace.comm import rank_breakdown
from diagnostics.trace.errors import TraceError
from diagnostics.trace.ingest import GZ_RATIO_GUESS, load_trace
from diagnostics.trace.timeline import MAX_EVENTS, natural_key, timeline_data
from diagnostics.trace.views import steps as step_table, temporal_breakdown

#: Processes analysing ranks at once, at most (and never more than the CPU count or the ranks).
MAX_RANK_WORKERS = 4
#: Memory one rank's analysis needs, per byte of decoded trace JSON (the columns, the per-step views);
#: the processes at once are bounded so that together they need at most half the available memory.
MEMORY_PER_JSON_BYTE = 1.5
#: Ranks whose traces start further apart than this (wall clock) are not one run's.
START_SKEW_MAX_S = 300.0
#: A first timestamp at least this large (µs) is an epoch time (after 2001): wall clock even without
#: baseTimeNanoseconds.
EPOCH_US_MIN = 1e15
#: Files a distributed run writes beside its rank traces (diagnostics.analyses.distributed): not traces.
NOT_TRACES = (".steps.json", ".status.json", "job.json")
#: The number in a file name that names its rank.
RANK_NAME_RE = re.compile(r"(?:rank|worker)[_\-.]?(\d+)", re.IGNORECASE)
#: Top-level trace keys that must agree between one run's ranks (versions of the recording stack).
VERSION_KEYS = ("schemaVersion", "cupti_version", "cuda_runtime_version", "cuda_driver_version",
                "hip_version", "rocm_version")
ALIGNMENT = "each rank's times start at its first profiler step (0 ms); a rank without steps at its first event"
#: The problem checks, in the order they are reported.
CHECKS = ("unreadable", "world_size", "pg_config", "duplicate_rank", "missing_rank", "versions",
          "start_time", "steps")


def rank_paths(paths) -> list[Path]:
    """Trace files from files and folders (a folder: its *.json / *.json.gz, in natural name order)."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    out: list[Path] = []
    for p in paths:
        p = Path(p).expanduser()
        if p.is_dir():
            found = [f for f in p.rglob("*") if f.is_file() and f.name.endswith((".json", ".json.gz"))
                     and not f.name.endswith(NOT_TRACES)]
            if not found:
                raise TraceError(f"{p}: the folder holds no trace files (*.json or *.json.gz)")
            out += sorted(found, key=lambda f: natural_key(str(f.relative_to(p))))
        elif p.is_file():
            out.append(p)
        else:
            raise TraceError(f"{p}: no such file or folder")
    seen, unique = set(), []
    for p in out:
        if p.resolve() not in seen:
            seen.add(p.resolve())
            unique.append(p)
    if not unique:
        raise TraceError("no rank traces given")
    return unique


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
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


def analyse_rank(path: str, max_events: int = MAX_EVENTS) -> dict:
    """One rank's figures and timeline (runs in a worker process: takes and returns plain data)."""
    trace = load_trace(path)
    meta = trace.meta
    info = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    st = step_table(trace)
    step_ms = [float(d) / 1e3 for d in st["dur_us"]]
    gpu = temporal_breakdown(trace)["gpu"]
    comm = rank_breakdown(trace)
    has_steps = len(st) > 0
    align_us = float(st["start_us"].min()) if has_steps else 0.0
    base_ns = meta.get("baseTimeNanoseconds")
    if isinstance(base_ns, (int, float)) and base_ns > 0:
        start_s = base_ns / 1e9 + trace.origin_us / 1e6
    elif trace.origin_us >= EPOCH_US_MIN:
        start_s = trace.origin_us / 1e6
    else:
        start_s = None
    timeline = timeline_data(trace, max_events=max_events)
    for e in timeline["events"]:
        e["start_us"] -= align_us
    timeline["t0"] -= align_us
    timeline["t1"] -= align_us
    return {
        "file": str(path),
        "dist_rank": trace.rank,
        "world_size": info.get("world_size") if isinstance(info.get("world_size"), int) else None,
        "pg_config": info.get("pg_config") if "pg_config" in info else None,
        "pg_count": info.get("pg_count"),
        "versions": _versions(meta),
        "start_s": start_s,
        "step_numbers": sorted(int(s) for s in st["step"]),
        "steps": len(st),
        "step_ms_median": _median(step_ms),
        "step_ms_max": max(step_ms) if step_ms else None,
        "gpu_busy_ms_median": _median([(r["window_us"] - r["idle_us"]) / 1e3 for r in gpu]) if gpu else None,
        "gpu_idle_ms_median": _median([r["idle_us"] / 1e3 for r in gpu]) if gpu else None,
        "gpu_idle_pct": (100.0 * sum(r["idle_us"] for r in gpu) / sum(r["window_us"] for r in gpu)
                         if gpu and sum(r["window_us"] for r in gpu) > 0 else None),
        "on_gpu": comm["on_gpu"],
        "compute_ms_median": _median([s["compute_ms"] for s in comm["steps"]]),
        "comm_ms_median": _median([s["comm_ms"] for s in comm["steps"]]),
        "overlap_ms_median": _median([s["overlap_ms"] for s in comm["steps"]]),
        "exposed_comm_ms_median": _median([s["exposed_comm_ms"] for s in comm["steps"]]),
        "aligned_on": "first profiler step" if has_steps else "first event",
        "timeline": timeline,
    }


def _safe_analyse(path: str, max_events: int) -> dict:
    try:
        return analyse_rank(path, max_events)
    except TraceError as e:
        return {"file": str(path), "error": str(e)}


def _run_all(paths: list[str], max_events: int, parallel: bool | None, progress) -> tuple[list, str]:
    """Each path's analyse_rank, in worker processes where possible; (results in path order, mode)."""
    workers = min(MAX_RANK_WORKERS, os.cpu_count() or 1, len(paths), _memory_workers(paths))
    why = None
    if parallel is False:
        why = "asked for"
    elif workers < 2:
        why = ("one rank" if len(paths) < 2 else "one CPU" if (os.cpu_count() or 1) < 2
               else "not enough free memory for two ranks at once")
    elif multiprocessing.current_process().daemon:
        why = "this process is a daemon and may not start processes"
    if why is None:
        try:
            results: list = [None] * len(paths)
            with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
                futures = {pool.submit(_safe_analyse, p, max_events): i for i, p in enumerate(paths)}
                done = 0
                for fut in _as_completed(futures):
                    results[futures[fut]] = fut.result()
                    done += 1
                    progress(done / len(paths), f"rank trace {done}/{len(paths)} analysed")
            return results, f"parallel ({workers} processes)"
        except (OSError, BrokenProcessPool, PermissionError) as e:
            why = f"worker processes could not run ({type(e).__name__}: {e})"
    results = []
    for i, p in enumerate(paths):
        results.append(_safe_analyse(p, max_events))
        progress((i + 1) / len(paths), f"rank trace {i + 1}/{len(paths)} analysed")
    return results, f"sequential ({why})"


def _memory_workers(paths: list[str]) -> int:
    """How many ranks fit in half the available memory at once (by the largest trace's decoded size)."""
    try:
        import psutil

        available = psutil.virtual_memory().available
    except (ImportError, OSError):
        return MAX_RANK_WORKERS
    need = 1
    for p in paths:
        size = Path(p).stat().st_size
        with open(p, "rb") as f:
            gz = f.read(2) == b"\x1f\x8b"
        need = max(need, int(size * (GZ_RATIO_GUESS if gz else 1) * MEMORY_PER_JSON_BYTE))
    return max(1, int(available * 0.5 // need))


def _as_completed(futures):
    from concurrent.futures import as_completed

    return as_completed(futures)


def _assign_ranks(rows: list[dict]) -> None:
    for i, r in enumerate(rows):
        if r.get("dist_rank") is not None:
            r["rank"], r["rank_source"] = r["dist_rank"], "distributedInfo"
            continue
        m = RANK_NAME_RE.findall(r["name"])
        if m:
            r["rank"], r["rank_source"] = int(m[-1]), "file name"
        else:
            r["rank"], r["rank_source"] = i, "order"


def _problem(check: str, message: str) -> dict:
    return {"check": check, "message": message}


def _by_value(rows: list, key) -> dict:
    """value (as text) -> ranks holding it."""
    out: dict = {}
    for r in rows:
        out.setdefault(repr(key(r)), []).append(r["rank"])
    return out


def _spell(groups: dict) -> str:
    return "; ".join(f"{v} on rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}"
                     for v, rs in groups.items())


def check_one_run(rows: list[dict], failed: list[dict], start_skew_max_s: float = START_SKEW_MAX_S) -> list[dict]:
    """The named problems that say these ranks are not one run's (see CHECKS)."""
    problems = [_problem("unreadable", f"{f['name']}: not read ({f['error']})") for f in failed]
    sizes = {r["world_size"] for r in rows if r["world_size"] is not None}
    if len(sizes) > 1:
        problems.append(_problem("world_size", "ranks disagree on world_size: "
                                 + _spell(_by_value([r for r in rows if r["world_size"] is not None],
                                                    lambda r: r["world_size"]))))
    pg = [r for r in rows if r["pg_config"] is not None or r["pg_count"] is not None]
    if len({repr((r["pg_count"], r["pg_config"])) for r in pg}) > 1:
        groups: dict = {}
        for r in pg:
            groups.setdefault(repr((r["pg_count"], r["pg_config"])), []).append(r)
        problems.append(_problem("pg_config", "ranks disagree on their process groups (distributedInfo pg_count / "
                                 "pg_config): " + "; ".join(
                                     f"{len(g[0]['pg_config'] or []) if isinstance(g[0]['pg_config'], list) else '?'} "
                                     f"group config(s), pg_count {g[0]['pg_count']} on rank"
                                     f"{'s' if len(g) > 1 else ''} {', '.join(str(r['rank']) for r in g)}"
                                     for g in groups.values())))
    counts: dict = {}
    for r in rows:
        counts.setdefault(r["rank"], []).append(r["name"])
    for rank, files in sorted(counts.items()):
        if len(files) > 1:
            problems.append(_problem("duplicate_rank", f"rank {rank} appears {len(files)} times: {', '.join(files)}"))
    if len(sizes) == 1:
        (size,) = sizes
        missing = sorted(set(range(size)) - set(counts))
        beyond = sorted(r for r in counts if not 0 <= r < size)
        if missing:
            shown = ", ".join(map(str, missing[:20])) + (" …" if len(missing) > 20 else "")
            problems.append(_problem("missing_rank", f"world_size is {size} but rank{'s' if len(missing) > 1 else ''} "
                                     f"{shown} {'are' if len(missing) > 1 else 'is'} missing"))
        if beyond:
            problems.append(_problem("missing_rank", f"rank{'s' if len(beyond) > 1 else ''} "
                                     f"{', '.join(map(str, beyond))} outside 0..{size - 1} (world_size {size})"))
    keys = sorted({k for r in rows for k in r["versions"]})
    for k in keys:
        groups = _by_value(rows, lambda r: r["versions"].get(k))
        if len(groups) > 1:
            problems.append(_problem("versions", f"ranks were recorded with different {k}: {_spell(groups)}"))
    starts = [(r["start_s"], r["rank"]) for r in rows if r["start_s"] is not None]
    if len(starts) > 1:
        (lo, r_lo), (hi, r_hi) = min(starts), max(starts)
        if hi - lo > start_skew_max_s:
            problems.append(_problem("start_time", f"traces start {hi - lo:,.0f} s apart (rank {r_lo} first, rank {r_hi} "
                                     f"last; one run's ranks start within {start_skew_max_s:,.0f} s)"))
    step_sets = _by_value(rows, lambda r: _ranges(r["step_numbers"]))
    if len(step_sets) > 1:
        problems.append(_problem("steps", "ranks hold different profiler steps: "
                                 + "; ".join(f"{v.strip(chr(39))} on rank{'s' if len(rs) > 1 else ''} "
                                             f"{', '.join(map(str, rs))}" for v, rs in step_sets.items())))
    return problems


def _ranges(numbers: list[int]) -> str:
    """[1, 2, 3, 7] -> "steps 1-3, 7"; [] -> "no steps"."""
    if not numbers:
        return "no steps"
    parts, start, prev = [], numbers[0], numbers[0]
    for n in numbers[1:] + [None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return "steps " + ", ".join(parts)


def merge_timelines(rows: list[dict], max_events: int) -> dict:
    """One timeline_data-shaped dict for all ranks (rows hold each rank's aligned "timeline"), lanes
    "rank N · …" in rank order, at most max_events bars."""
    lanes, events = [], []
    in_range = shown = deeper = 0
    t0 = t1 = None
    bucket = 0.0
    names = _rank_names(rows)
    for r, name in sorted(zip(rows, names), key=lambda x: (x[0]["rank"], natural_key(x[0]["file"]))):
        tl = r["timeline"]
        prefix = f"{name} · "
        for ln in tl["lanes"]:
            lanes.append({**ln, "lane": prefix + ln["lane"], "label": prefix + (ln.get("label") or ln["lane"]),
                          "rank": r["rank"]})
        for e in tl["events"]:
            events.append({**e, "lane": prefix + e["lane"]})
        in_range += tl["in_range"]
        shown += tl["shown"]
        deeper += tl.get("deeper", 0)
        bucket = max(bucket, tl.get("bucket_us") or 0.0)
        t0 = tl["t0"] if t0 is None else min(t0, tl["t0"])
        t1 = tl["t1"] if t1 is None else max(t1, tl["t1"])
    if len(events) > max_events:  # the per-rank budgets round up: keep the longest bars
        keep = sorted(range(len(events)), key=lambda i: -events[i]["dur_us"])[:max_events]
        events = [events[i] for i in sorted(keep)]
    return {"t0": t0 or 0.0, "t1": t1 or 0.0, "lanes": lanes, "events": events, "in_range": in_range,
            "shown": len(events), "bucket_us": bucket, "deeper": deeper, "alignment": ALIGNMENT}


def _rank_names(rows: list[dict]) -> list[str]:
    count: dict = {}
    for r in rows:
        count[r["rank"]] = count.get(r["rank"], 0) + 1
    return [f"rank {r['rank']}" + (f" ({r['name']})" if count[r["rank"]] > 1 else "") for r in rows]


TABLE_KEYS = ("rank", "rank_source", "name", "file", "steps", "step_ms_median", "step_ms_max", "gpu_busy_ms_median",
              "gpu_idle_ms_median", "gpu_idle_pct", "compute_ms_median", "comm_ms_median", "overlap_ms_median",
              "exposed_comm_ms_median")


def analyse_ranks(paths, max_events: int = MAX_EVENTS, parallel: bool | None = None,
                  start_skew_max_s: float = START_SKEW_MAX_S, progress=None, names: dict | None = None) -> dict:
    """Per-rank table, problems and merged timeline for several ranks' traces (files or folders).

    Returns {"ranks": [{rank, rank_source, file, steps, step_ms_median, step_ms_max, gpu_busy_ms_median,
    gpu_idle_ms_median, gpu_idle_pct, compute_ms_median, comm_ms_median, overlap_ms_median,
    exposed_comm_ms_median}] in rank order (medians are per profiler step, ms; GPU figures None on a
    CPU-only trace), "slowest_rank", "spread" (max / min step-time median), "problems":
    [{check, message}], "timeline" (merged, see merge_timelines), "alignment", "mode" (parallel or
    sequential, and why), "n_files"}. ``names``: file path -> the name a user knows it by (an upload's
    own file name; default the file's name), used in the table, the problems and rank numbers from
    names. Raises TraceError when no file could be read.
    """
    progress = progress or (lambda f, m: None)
    files = [str(p) for p in rank_paths(paths)]
    per_rank = max(10, -(-max_events // len(files)))
    results, mode = _run_all(files, per_rank, parallel, progress)
    names = {str(Path(k).resolve()): v for k, v in (names or {}).items() if v}
    for r in results:
        r["name"] = names.get(str(Path(r["file"]).resolve()), Path(r["file"]).name)
    failed = [r for r in results if "error" in r]
    rows = [r for r in results if "error" not in r]
    if not rows:
        raise TraceError("none of the rank traces could be read: " + "; ".join(f["error"] for f in failed[:3]))
    _assign_ranks(rows)
    problems = check_one_run(rows, failed, start_skew_max_s)
    timeline = merge_timelines(rows, max_events)
    rows.sort(key=lambda r: (r["rank"], natural_key(r["file"])))
    table = [{k: r[k] for k in TABLE_KEYS} for r in rows]
    timed = [r for r in table if r["step_ms_median"] is not None]
    slowest = max(timed, key=lambda r: r["step_ms_median"]) if timed else None
    fastest = min(timed, key=lambda r: r["step_ms_median"]) if timed else None
    spread = (slowest["step_ms_median"] / fastest["step_ms_median"]
              if timed and fastest["step_ms_median"] > 0 else None)
    notes = [f"{sum(r['rank_source'] != 'distributedInfo' for r in table)} rank number(s) read from the file "
             "name or the file's place in the list (no distributedInfo.rank in the trace)"] \
        if any(r["rank_source"] != "distributedInfo" for r in table) else []
    if any(r["aligned_on"] == "first event" for r in rows):
        notes.append("ranks without profiler steps are aligned on their first event")
    return {"ranks": table, "slowest_rank": slowest["rank"] if slowest else None,
            "fastest_rank": fastest["rank"] if fastest else None, "spread": spread,
            "problems": problems, "timeline": timeline, "alignment": ALIGNMENT, "mode": mode,
            "n_files": len(files), "notes": notes, "start_skew_max_s": start_skew_max_s}


__all__ = ["analyse_ranks", "analyse_rank", "check_one_run", "merge_timelines", "rank_paths",
           "MAX_RANK_WORKERS", "MEMORY_PER_JSON_BYTE", "START_SKEW_MAX_S", "CHECKS", "ALIGNMENT"]
