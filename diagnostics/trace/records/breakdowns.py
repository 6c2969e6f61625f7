"""The records of breakdowns.py's views: summary (TraceSummary), temporal_breakdown (TemporalBreakdown),
top_operators (TopOperators), idle_time (IdleTime) and launch_stats (LaunchStats). Times are µs."""

from __future__ import annotations

from typing import Annotated

from diagnostics.declare import column, table
from diagnostics.results import UNSET, Record, UnsetType

_us = lambda label: column("us", label)  # noqa: E731


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
