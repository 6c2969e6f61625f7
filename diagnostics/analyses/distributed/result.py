"""The typed result of the distributed analyses ("distributed": a torchrun launch, then the analysis of its
ranks' traces; "distributed_traces": a folder of per-rank traces): DistributedResult.

job.py builds it from the per-rank breakdowns (diagnostics.trace.comm) with results.build. Times are ms
(step medians per rank), fractions 0..1. Torch-free, like the declarations.
"""

from __future__ import annotations

from typing import Annotated

from diagnostics.declare import column, metric, table
from diagnostics.results import UNSET, Record, Result, UnsetType

_ms = lambda label: column("ms", label)  # noqa: E731


class DistributedMetrics(Record, frozen=True, kw_only=True):
    world_size: Annotated[int, metric("count", "World size")]
    ranks_loaded: Annotated[int, metric("count", "Ranks loaded")]
    steps_per_rank: Annotated[int, metric("count", "Profiled steps per rank")]
    median_step_ms: Annotated[float, metric("ms", "Step time (median)")]
    max_step_ms: Annotated[float, metric("ms", "Step time (max)")]
    median_busy_ms: Annotated[float, metric("ms", "Busy time (median)", "step time less exposed communication")]
    comm_fraction: Annotated[float, metric("fraction", "Communication", "share of step time in collectives")]
    exposed_comm_fraction: Annotated[float, metric("fraction", "Exposed communication",
                                                   "communication while nothing computes")]
    #: None: no communication to overlap
    overlap_ratio: Annotated[float | None, metric("fraction", "Overlap",
                                                  "share of communication hidden behind computation")]
    stragglers: Annotated[int, metric("count", "Stragglers")]
    files_skipped: Annotated[int, metric("count", "Files skipped (not traces)")]


class RankRow(Record, frozen=True, kw_only=True):
    """One rank: medians over its profiled steps (ms), and its straggler test (leave-one-out: against the
    median of the other ranks; None with one rank)."""

    rank: int
    file: str
    steps: int
    step_ms: Annotated[float, _ms("step")]
    compute_ms: Annotated[float, _ms("compute")]
    comm_ms: Annotated[float, _ms("comm")]
    overlap_ms: Annotated[float, _ms("overlap")]
    compute_only_ms: Annotated[float, _ms("compute only")]
    exposed_comm_ms: Annotated[float, _ms("exposed comm")]
    other_ms: Annotated[float, _ms("other")]
    busy_ms: Annotated[float, _ms("busy")]
    overlap_ratio: Annotated[float | None, column("fraction", "overlap")]
    #: the steps' wall clock (perf_counter / CUDA events around each step) from a launched run's sidecar
    wall_step_ms: Annotated[float | None, _ms("wall step")]
    straggler: bool
    others_median_ms: Annotated[float | None, _ms("others median")]
    threshold_ms: Annotated[float | None, _ms("threshold")]
    busy_excess_pct: Annotated[float | None, column("percent", "busy excess")]


class StepRow(Record, frozen=True, kw_only=True):
    """One profiled step of one rank: computation, communication, their overlap and the rest (ms)."""

    rank: int
    step: int
    step_ms: float
    compute_ms: float
    comm_ms: float
    overlap_ms: float
    compute_only_ms: float
    exposed_comm_ms: float
    other_ms: float
    busy_ms: float


class Collective(Record, frozen=True, kw_only=True):
    """The calls of one collective (name, where it runs) over every rank's profiled steps; bytes None when
    some call's size was not recorded."""

    name: str
    family: str | None
    where: str
    calls: int
    ranks: int
    total_ms: Annotated[float, _ms("total")]
    max_ms: Annotated[float, _ms("max")]
    bytes: Annotated[int | None, column("bytes", "bytes")]
    mean_ms: Annotated[float, _ms("mean")]
    mean_bytes: Annotated[float | None, column("bytes", "mean bytes")]


class RankThreshold(Record, frozen=True, kw_only=True):
    others_median_ms: float
    threshold_ms: float


class Thresholds(Record, frozen=True, kw_only=True):
    """The straggler rule and its headline figures: the busiest rank's (``compared_rank``) threshold, the
    lowest of all ranks'; ``per_rank``: every rank's own (keyed by the rank as text)."""

    metric: str
    rule: str
    median_ms: float
    median_all_ms: float
    margin: float
    min_excess_ms: float
    threshold_ms: float
    compared_rank: int | None
    per_rank: dict[str, RankThreshold]


class RankInfo(Record, frozen=True, kw_only=True):
    """What a rank's trace says of its job (distributedInfo)."""

    rank: int | UnsetType = UNSET
    world_size: int | UnsetType = UNSET
    backend: str | UnsetType = UNSET


class SkippedFile(Record, frozen=True, kw_only=True):
    file: str
    reason: str


class CpuUse(Record, frozen=True, kw_only=True):
    """A launched run on the CPU: ranks x threads against the cores (oversubscribed: no rank is called a
    straggler)."""

    ranks: int
    threads_per_rank: int
    cores: int
    oversubscribed: bool


class Launch(Record, frozen=True, kw_only=True):
    command: str
    nproc: int
    backend: str
    backend_requested: str
    backend_reason: str
    duration_s: float
    straggler_rank: int | None
    straggler_sleep_ms: float


class DistributedResult(Result, frozen=True, kw_only=True):
    """Every rank's step split, the collectives, the stragglers; ``source``: "launch" (``launch`` and ``cpu``
    say how) or "folder"."""

    folder: str
    backend: str
    device_kind: str
    metrics: DistributedMetrics
    ranks: Annotated[tuple[RankRow, ...], table("Ranks")]
    steps: Annotated[tuple[StepRow, ...], table("Steps per rank")]
    collectives: Annotated[tuple[Collective, ...], table("Collectives")]
    stragglers: tuple[int, ...]
    thresholds: Thresholds
    distributed_info: dict[str, RankInfo]
    notes: tuple[str, ...]
    skipped_files: Annotated[tuple[SkippedFile, ...], table("Files skipped (not traces)")] = ()
    source: str
    cpu: CpuUse | UnsetType = UNSET
    launch: Launch | UnsetType = UNSET
