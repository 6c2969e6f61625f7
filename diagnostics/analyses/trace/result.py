"""The typed results of the trace explorer's analyses: trace (TraceResult), trace_timeline
(TraceTimelineResult), trace_critical_path (TraceCriticalPathResult) and trace_diff (TraceDiffResult).

Each part's record is declared beside the code that makes it (diagnostics.trace.records, one module per
producer) and job.py puts the producers' records together here. The records the views and charts read are
imported from this module too. Times are µs unless a field says otherwise (``_ms``, ``_s``). A part that older
runs did not store is UNSET ("this result predates it": the page says so). Torch-free, like the declarations.
"""

from __future__ import annotations

from typing import Annotated

from diagnostics.declare import metric
from diagnostics.results import UNSET, Record, Result, UnsetType
from diagnostics.trace.records.breakdowns import (  # noqa: F401  (re-exported: the views' and charts' names)
    GraphLaunches, IdleTime, LaunchStats, TemporalBreakdown, TopOperators, TraceSummary,
)
from diagnostics.trace.records.communication import Communication
from diagnostics.trace.records.critical_path import CriticalPath
from diagnostics.trace.records.diff import TraceDiff
from diagnostics.trace.records.gpu_activity import (
    Annotations, CommOverlap, KernelSequences, LaunchDelay, MemcpyBandwidth, QueueLength,
)
from diagnostics.trace.records.ranks import Ranks
from diagnostics.trace.records.serving import Serving
from diagnostics.trace.records.timeline import Timeline


# ---- the trace analysis' result ---------------------------------------------------------------------------

class TraceCache(Record, frozen=True, kw_only=True):
    """Where the trace came from: the parsed-trace cache (``hit``), or (``result``) the stored analysis."""

    hit: bool
    open_s: float
    result: bool | UnsetType = UNSET


class TraceMetrics(Record, frozen=True, kw_only=True):
    events: Annotated[int, metric("count", "Events")]
    duration_ms: Annotated[float, metric("ms", "Duration")]
    steps: Annotated[int, metric("count", "Profiler steps")]
    skipped_events: Annotated[int, metric("count", "Events skipped (malformed)")]
    has_gpu: Annotated[bool, metric("bool", "GPU activity")]


class TraceResult(Result, frozen=True, kw_only=True):
    """One trace opened: every part (UNSET: a part this stored result predates), the timeline, and (``ranks``)
    several ranks of one job. ``columns_dir``: where the parsed columns are kept for a part's recompute."""

    path: str
    name: str
    communication: Communication | UnsetType = UNSET
    summary: TraceSummary
    temporal_breakdown: TemporalBreakdown
    top_operators: TopOperators
    idle_time: IdleTime
    launch_stats: LaunchStats
    kernel_sequences: KernelSequences | UnsetType = UNSET
    queue_length: QueueLength | UnsetType = UNSET
    memcpy_bandwidth: MemcpyBandwidth | UnsetType = UNSET
    annotations: Annotations | UnsetType = UNSET
    launch_delay: LaunchDelay | UnsetType = UNSET
    comm_overlap: CommOverlap | UnsetType = UNSET
    serving: Serving | UnsetType = UNSET   # an inference server's trace only (issue #42)
    critical_path: CriticalPath | UnsetType = UNSET
    timeline: Timeline
    ranks: Ranks | UnsetType = UNSET
    columns_dir: str | UnsetType = UNSET
    metrics: TraceMetrics
    trace_cache: TraceCache | UnsetType = UNSET


class TracePartial(Record, frozen=True, kw_only=True):
    """The trace job's first answer, sent as soon as it is known (issue #42): the Summary, right after the
    ingest, while the other views are still computed."""

    path: str
    name: str
    summary: TraceSummary


class NoMetrics(Record, frozen=True, kw_only=True):
    """A part recomputed from kept columns has no headline numbers of its own."""


class TraceTimelineResult(Result, frozen=True, kw_only=True):
    """The timeline of a trace opened before, for another time range (from its kept columns)."""

    timeline: Timeline
    metrics: NoMetrics = NoMetrics()


class TraceCriticalPathResult(Result, frozen=True, kw_only=True):
    """Another step's critical path of a trace opened before, from its kept columns."""

    critical_path: CriticalPath
    metrics: NoMetrics = NoMetrics()


# ---- trace_diff (diagnostics.trace.diff) ------------------------------------------------------------------

class DiffMetrics(Record, frozen=True, kw_only=True):
    added: Annotated[int, metric("count", "Added")]
    removed: Annotated[int, metric("count", "Removed")]
    faster: Annotated[int, metric("count", "Faster")]
    slower: Annotated[int, metric("count", "Slower")]
    unchanged: Annotated[int, metric("count", "Unchanged")]


class DiffCache(Record, frozen=True, kw_only=True):
    before: TraceCache
    after: TraceCache


class TraceDiffResult(Result, frozen=True, kw_only=True):
    before: str
    after: str
    diff: TraceDiff
    trace_cache: DiffCache | UnsetType = UNSET
    metrics: DiffMetrics
