"""The records of diff.diff_traces: per operator / kernel, time before and after, and the counts of
each change."""

from __future__ import annotations

from typing import Annotated

from diagnostics.declare import table
from diagnostics.results import UNSET, Record, UnsetType


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
