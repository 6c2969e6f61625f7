"""The records of ranks.analyse: several ranks' traces of one job (the per-rank table, the cross-rank
views, the "not one run" problems, the slowest rank's critical path, the picked ranks on one timeline)."""

from __future__ import annotations

from diagnostics.results import UNSET, Record, UnsetType
from diagnostics.trace.records.critical_path import CriticalPath
from diagnostics.trace.records.timeline import Timeline


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
