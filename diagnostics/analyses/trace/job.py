"""Trace explorer jobs: open a Chrome/Kineto trace in a worker, run the trace analyses, diff two.

The ingest runs in the runner's worker, so a pathological file costs a worker, never the
dashboard. After the first open the parsed columns are kept next to the run (Arrow/Feather), so a
part the page asks for again with other options is recomputed from them alone, not by the whole
job (~14 parts): the timeline for another time range (analyze_timeline) and another step's critical
path (analyze_critical_path). Each job returns its typed result (result.py), put together from the records
the trace layer's producers return (diagnostics.trace.records), the ranks' view too (trace.ranks.analyse -> Ranks).
"""

from __future__ import annotations

import os
import time
from functools import partial
from pathlib import Path

from diagnostics.analyses.trace import TRACE, TRACE_CRITICAL_PATH, TRACE_DIFF, TRACE_TIMELINE
from diagnostics.analyses.trace import stored
from diagnostics.analyses.trace.result import (
    DiffCache, DiffMetrics, NoMetrics, TraceCache, TraceCriticalPathResult, TraceDiffResult, TraceMetrics, TraceResult,
    TracePartial, TraceTimelineResult,
)
from diagnostics.errors import TorchScopeError
from diagnostics.results import to_plain
from diagnostics.settings import check_server_path, trace_cache_dir
from diagnostics.trace import cache as trace_cache
from diagnostics.trace.cache import cached_load
from diagnostics.trace.errors import TraceError
from diagnostics.trace.classify import communication, use_comm_kernels
from diagnostics.trace.model import Trace
from diagnostics.trace.overview import summary
from diagnostics.trace.pages import small_pages
from diagnostics.trace.records.ranks import Ranks
from diagnostics.trace.records.timeline import Timeline

#: What the job needs after its first answer, the Summary (overview.py: numpy only), imported then
#: (later_views): the views on the trace's DataFrame (pandas, pyarrow), the critical path, the ranks.
#: Names of this module all the same (a test may replace one: a name already set is kept).
_LATER = {
    "critical_path_result": ("diagnostics.analyses.trace.critical_part", "critical_path_result"),
    "serving": ("diagnostics.trace.serving", "serving"),
    "analyse_ranks": ("diagnostics.trace.ranks", "analyse"),
    "hp": ("diagnostics.trace.gpu_activity", ""),   # the module itself
    "HTA_KERNEL_WAIT_US": ("diagnostics.trace.breakdowns", "HTA_KERNEL_WAIT_US"),
    "KERNEL_WAIT_MAX_US": ("diagnostics.trace.breakdowns", "KERNEL_WAIT_MAX_US"),
    **{n: ("diagnostics.trace", n) for n in ("diff_traces", "idle_time", "launch_stats", "temporal_breakdown",
                                            "timeline_data", "top_operators")},
}


def later_views() -> None:
    """Import what _LATER names into this module (those not set yet)."""
    for name in _LATER:
        if name not in globals():
            globals()[name] = __getattr__(name)


def __getattr__(name: str):
    if name not in _LATER:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    module, attr = _LATER[name]
    mod = importlib.import_module(module)
    value = getattr(mod, attr) if attr else mod
    globals()[name] = value
    return value


EVENTS_FILE, META_FILE, RESULT_FILES = stored.EVENTS_FILE, stored.META_FILE, stored.RESULT_FILES


def _require_path(options: dict, key: str = "path") -> str:
    path = options[key]
    if not check_server_path(path, "trace").is_file():
        raise TorchScopeError(f"trace file not found: {path}")
    return str(path)


def columns_kept(folder: str | Path) -> bool:
    """Whether ``folder`` still holds the parsed columns a trace run kept (a part can be recomputed from them)."""
    return trace_cache.columns_kept(folder)


def load_columns(folder: str | Path) -> Trace:
    """The parsed trace a trace run kept in ``folder`` (trace_cache.write_columns), read back and checked by
    the trace cache's own reader; a TorchScopeError naming the folder when there is none or it does not check."""
    if not trace_cache.columns_kept(folder):
        raise TorchScopeError(f"no parsed trace kept in {folder}; open the trace again")
    return trace_cache.read_columns(folder)


def _open(path: str, allow_truncated: bool = False, defer_write: bool = False) -> tuple[Trace, TraceCache]:
    """load_trace through the parsed-trace cache (diagnostics.trace.cache): the trace, and whether
    it came from the cache with the seconds the open took (result key "trace_cache"). ``defer_write``: the
    cache keeps a trace read from its file when trace_cache.finish_write is called (after the first answer)."""
    t = time.perf_counter()
    # One trace, opened for a person waiting: a big one is read by two processes (load_trace(split=True)).
    trace, hit = cached_load(path, trace_cache_dir(), allow_truncated=allow_truncated, defer_write=defer_write,
                             split=True)
    return trace, TraceCache(hit=hit, open_s=time.perf_counter() - t)




def _reopen(ctx, path: str, options: dict) -> TraceResult | None:
    """The stored result of this job (same files, options and code), its files put in this run's
    folder; None when there is none (or the trace cache is off). The rule is stored.py's, which the
    CLI also answers a reopen with, in its own process."""
    t = time.perf_counter()
    kept = stored.find(path, options)
    return None if kept is None else stored.restore(kept, ctx.artifact_dir, t, ctx.progress)


def _keep(trace, options: dict, result: TraceResult, artifact_dir) -> None:
    """Store the result (its plain form, less trace_cache) beside the trace's cache entry, for a reopen
    (see _reopen)."""
    files = {}
    cp = result.critical_path
    if cp and cp.trace_file:   # UNSET is falsy
        files["critical_path"] = cp.trace_file
    if result.columns_dir:
        files["meta"] = Path(artifact_dir) / META_FILE
    try:
        key = stored.result_key(options)
    except (OSError, TraceError):
        return
    plain = {k: v for k, v in to_plain(result).items() if k != "trace_cache"}
    trace_cache.keep_result(trace, key, plain, files)


def analyze(ctx, options: dict) -> TraceResult:
    """Open one trace: summary, temporal breakdown, top operators/kernels, idle time, launches, timeline.
    A second open of an unchanged trace with the same options returns the stored result (_reopen)."""
    with small_pages():   # a big trace's arrays: see diagnostics.trace.pages
        return _analyze(ctx, options)


def _analyze(ctx, options: dict) -> TraceResult:
    options = TRACE.validate(options)  # idempotent: the runner validated them too
    path = _require_path(options)
    kept = _reopen(ctx, path, options)
    if kept is not None:
        return kept
    rows = options["top"]  # rows kept in the top-operator and launch tables
    # An upload is stored under a name we chose; "display_name" is the one the user knows it by.
    stored, name = Path(path).name, options["display_name"] or Path(path).name
    ctx.progress(0.05, f"reading {name} ({os.path.getsize(path) / 2**20:.0f} MiB)")
    file_stamp = trace_cache.stamp(path)   # the file as it was opened: kept with its columns
    try:
        trace, cache = _open(path, allow_truncated=options["allow_truncated"], defer_write=True)
    except TraceError as e:
        msg = str(e)
        raise TraceError(name + msg[len(stored):] if msg.startswith(stored + ":") else msg) from None
    ctx.progress(0.5, f"{len(trace):,} events parsed; analysing")
    use_comm_kernels(trace, options["comm_kernels"])   # before any view: every one reads communication so
    # The first answer (issue #42), from the trace's columns (no pandas yet): shown while the other views are
    # computed. A context made by hand (a notebook) may have no partial.
    parts = {"summary": summary(trace)}
    if hasattr(ctx, "partial"):
        ctx.partial(TracePartial(path=path, name=name, summary=parts["summary"]))
    # Then what the first answer did not need: the trace cache's entry (Arrow, from the DataFrame), the
    # families and their notes (the Summary reads the rule only), the other views and their imports.
    wait_for_cache = trace_cache.finish_write_beside(trace)
    try:
        _later_parts(ctx, trace, options, parts, rows, file_stamp, wait_for_cache)
    finally:
        wait_for_cache()
    s = parts["summary"]
    metrics = TraceMetrics(events=s.events, duration_ms=s.duration_us / 1e3, steps=s.n_steps,
                           skipped_events=s.skipped_events, has_gpu=s.has_gpu)
    # whether the parsed trace came from the trace cache, and how long the open took
    result = TraceResult(path=path, name=name, **parts, metrics=metrics, trace_cache=cache)
    _keep(trace, options, result, ctx.artifact_dir)
    return result


def _later_parts(ctx, trace: Trace, options: dict, parts: dict, rows: int, file_stamp: dict, wait_for_cache) -> None:
    """The views after the first answer, into ``parts``, while the trace cache's entry is written beside
    them (``wait_for_cache`` before the kept columns link it)."""
    parts["communication"] = communication(trace)
    later_views()
    hta = hta_steps(options, rows)
    steps = [("temporal_breakdown", temporal_breakdown),
             ("top_operators", partial(top_operators, n=rows)), ("idle_time", hta.pop("idle_time")),
             ("launch_stats", partial(launch_stats, n=rows))] + list(hta.items())
    for i, (key, fn) in enumerate(steps, start=1):
        ctx.progress(0.5 + 0.4 * i / (len(steps) + 1), key)
        parts[key] = fn(trace)
    served = serving(trace)
    if served.available:   # a training trace's result is unchanged: no serving key
        parts["serving"] = served
    ctx.progress(0.88, "critical path")
    parts["critical_path"] = critical_path_result(trace, options, ctx.artifact_dir)   # #18, critical_part.py
    ctx.progress(0.9, "timeline")
    parts["timeline"] = timeline_part(trace, options)
    if options["ranks"]:
        parts["ranks"] = _ranks(ctx, options)
    if options["keep_columns"]:
        # as the cache keeps an entry (the entry's events linked when there is one), for the parts redone later
        wait_for_cache()
        trace_cache.write_columns(trace, ctx.artifact_dir, file_stamp)
        parts["columns_dir"] = str(ctx.artifact_dir)


def hta_steps(options, rows: int) -> dict:
    """The Holistic Trace Analysis parity analyses (diagnostics.trace.gpu_activity) and idle_time, each a
    function of the trace with the rules ``options`` pick: result key -> fn(trace). The keys are
    the top-level result keys."""
    later_views()
    hta = options["definitions"] == "hta"

    def pick(key, ours, theirs):
        return options[key] if options[key] is not None else (theirs if hta else ours)

    wait = pick("kernel_wait_us", KERNEL_WAIT_MAX_US, HTA_KERNEL_WAIT_US)
    return {
        "idle_time": partial(idle_time, kernel_wait_max_us=wait, rules=options["definitions"]),
        "kernel_sequences": partial(hp.kernel_sequences, max_len=options["sequence_length"], n=rows),
        "queue_length": partial(hp.queue_length, until=pick("queue_until", "kernel_end", "kernel_start"),
                                full=options["queue_full"]),
        "memcpy_bandwidth": hp.memcpy_bandwidth,
        "annotations": partial(hp.annotations, n=rows),
        "launch_delay": partial(hp.launch_delay, n=rows, since=pick("launch_delay_from", "call_start", "call_end")),
        "comm_overlap": partial(hp.comm_overlap, compute=pick("overlap_compute", "gpu_work", "kernels")),
    }


def _ranks(ctx, options: dict) -> Ranks:
    """Several ranks' traces (the "ranks" option): the trace layer's Ranks (diagnostics.trace.ranks.analyse)."""
    later_views()
    paths = [str(check_server_path(p, "trace")) for p in options["ranks"]]
    ctx.progress(0.92, f"{len(paths)} rank path(s): analysing each rank")
    return analyse_ranks(paths, max_events=options["max_events"], names=options["ranks_names"],
                         progress=lambda f, m: ctx.progress(0.92 + 0.06 * f, m), dask=options["dask"],
                         dask_memory_limit=options["dask_memory_limit"], cache_root=trace_cache_dir(),
                         timeline_ranks=_timeline_picks(options["timeline_ranks"]),
                         comm_kernels=options["comm_kernels"] or "", dask_trusted=options["trust_dask_scheduler"])


def _timeline_picks(value: str | None):
    return None if not value else "all" if value == "all" else [int(p) for p in value.split(",")]


def timeline_part(trace: Trace, options) -> Timeline:
    """The timeline part: the bars of [t0, t1] µs (None: the whole trace), at most ``max_events``; in the
    trace job and the trace_timeline part alike."""
    later_views()
    return timeline_data(trace, options["t0"], options["t1"], max_events=options["max_events"])


def analyze_timeline(ctx, options: dict) -> TraceTimelineResult:
    """Re-draw the timeline for [t0, t1] µs from columns kept by a previous ``trace`` run: the trace job's
    timeline part alone, without reading the file or computing the other parts."""
    options = TRACE_TIMELINE.validate(options)  # idempotent: the runner validated them too
    trace = load_columns(options["columns_dir"])
    return TraceTimelineResult(timeline=timeline_part(trace, options), metrics=NoMetrics())


def analyze_critical_path(ctx, options: dict) -> TraceCriticalPathResult:
    """Another step's critical path (``critical_path_step``) from columns kept by a previous ``trace`` run:
    the trace analysis' own part (critical.py), without reading the file or computing its other parts."""
    later_views()
    options = TRACE_CRITICAL_PATH.validate(options)  # idempotent: the runner validated them too
    trace = load_columns(options["columns_dir"])
    ctx.progress(0.3, f"{len(trace.events):,} events read back; critical path")
    cp = critical_path_result(trace, options, ctx.artifact_dir)
    return TraceCriticalPathResult(critical_path=cp, metrics=NoMetrics())


def analyze_diff(ctx, options: dict) -> TraceDiffResult:
    """Diff two traces (before / after a fix) by operator and kernel."""
    later_views()
    options = TRACE_DIFF.validate(options)  # idempotent: the runner validated them too
    before_path, after_path = _require_path(options, "before"), _require_path(options, "after")
    ctx.progress(0.1, f"reading {Path(before_path).name}")
    before, cache_before = _open(before_path)
    ctx.progress(0.5, f"reading {Path(after_path).name}")
    after, cache_after = _open(after_path)
    ctx.progress(0.9, "comparing")
    diff = diff_traces(before, after)
    c = diff.counts
    return TraceDiffResult(before=before_path, after=after_path, diff=diff,
                           trace_cache=DiffCache(before=cache_before, after=cache_after),
                           metrics=DiffMetrics(added=c.added, removed=c.removed, faster=c.faster, slower=c.slower,
                                               unchanged=c.unchanged))
