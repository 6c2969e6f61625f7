"""The records of gpu_activity.py (Holistic Trace Analysis parity): kernel sequences, the launch queue,
copy bandwidth, GPU user annotations, launch delay and the communication overlap. Times are µs."""

from __future__ import annotations

from typing import Annotated

from diagnostics.declare import column, table
from diagnostics.results import UNSET, Record, UnsetType

_us = lambda label: column("us", label)  # noqa: E731


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
