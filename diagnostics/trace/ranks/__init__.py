"""Several ranks' traces of one job, as map -> reduce: analyse(paths) -> Ranks (records/ranks.py): per-rank
table, cross-rank views, "not one run" problems, and a timeline of the ranks picked (analyse_ranks: its plain
form).

* **map** (summary.rank_summary): each rank's file -> a small summary (steps, breakdown, collectives
  with their keys, arrival times and sizes, kernels, idle), in a local process pool or on a Dask
  cluster (executors.py), one rank at a time per worker; a rank that fails is named and left out.
  Summaries are kept on disk (store.py, keyed like the trace cache), so a reopen reads them.
* **reduce** (reduce.py): the summaries -> per collective the arrival skew, transfer time and bus
  bandwidth; stragglers and who waits for whom; late collectives; a rank x step heat map of step time.
  Raw events are never merged.
* **details** (summary.rank_detail) of the picked ranks only: their timelines on one chart (lanes
  "rank N · <lane>", each rank's times from its first profiler step) and the critical path of the
  slowest rank (the first straggler, else the rank with the highest median step time).

Rank numbers and the "not one run" checks are checks.py's.
"""

from __future__ import annotations

import time
from pathlib import Path

import msgspec

from diagnostics.results import UNSET, to_plain
from diagnostics.trace.errors import TraceError
from diagnostics.trace.ranks.checks import (
    CHECKS, START_SKEW_MAX_S, assign_ranks, check_one_run, rank_paths,
)
from diagnostics.trace.ranks.executors import MAX_RANK_WORKERS, MEMORY_PER_JSON_BYTE, check_trusted, executor_for
from diagnostics.trace.ranks.reduce import align_hosts, clock_group, collective_frame, collectives_view, heatmap, lateness, workers
from diagnostics.trace.ranks.store import SummaryStore
from diagnostics.trace.ranks.summary import rank_detail, rank_summary
from diagnostics.trace.records.critical_path import CriticalPath
from diagnostics.trace.records.ranks import (
    Clock, CollectiveName, FailedRank, Heatmap, LateCollective, LateThresholds, MatchedCollective, Problem, RankCollectives,
    RankRow, Ranks, RankStraggler, StepSkew, SummaryCache, TimelineError, Wait, Worker,
)
from diagnostics.trace.records.timeline import Timeline
from diagnostics.trace.timeline import MAX_EVENTS, natural_key

ALIGNMENT = "each rank's times start at its first profiler step (0 ms); a rank without steps at its first event"
#: Ranks drawn on the merged timeline at most (each rank's trace is read again for it).
TIMELINE_RANKS_MAX = 8
#: The summaries' folder inside the trace cache.
SUMMARIES_DIR = "rank_summaries"
TABLE_KEYS = ("rank", "rank_source", "name", "file", "steps", "step_ms_median", "step_ms_max", "gpu_busy_ms_median",
              "gpu_idle_ms_median", "gpu_idle_pct", "compute_ms_median", "comm_ms_median", "overlap_ms_median",
              "exposed_comm_ms_median", "busy_ms_median")
LATE_KEYS = ("late_us_median", "arrived_last", "waited_ms", "caused_wait_ms")


def _error_text(e: BaseException) -> str:
    if isinstance(e, TraceError):
        return str(e)
    name = type(e).__name__
    if name == "KilledWorker":
        return ("the worker analysing it died (out of memory at its limit, or killed): " + str(e))[:300]
    return f"{name}: {e}"[:300]


def _summaries(files: list[str], store: SummaryStore, ex_factory, progress, comm_kernels: str = "") -> tuple[list, list, str | None]:
    """Every file's summary (the store's, else computed by the executor): (summaries, failures, mode)."""
    key = {"comm_kernels": comm_kernels} if comm_kernels else None  # the user's pattern changes what is communication
    out = [store.get(f, "summary", key) for f in files]
    todo = [i for i, s in enumerate(out) if s is None]
    failed = []
    mode = None
    if todo:
        ex = ex_factory()
        done = 0
        for i, res, err in ex.map(rank_summary, [(files[j], comm_kernels) for j in todo]):
            j = todo[i]
            done += 1
            if err is not None:
                failed.append({"file": files[j], "error": _error_text(err)})
            else:
                out[j] = res
                store.put(files[j], "summary", res, key)
            progress(done / len(todo), f"rank trace {done}/{len(todo)} summarised")
        mode = ex.mode  # after the map: a pool that could not start says so
    return out, failed, mode


def analyse_ranks(paths, **options) -> dict:
    """``analyse(paths, **options)``'s Ranks in its plain form (to_plain): for a caller that still reads the
    ranks' view as a dict (attach's job, which keeps it beside its own result)."""
    return to_plain(analyse(paths, **options))


def analyse(paths, max_events: int = MAX_EVENTS, parallel: bool | None = None,
            start_skew_max_s: float = START_SKEW_MAX_S, progress=None, names: dict | None = None,
            dask: str | None = None, dask_memory_limit: str | int | None = None,
            cache_root: str | Path | None = None, timeline_ranks: list | str | None = None,
            critical_path: bool = True, comm_kernels: str = "", dask_trusted: bool = False) -> Ranks:
    """Per-rank table, cross-rank views, problems and a timeline of picked ranks (files or folders): the
    Ranks record (records/ranks.py): ``ranks`` (per-rank rows in rank order: TABLE_KEYS, medians per profiler
    step, ms; GPU figures None on a CPU-only trace; and LATE_KEYS), ``slowest_rank``, ``fastest_rank``,
    ``spread``, ``problems``, ``collectives``, ``stragglers``, ``late_collectives``, ``waits``,
    ``thresholds``, ``clock``, ``heatmap``, ``critical_path`` (of ``critical_path_rank``), ``timeline``
    (merged, of ``timeline_ranks``: default the slowest rank and the least late one), ``alignment``, ``mode``,
    ``workers``, ``cache``, ``n_files``, ``notes``.
    ``dask``: None (local processes), "local[:N]" or a scheduler address (refused unless ``dask_trusted``:
    it runs code as you, executors.REMOTE_TRUST); ``cache_root``: the trace
    cache folder (summaries kept in its SUMMARIES_DIR; None: none kept). ``names``: file path -> the
    name a user knows it by (uploads). Raises TraceError when no file could be read.
    """
    progress = progress or (lambda f, m: None)
    check_trusted(dask, dask_trusted)  # before anything: also when every summary is cached
    t_start = time.perf_counter()
    files = [str(p) for p in rank_paths(paths)]
    store = SummaryStore(Path(cache_root) / SUMMARIES_DIR if cache_root is not None else None)
    ex_holder: list = []

    def executor():
        if not ex_holder:
            ex_holder.append(executor_for(dask, files, parallel, dask_memory_limit, trusted=dask_trusted))
        return ex_holder[0]

    try:
        summaries, failed, mode = _summaries(files, store, executor, lambda f, m: progress(0.85 * f, m), comm_kernels)
        out = _reduce(files, summaries, failed, names, start_skew_max_s)
        out["mode"] = mode or f"all {len(files)} summaries read from the cache"
        if mode and store.hits:
            out["mode"] += f"; {store.hits} of {len(files)} summaries from the cache"
        progress(0.9, "timeline and critical path of the picked ranks")
        local = dask is None or str(dask).startswith("local")
        _details(out, store, executor, max_events, timeline_ranks, critical_path,
                 str(cache_root) if cache_root is not None and local else None, comm_kernels)
    finally:
        for ex in ex_holder:
            ex.close()
    if ex_holder and ex_holder[0].memory_limit:
        out["memory_limit_bytes"] = int(ex_holder[0].memory_limit)
    out["cache"] = SummaryCache(hits=store.hits, misses=store.misses, kept=store.root is not None)
    out["seconds"] = time.perf_counter() - t_start
    return _record(out)


def _record(out: dict) -> Ranks:
    """The reduce's parts (made in this process, keyed as the records' fields: an unknown key is a TypeError)
    and the picked ranks' details as the Ranks record; the critical path, which a worker process computed and
    sent as plain data, is decoded against its record there."""
    coll, lat = out["collectives"], out["heatmap"]
    cp = out.get("critical_path")
    return Ranks(
        ranks=tuple(RankRow(**r) for r in out["ranks"]), slowest_rank=out["slowest_rank"],
        fastest_rank=out["fastest_rank"], spread=out["spread"], problems=tuple(Problem(**p) for p in out["problems"]),
        collectives=RankCollectives(
            matched=coll["matched"], partial=coll["partial"], by_name=tuple(CollectiveName(**c) for c in coll["by_name"]),
            widest=tuple(MatchedCollective(**c) for c in coll["widest"]),
            by_step=tuple(StepSkew(**c) for c in coll["by_step"]), events=tuple(coll["events"]),
            matched_by=tuple(coll["matched_by"])),
        stragglers=tuple(RankStraggler(**r) for r in out["stragglers"]),
        late_collectives=tuple(LateCollective(**c) for c in out["late_collectives"]),
        waits=tuple(Wait(**w) for w in out["waits"]), thresholds=LateThresholds(**out["thresholds"]),
        clock=Clock(**out["clock"]),
        heatmap=Heatmap(ranks=tuple(lat["ranks"]), steps=tuple(lat["steps"]),
                        step_ms=tuple(tuple(row) for row in lat["step_ms"]), binned=lat["binned"]),
        critical_path_rank=out["critical_path_rank"], alignment=out["alignment"],
        workers=tuple(Worker(**w) for w in out["workers"]), failed=tuple(FailedRank(**f) for f in out["failed"]),
        n_files=out["n_files"], notes=tuple(out["notes"]), start_skew_max_s=out["start_skew_max_s"], mode=out["mode"],
        timeline=out["timeline"], timeline_ranks=tuple(out["timeline_ranks"]),
        timeline_errors=tuple(TimelineError(**e) for e in out["timeline_errors"]),
        critical_path=msgspec.convert(cp, CriticalPath) if cp is not None else UNSET,
        memory_limit_bytes=out.get("memory_limit_bytes", UNSET), cache=out["cache"], seconds=out["seconds"])


def _reduce(files, summaries, failed, names, start_skew_max_s) -> dict:
    names = {str(Path(k).resolve()): v for k, v in (names or {}).items() if v}
    rows = [s for s in summaries if s is not None]
    for r in rows + failed:
        r["name"] = names.get(str(Path(r["file"]).resolve()), Path(r["file"]).name)
    if not rows:
        raise TraceError("none of the rank traces could be read: " + "; ".join(f["error"] for f in failed[:3]))
    assign_ranks(rows)
    problems = check_one_run(rows, failed, start_skew_max_s)
    rows.sort(key=lambda r: (r["rank"], natural_key(r["file"])))
    notes = []
    if any(r["rank_source"] != "distributedInfo" for r in rows):
        notes.append(f"{sum(r['rank_source'] != 'distributedInfo' for r in rows)} rank number(s) read from the file "
                     "name or the file's place in the list (no distributedInfo.rank in the trace)")
    if any(r["aligned_on"] == "first event" for r in rows):
        notes.append("ranks without profiler steps are aligned on their first event")
    # Cross-rank views over one file per rank number (a duplicate is a problem above, not a second rank).
    seen, uniq = set(), []
    for r in rows:
        if r["rank"] not in seen:
            seen.add(r["rank"])
            uniq.append(r)
    if len(uniq) < len(rows):
        notes.append(f"{len(rows) - len(uniq)} file(s) repeating a rank number left out of the cross-rank views")
    for r in uniq:
        r["host"] = clock_group(r)
    df = collective_frame(uniq)
    clock = align_hosts(df, uniq)
    sizes = {r["world_size"] for r in uniq if r["world_size"]}
    coll, per = collectives_view(df, sizes.pop() if len(sizes) == 1 else None, len(uniq))
    late = lateness(per, [r["rank"] for r in uniq])
    coll["events"] = sorted({r["collectives"]["events"] for r in uniq if r["collectives"]["key"]})
    coll["matched_by"] = sorted({r["collectives"]["matched_by"] for r in uniq if r["collectives"]["key"]})
    table = []
    for r in rows:
        row = {k: r.get(k) for k in TABLE_KEYS}
        row.update({k: (late["per_rank"].get(r["rank"]) or {}).get(k) for k in LATE_KEYS})
        table.append(row)
    timed = [r for r in table if r["step_ms_median"] is not None]
    slowest = max(timed, key=lambda r: r["step_ms_median"]) if timed else None
    fastest = min(timed, key=lambda r: r["step_ms_median"]) if timed else None
    spread = (slowest["step_ms_median"] / fastest["step_ms_median"]
              if timed and fastest["step_ms_median"] > 0 else None)
    stragglers = late["stragglers"]
    cp_rank = stragglers[0]["rank"] if stragglers else (slowest["rank"] if slowest else rows[0]["rank"])
    return {"ranks": table, "slowest_rank": slowest["rank"] if slowest else None,
            "fastest_rank": fastest["rank"] if fastest else None, "spread": spread,
            "problems": problems, "collectives": coll, "stragglers": stragglers,
            "late_collectives": late["late_collectives"], "waits": late["waits"], "thresholds": late["thresholds"],
            "clock": clock, "heatmap": heatmap(uniq), "critical_path_rank": cp_rank,
            "alignment": ALIGNMENT, "workers": workers(rows), "failed": [{"name": f["name"], "file": f["file"],
                                                                         "error": f["error"]} for f in failed],
            "n_files": len(files), "notes": notes, "start_skew_max_s": start_skew_max_s,
            "_rows": uniq}


def pick_timeline_ranks(out: dict, asked) -> list[int]:
    """The ranks drawn on the merged timeline: those asked for ("all": every rank, up to
    TIMELINE_RANKS_MAX), else the critical-path rank and the rank least late (or the fastest)."""
    have = [r["rank"] for r in out["_rows"]]
    if asked == "all":
        return have[:TIMELINE_RANKS_MAX]
    if asked:  # ranks not read (another job's picks, a typo) are left out: the notes say which
        wanted = [int(r) for r in asked]
        missing = [r for r in wanted if r not in have]
        if missing:
            out["notes"].append(f"timeline rank(s) {', '.join(map(str, missing))} asked for but not among the ranks "
                                "read: not drawn")
        return [r for r in wanted if r in have][:TIMELINE_RANKS_MAX]
    first = out["critical_path_rank"]
    lat = sorted((r["late_us_median"], r["rank"]) for r in out["ranks"] if r.get("late_us_median") is not None)
    # beside it: the rank least late (the one that waits most), else the fastest, else any other
    others = [r for _, r in lat] + [out.get("fastest_rank")] + [r for _, r in reversed(lat)] + have
    second = next((r for r in others if r is not None and r != first and r in have), None)
    return [first] + ([second] if second is not None else [])


def _details(out: dict, store, executor, max_events, asked, want_cp, cache_root, comm_kernels: str = "") -> None:
    rows = {r["rank"]: r for r in out.pop("_rows")}
    out["_rows"] = list(rows.values())
    picks = pick_timeline_ranks(out, asked)
    del out["_rows"]
    per = max(10, -(-max_events // max(1, len(picks))))
    cp_rank = out["critical_path_rank"] if want_cp else None
    tasks = {}
    for rank in dict.fromkeys(picks + ([cp_rank] if cp_rank is not None else [])):
        opts = {"timeline_events": per if rank in picks else None, "critical_path": rank == cp_rank,
                **({"comm_kernels": comm_kernels} if comm_kernels else {})}
        tasks[rank] = opts
    results: dict = {}
    todo = []
    for rank, opts in tasks.items():
        kept = store.get(rows[rank]["file"], "detail", opts)
        if kept is not None:
            results[rank] = kept
        else:
            todo.append(rank)
    if todo:
        items = [(rows[r]["file"], tasks[r]["timeline_events"], None, tasks[r]["critical_path"], cache_root,
                  comm_kernels) for r in todo]
        for i, res, err in executor().map(rank_detail, items):
            rank = todo[i]
            if err is not None:
                results[rank] = {"error": _error_text(err)}
            else:
                results[rank] = res
                store.put(rows[rank]["file"], "detail", res, tasks[rank])
    drawn = [dict(rows[r], timeline=results[r]["timeline"]) for r in picks if "timeline" in results.get(r, {})]
    out["timeline"] = merge_timelines(drawn, max_events)
    out["timeline_ranks"] = sorted(r["rank"] for r in drawn)
    out["timeline_errors"] = [{"rank": r, "error": results[r]["error"]} for r in picks if "error" in results.get(r, {})]
    if cp_rank is not None:
        got = results.get(cp_rank, {})
        cp = got.get("critical_path") or {"available": False, "reason": got.get("error", "not computed")}
        out["critical_path"] = {"rank": cp_rank, **cp}


def merge_timelines(rows: list[dict], max_events: int) -> Timeline:
    """One Timeline for the given ranks (rows hold each rank's aligned "timeline", timeline_data's record in
    its plain form: it was sent by a worker process), lanes "rank N · …" in rank order, at most max_events bars."""
    lanes, events = [], []
    in_range = deeper = 0
    t0 = t1 = None
    bucket = 0.0
    names = _rank_names(rows)
    for r, name in sorted(zip(rows, names), key=lambda x: (x[0]["rank"], natural_key(x[0]["file"]))):
        tl = msgspec.convert(r["timeline"], Timeline)
        prefix = f"{name} · "
        lanes += [msgspec.structs.replace(ln, lane=prefix + ln.lane, label=prefix + (ln.label or ln.lane), rank=r["rank"])
                  for ln in tl.lanes]
        events += [msgspec.structs.replace(e, lane=prefix + e.lane) for e in tl.events]
        in_range += tl.in_range
        deeper += tl.deeper
        bucket = max(bucket, tl.bucket_us)
        t0 = tl.t0 if t0 is None else min(t0, tl.t0)
        t1 = tl.t1 if t1 is None else max(t1, tl.t1)
    if len(events) > max_events:  # the per-rank budgets round up: keep the longest bars
        keep = sorted(range(len(events)), key=lambda i: -events[i].dur_us)[:max_events]
        events = [events[i] for i in sorted(keep)]
    return Timeline(t0=t0 or 0.0, t1=t1 or 0.0, lanes=tuple(lanes), events=tuple(events), in_range=in_range,
                    shown=len(events), bucket_us=bucket, deeper=deeper, alignment=ALIGNMENT)


def _rank_names(rows: list[dict]) -> list[str]:
    count: dict = {}
    for r in rows:
        count[r["rank"]] = count.get(r["rank"], 0) + 1
    return [f"rank {r['rank']}" + (f" ({r['name']})" if count[r["rank"]] > 1 else "") for r in rows]


__all__ = ["analyse", "analyse_ranks", "rank_summary", "rank_detail", "check_one_run", "merge_timelines", "rank_paths",
           "pick_timeline_ranks", "MAX_RANK_WORKERS", "MEMORY_PER_JSON_BYTE", "START_SKEW_MAX_S", "CHECKS",
           "ALIGNMENT", "TIMELINE_RANKS_MAX"]
