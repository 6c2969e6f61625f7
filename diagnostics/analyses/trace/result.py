"""The typed results of the trace explorer's analyses: trace (TraceResult), trace_timeline
(TraceTimelineResult), trace_critical_path (TraceCriticalPathResult) and trace_diff (TraceDiffResult).

The trace layer (diagnostics.trace) computes each part as plain data; job.py builds these types from it
(results.build: a key a type does not declare is an error). Times are µs unless a field says otherwise
(``_ms``, ``_s``). A part that older runs did not store is UNSET ("this result predates it": the page says
so); a figure the trace does not hold is None ("not counted"), never 0. Torch-free, like the declarations.
"""

from __future__ import annotations

from typing import Annotated

from diagnostics.declare import column, metric, table
from diagnostics.results import UNSET, Record, Result, UnsetType

_us = lambda label: column("us", label)  # noqa: E731


# ---- the timeline (diagnostics.trace.timeline.timeline_data; several ranks: ranks.merge_timelines) ---------

class TimelineLane(Record, frozen=True, kw_only=True):
    """A row of the timeline: a host thread or a GPU stream (``lane`` its key, ``label`` what a user reads)."""

    lane: str
    kind: str
    name: str
    label: str
    #: the rank it belongs to, on the ranks' merged timeline
    rank: int | UnsetType = UNSET


class TimelineEvent(Record, frozen=True, kw_only=True):
    """A bar: one event, or (``count`` > 1) the longest of that many in its row and time bucket."""

    lane: str
    depth: int
    name: str
    cat: str
    start_us: float
    dur_us: float
    count: int


class Timeline(Record, frozen=True, kw_only=True):
    """At most max_events bars for [t0, t1] µs: ``in_range`` events overlap it, ``shown`` are drawn,
    ``deeper`` are nested too deep to draw; ``bucket_us`` > 0 when short events were merged."""

    t0: float
    t1: float
    lanes: tuple[TimelineLane, ...]
    events: tuple[TimelineEvent, ...]
    in_range: int
    shown: int
    bucket_us: float
    deeper: int
    #: how several ranks' times were put on one axis (the ranks' merged timeline only)
    alignment: str | UnsetType = UNSET


# ---- summary (views.summary) -------------------------------------------------------------------------------

class Step(Record, frozen=True, kw_only=True):
    step: int
    name: str
    start_us: float
    dur_us: float


class Category(Record, frozen=True, kw_only=True):
    cat: str
    events: int
    total_us: float


class Thread(Record, frozen=True, kw_only=True):
    pid: str
    tid: str
    name: str
    events: int
    busy_us: float


class Stream(Record, frozen=True, kw_only=True):
    device: str
    stream: str
    kernels: int
    memcpy: int
    memset: int
    busy_us: float


class MemoryPeak(Record, frozen=True, kw_only=True):
    device: str
    peak_allocated_bytes: int


class TraceSummary(Record, frozen=True, kw_only=True):
    """What the trace is: its file, size, duration, steps, events by category, threads, streams, memory."""

    source: str
    bytes: int
    events: int
    duration_us: float
    rank: int | None
    schema_version: int | str | None
    base_time_ns: int | None
    has_gpu: bool
    n_steps: int
    steps: tuple[Step, ...]
    categories: tuple[Category, ...]
    threads: tuple[Thread, ...]
    streams: tuple[Stream, ...]
    memory: tuple[MemoryPeak, ...]
    skipped_events: int
    warnings: tuple[str, ...]
    notes: tuple[str, ...] = ()


# ---- per step (views.temporal_breakdown) --------------------------------------------------------------------

class StepWindow(Record, frozen=True, kw_only=True):
    """A step's host span (step -1, "whole trace", in a trace without profiler steps)."""

    step: int
    start_us: float
    dur_us: float


class GpuStep(Record, frozen=True, kw_only=True):
    """One step's GPU window, its busy time by kind (exclusive, in KIND_PRIORITY order) and its idle time."""

    step: int
    window_start_us: float
    window_us: float
    events: int
    compute_us: float
    communication_us: float
    memcpy_us: float
    memset_us: float
    idle_us: float


class CpuGroup(Record, frozen=True, kw_only=True):
    """Host self time of one operator family or category in one step."""

    step: int
    group: str
    self_us: float


class Attribution(Record, frozen=True, kw_only=True):
    """How many GPU events were put in a step by their launch call, by time, or in none, and why."""

    launch_events: int
    time_events: int
    before_profiling_events: int
    outside_steps_events: int
    before_profiling_us: float
    outside_steps_us: float


class TemporalBreakdown(Record, frozen=True, kw_only=True):
    steps: tuple[StepWindow, ...]
    gpu: Annotated[tuple[GpuStep, ...], table("GPU time per step")]
    cpu: tuple[CpuGroup, ...]
    kind_priority: tuple[str, ...]
    attribution: Attribution
    notes: tuple[str, ...]


# ---- top operators and kernels (views.top_operators) -------------------------------------------------------

class Operator(Record, frozen=True, kw_only=True):
    name: str
    calls: Annotated[int, column("count", "calls")]
    total_us: Annotated[float, _us("total")]
    self_us: Annotated[float, _us("self")]
    max_us: Annotated[float | None, _us("max")]
    mean_us: Annotated[float | None, _us("mean")]
    self_pct: Annotated[float, column("percent", "self share")]


class Kernel(Record, frozen=True, kw_only=True):
    name: str
    kind: str
    calls: Annotated[int, column("count", "calls")]
    total_us: Annotated[float, _us("total")]
    max_us: Annotated[float, _us("max")]
    mean_us: Annotated[float, _us("mean")]
    pct: Annotated[float, column("percent", "share")]


class TopOperators(Record, frozen=True, kw_only=True):
    """The host operators by self time and the GPU kernels by time, the first ``top`` of each."""

    operators: Annotated[tuple[Operator, ...], table("Host operators")]
    kernels: Annotated[tuple[Kernel, ...], table("GPU kernels")]
    n_operators: int
    n_kernels: int
    operator_self_us: float
    kernel_us: float


# ---- idle time and launches (views.idle_time, views.launch_stats) --------------------------------------------

class IdleStream(Record, frozen=True, kw_only=True):
    device: str
    stream: str
    events: int
    window_us: float
    busy_us: float
    idle_us: float
    gaps: int
    host_wait_us: float
    kernel_wait_us: float
    other_wait_us: float


class IdleTime(Record, frozen=True, kw_only=True):
    streams: Annotated[tuple[IdleStream, ...], table("Idle time per stream")]
    kernel_wait_max_us: float
    rules: str


class LaunchName(Record, frozen=True, kw_only=True):
    name: str
    launches: int
    gpu_us: float
    runtime_us: float
    mean_delay_us: float
    max_delay_us: float
    short_kernels: int
    long_delays: int


class LaunchPoint(Record, frozen=True, kw_only=True):
    """One launch of the scatter plot's sample: the call's duration against its kernel's."""

    name: str
    kind: str
    launch_dur_us: float | None
    dur_us: float
    delay_us: float


class GraphLaunch(Record, frozen=True, kw_only=True):
    launch_name: str
    launch_start_us: float
    runtime_us: float | None
    kernels: int
    delay_us: float
    span_us: float
    gpu_us: float


class GraphLaunches(Record, frozen=True, kw_only=True):
    """CUDA / HIP graph launches: one call starting many kernels, kept out of the per-kernel figures."""

    launches: int
    kernels: int
    by_launch: tuple[GraphLaunch, ...]
    mean_kernels_per_launch: float | UnsetType = UNSET
    mean_runtime_us: float | UnsetType = UNSET
    mean_delay_us: float | UnsetType = UNSET
    max_delay_us: float | UnsetType = UNSET
    gpu_us: float | UnsetType = UNSET
    shorter_than_launch: int | UnsetType = UNSET


class LaunchStats(Record, frozen=True, kw_only=True):
    """Launch calls and the GPU work they started; the means are unset when no launch is in the trace."""

    launches: int
    kernel_launches: int
    short_kernels: int
    long_delays: int
    long_launch_delay_us: float
    by_name: Annotated[tuple[LaunchName, ...], table("Kernel launches")]
    sample: tuple[LaunchPoint, ...]
    graphs: GraphLaunches | UnsetType = UNSET
    mean_delay_us: float | UnsetType = UNSET
    max_delay_us: float | UnsetType = UNSET
    mean_runtime_us: float | UnsetType = UNSET


# ---- communication (classify.communication) ---------------------------------------------------------------

class CommFamily(Record, frozen=True, kw_only=True):
    family: str
    where: str
    events: int
    names: int
    time_us: float
    example: str


class SuspectStream(Record, frozen=True, kw_only=True):
    """A GPU stream with no communication matched whose kernel time is mostly in names that hint at it."""

    device: int
    stream: int
    kernel_us: float
    hinted_us: float
    share: float
    examples: tuple[str, ...]


class Communication(Record, frozen=True, kw_only=True):
    families: tuple[CommFamily, ...]
    comm_kernels: str | None
    rocm: bool
    suspect_streams: tuple[SuspectStream, ...]
    notes: tuple[str, ...]


# ---- Holistic Trace Analysis parity (diagnostics.trace.gpu_activity) -------------------------------------------

class KernelSequence(Record, frozen=True, kw_only=True):
    sequence: str
    length: Annotated[int, column("count", "kernels")]
    count: Annotated[int, column("count", "occurrences")]
    total_us: Annotated[float, _us("GPU time")]
    mean_us: Annotated[float, _us("GPU time each")]
    span_us: Annotated[float, _us("span")]
    gap_us: Annotated[float, _us("gaps inside")]
    kernels: tuple[str, ...]


class KernelSequences(Record, frozen=True, kw_only=True):
    max_len: int
    kernels: int
    sequences: int
    by_time: Annotated[tuple[KernelSequence, ...], table("Frequent kernel sequences (fusion candidates)")]
    by_count: tuple[KernelSequence, ...]
    notes: tuple[str, ...]


class QueueStream(Record, frozen=True, kw_only=True):
    device: str
    stream: str
    launches: Annotated[int, column("count", "launches")]
    max: Annotated[int, column("count", "max queued")]
    mean: Annotated[float | None, column("number", "mean queued")]
    full_us: Annotated[float, _us("time at a full queue")]
    span_us: Annotated[float, _us("span")]


class QueueSeries(Record, frozen=True, kw_only=True):
    device: str
    stream: str
    t_us: tuple[float, ...]
    queued: tuple[int, ...]
    sampled: bool


class QueueLength(Record, frozen=True, kw_only=True):
    until: str
    full: int
    unlinked: int
    streams: Annotated[tuple[QueueStream, ...], table("Launch queue length per stream")]
    series: tuple[QueueSeries, ...]
    blocked_us: float | None
    notes: tuple[str, ...]


class CopyDirection(Record, frozen=True, kw_only=True):
    direction: str
    events: Annotated[int, column("count", "events")]
    counted_events: Annotated[int, column("count", "with bytes")]
    time_us: Annotated[float, _us("time")]
    bytes: Annotated[int | None, column("bytes", "bytes")]
    bytes_per_s: Annotated[float | None, column("bytes_per_s", "bandwidth")]
    median_bytes_per_s: Annotated[float | None, column("bytes_per_s", "median per copy")]
    max_bytes_per_s: Annotated[float | None, column("bytes_per_s", "max per copy")]


class MemcpyBandwidth(Record, frozen=True, kw_only=True):
    directions: Annotated[tuple[CopyDirection, ...], table("Memcpy / memset bandwidth")]
    events: int
    counted_events: int
    notes: tuple[str, ...]


class Annotation(Record, frozen=True, kw_only=True):
    name: str
    count: Annotated[int, column("count", "count")]
    total_us: Annotated[float, _us("total")]
    mean_us: Annotated[float, _us("mean")]
    max_us: Annotated[float, _us("max")]
    gpu_busy_us: Annotated[float, _us("GPU busy inside")]


class Annotations(Record, frozen=True, kw_only=True):
    annotations: Annotated[tuple[Annotation, ...], table("GPU user annotations")]
    n_annotations: int
    events: int
    notes: tuple[str, ...]


class DelayName(Record, frozen=True, kw_only=True):
    name: str
    kind: str
    op: str
    launches: Annotated[int, column("count", "launches")]
    mean_us: Annotated[float, _us("mean")]
    min_us: Annotated[float, _us("min")]
    p50_us: Annotated[float, _us("median")]
    p90_us: Annotated[float, _us("p90")]
    max_us: Annotated[float, _us("max")]


class DelayBin(Record, frozen=True, kw_only=True):
    lo_us: Annotated[float, _us("from")]
    hi_us: Annotated[float | None, _us("to")]
    count: Annotated[int, column("count", "launches")]


class LaunchDelay(Record, frozen=True, kw_only=True):
    """From a launch call's start (``since``: or its end) to its GPU work's start; the statistics are unset
    when no launch is in the trace."""

    launches: int
    graph_kernels: int
    by_name: Annotated[tuple[DelayName, ...], table("Launch delay per kernel")]
    histogram: Annotated[tuple[DelayBin, ...], table("Launch delays")]
    negative: int
    notes: tuple[str, ...]
    since: str | UnsetType = UNSET
    no_call_duration: int | UnsetType = UNSET
    mean_us: float | UnsetType = UNSET
    p50_us: float | UnsetType = UNSET
    p90_us: float | UnsetType = UNSET
    max_us: float | UnsetType = UNSET


class CommOverlap(Record, frozen=True, kw_only=True):
    compute: str
    comm_us: float
    compute_us: float
    overlap_us: float
    overlap_pct: float | None
    families: tuple[str, ...]
    notes: tuple[str, ...]


# ---- inference serving (diagnostics.trace.serving) ----------------------------------------------------------

class ServingIteration(Record, frozen=True, kw_only=True):
    """One server iteration: its phase, batch and tokens where recorded, its time and the split of it
    (GPU time by what the kernels do, counted once; ``host_us``: the GPU waiting on the host)."""

    iteration: int
    annotation: str
    phase: str | None
    phase_from: str | None
    batch_size: int | None
    tokens: int | None
    prefill_requests: int | None
    decode_requests: int | None
    start_us: Annotated[float, _us("start")]
    host_span_us: Annotated[float, _us("host span")]
    time_us: Annotated[float, _us("iteration")]
    gpu_span_us: Annotated[float, _us("GPU span")]
    gpu_busy_us: Annotated[float, _us("GPU busy")]
    kernels: int
    graph_launches: int
    graph_kernels: int
    attention_us: Annotated[float, _us("attention")]
    GEMM_us: Annotated[float, _us("GEMM")]
    communication_us: Annotated[float, _us("communication")]
    sampling_us: Annotated[float, _us("sampling")]
    other_us: Annotated[float, _us("other compute")]
    copies_us: Annotated[float, _us("copies")]
    host_us: Annotated[float, _us("host (GPU idle)")]


class ServingPhase(Record, frozen=True, kw_only=True):
    phase: str
    iterations: int
    median_us: Annotated[float, _us("median iteration")]
    median_gpu_busy_us: Annotated[float, _us("median GPU busy")]
    tokens: int
    batch_size_median: float | None


class GraphReplay(Record, frozen=True, kw_only=True):
    """A CUDA / HIP graph launch and the kernels it replayed (joined by its correlation id)."""

    launch_name: str
    launch_start_us: Annotated[float, _us("launch")]
    iteration: int
    kernels: int
    span_us: Annotated[float, _us("GPU span")]
    gpu_us: Annotated[float, _us("kernel time")]


class GraphReplays(Record, frozen=True, kw_only=True):
    launches: int
    kernels: int
    gpu_us: float
    share_of_gpu: float | None
    by_launch: tuple[GraphReplay, ...]


class Serving(Record, frozen=True, kw_only=True):
    """An inference server's trace read as iterations (vLLM, SGLang); absent for other traces."""

    available: bool
    reason: str | UnsetType = UNSET
    engine: str | None = None
    phase_source: str | UnsetType = UNSET
    iterations: Annotated[tuple[ServingIteration, ...], table("Serving iterations")] = ()
    phases: tuple[ServingPhase, ...] = ()
    graphs: GraphReplays | UnsetType = UNSET
    split: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


# ---- one step's critical path (diagnostics.trace.critical_path; analyses/trace/critical_part.py) -----------------

class PathEvent(Record, frozen=True, kw_only=True):
    """An event on the path; ``start_us`` from the step's start, ``on_path_us`` its time on the path."""

    name: str
    kind: str
    where: str
    lane: str
    lane_key: str
    start_us: Annotated[float, _us("start")]
    dur_us: Annotated[float, _us("duration")]
    on_path_us: Annotated[float, _us("on the path")]
    wait_before_us: Annotated[float, _us("wait before")]
    waited_on: str


class PathKind(Record, frozen=True, kw_only=True):
    kind: str
    us: Annotated[float, _us("time on the path")]
    pct: Annotated[float | None, column("percent", "share of the step")]


class WhatIf(Record, frozen=True, kw_only=True):
    name: str
    kind: str
    calls: int
    on_path_us: Annotated[float, _us("on the path")]
    saving_us: Annotated[float, _us("step time saved")]
    step_us_after: Annotated[float, _us("step time after")]


class TypicalLatency(Record, frozen=True, kw_only=True):
    launch: float
    stream_gap: float
    sync_return: float


class CriticalPath(Record, frozen=True, kw_only=True):
    """One step's critical path, or (``available`` False) why there is none. The ranks' view keeps a compact
    one (``rank``, ``longest``: its longest events, no ``path``)."""

    available: bool
    reason: str | UnsetType = UNSET
    rank: int | UnsetType = UNSET
    notes: tuple[str, ...] | UnsetType = UNSET
    gpu_start_us: float | None | UnsetType = UNSET
    step: int | UnsetType = UNSET
    chosen_as: str | UnsetType = UNSET
    incomplete_steps: tuple[int, ...] | UnsetType = UNSET
    step_start_us: float | UnsetType = UNSET
    step_us: float | UnsetType = UNSET
    host_span_us: float | UnsetType = UNSET
    length_us: float | UnsetType = UNSET
    factor: float | UnsetType = UNSET
    events: int | UnsetType = UNSET
    edges: int | UnsetType = UNSET
    path_events: int | UnsetType = UNSET
    path: Annotated[tuple[PathEvent, ...] | UnsetType, table("Critical path")] = UNSET
    by_kind: Annotated[tuple[PathKind, ...] | UnsetType, table("Critical path by kind")] = UNSET
    what_if: Annotated[tuple[WhatIf, ...] | UnsetType, table("Critical path what-ifs")] = UNSET
    typical_us: TypicalLatency | UnsetType = UNSET
    gpu_window_us: float | None | UnsetType = UNSET
    #: the step written out as a Chrome trace with the path marked
    trace_file: str | UnsetType = UNSET
    longest: tuple[PathEvent, ...] | UnsetType = UNSET


# ---- several ranks (diagnostics.trace.ranks.analyse_ranks) ----------------------------------------------------

class RankRow(Record, frozen=True, kw_only=True):
    """One rank's file: medians per profiler step (ms; GPU figures None on a CPU trace) and its lateness at
    the collectives (None: no collective matched)."""

    rank: int
    rank_source: str
    name: str
    file: str
    steps: int
    step_ms_median: float | None
    step_ms_max: float | None
    gpu_busy_ms_median: float | None
    gpu_idle_ms_median: float | None
    gpu_idle_pct: float | None
    compute_ms_median: float | None
    comm_ms_median: float | None
    overlap_ms_median: float | None
    exposed_comm_ms_median: float | None
    busy_ms_median: float | None
    late_us_median: float | None
    arrived_last: int | None
    waited_ms: float | None
    caused_wait_ms: float | None


class Problem(Record, frozen=True, kw_only=True):
    """A sign that the ranks are not one run (checks.CHECKS)."""

    check: str
    message: str


class CollectiveName(Record, frozen=True, kw_only=True):
    name: str
    family: str
    collectives: int
    skew_us_median: float
    skew_us_max: float
    transfer_us_median: float
    bytes_median: float | None
    bytes_total: int
    busbw_median: float | None


class MatchedCollective(Record, frozen=True, kw_only=True):
    key: str
    name: str
    family: str
    step: int
    ranks: int
    skew_us: float
    first_rank: int
    last_rank: int
    transfer_us: float
    max_dur_us: float
    bytes: int
    group_n: int
    algbw: float | None
    busbw: float | None


class StepSkew(Record, frozen=True, kw_only=True):
    step: int
    collectives: int
    skew_us_max: float
    skew_us_median: float
    transfer_us: float


class RankCollectives(Record, frozen=True, kw_only=True):
    """The same collectives across the ranks: matched on every rank or on some, by name, widest skew, per step."""

    matched: int
    partial: int
    by_name: tuple[CollectiveName, ...]
    widest: tuple[MatchedCollective, ...]
    by_step: tuple[StepSkew, ...]
    events: tuple[str, ...]
    matched_by: tuple[str, ...]


class RankStraggler(Record, frozen=True, kw_only=True):
    rank: int
    late_us_median: float
    over_us: float


class LateCollective(Record, frozen=True, kw_only=True):
    key: str
    name: str
    step: int
    rank: int
    late_us: float
    excess_us: float
    rank_late_us_median: float


class Wait(Record, frozen=True, kw_only=True):
    rank: int
    waited_for: int
    ms: float
    collectives: int


class LateThresholds(Record, frozen=True, kw_only=True):
    """The limits stragglers and late collectives are judged by (all unset when no collective matched)."""

    straggler_limit_us: float | UnsetType = UNSET
    ranks_late_us_median: float | UnsetType = UNSET
    ranks_spread_us: float | UnsetType = UNSET
    late_limit_us: float | UnsetType = UNSET


class Clock(Record, frozen=True, kw_only=True):
    aligned: str
    offsets_us: dict[str, float]


class Heatmap(Record, frozen=True, kw_only=True):
    """Step time (ms) per rank (rows) and profiler step (columns; ``binned`` steps per column); None: no such step."""

    ranks: tuple[int, ...]
    steps: tuple[int, ...]
    step_ms: tuple[tuple[float | None, ...], ...]
    binned: int


class Worker(Record, frozen=True, kw_only=True):
    worker: str
    ranks: int
    seconds: float
    peak_rss_bytes: int


class FailedRank(Record, frozen=True, kw_only=True):
    name: str
    file: str
    error: str


class TimelineError(Record, frozen=True, kw_only=True):
    rank: int
    error: str


class SummaryCache(Record, frozen=True, kw_only=True):
    hits: int
    misses: int
    kept: bool


class Ranks(Record, frozen=True, kw_only=True):
    """Several ranks' traces of one job: the per-rank table, the cross-rank views, the "not one run" problems,
    the slowest rank's critical path and the picked ranks on one timeline."""

    ranks: tuple[RankRow, ...]
    slowest_rank: int | None
    fastest_rank: int | None
    spread: float | None
    problems: tuple[Problem, ...]
    collectives: RankCollectives
    stragglers: tuple[RankStraggler, ...]
    late_collectives: tuple[LateCollective, ...]
    waits: tuple[Wait, ...]
    thresholds: LateThresholds
    clock: Clock
    heatmap: Heatmap
    critical_path_rank: int
    alignment: str
    workers: tuple[Worker, ...]
    failed: tuple[FailedRank, ...]
    n_files: int
    notes: tuple[str, ...]
    start_skew_max_s: float
    mode: str
    timeline: Timeline
    timeline_ranks: tuple[int, ...]
    timeline_errors: tuple[TimelineError, ...]
    critical_path: CriticalPath | UnsetType = UNSET
    memory_limit_bytes: int | UnsetType = UNSET
    cache: SummaryCache
    seconds: float


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

class DiffRow(Record, frozen=True, kw_only=True):
    kind: str
    name: str
    status: str
    calls_before: float
    calls_after: float
    time_us_before: float
    time_us_after: float
    delta_us: float
    ratio: float | None


class DiffCounts(Record, frozen=True, kw_only=True):
    added: int
    removed: int
    faster: int
    slower: int
    unchanged: int


class DiffLeftOut(Record, frozen=True, kw_only=True):
    """GPU time a diff leaves out of one trace, as the trace analysis' step figures do (µs)."""

    before_profiling_us: float
    outside_steps_us: float


class TraceDiff(Record, frozen=True, kw_only=True):
    """Per operator / kernel, time before and after (``unit``: per step, or the whole trace)."""

    unit: str
    steps_before: int
    steps_after: int
    time_us_before: float
    time_us_after: float
    counts: DiffCounts
    rows: Annotated[tuple[DiffRow, ...], table("Changes")]
    change_ratio: float
    noise_floor_us: float
    left_out_before: DiffLeftOut | UnsetType = UNSET   # UNSET: a stored diff that predates it (#42)
    left_out_after: DiffLeftOut | UnsetType = UNSET


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
