"""The records of critical_path.critical_path: one step's critical path, its time by kind and what-ifs
(µs; ``start_us`` from the step's start)."""

from __future__ import annotations

from typing import Annotated

from diagnostics.declare import column, table
from diagnostics.results import UNSET, Record, UnsetType

_us = lambda label: column("us", label)  # noqa: E731


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
    """Every call of a name in the step ``factor`` times faster, the calls nested in them too.
    ``on_path_us``: the calls' own time on the path; ``sped_up_us``: what the what-if cuts on the path (their
    own time and their nested calls'): ``saving_us`` is at most (1 - 1/factor) of it."""

    name: str
    kind: str
    calls: int
    on_path_us: Annotated[float, _us("on the path")]
    saving_us: Annotated[float, _us("step time saved")]
    step_us_after: Annotated[float, _us("step time after")]
    sped_up_us: Annotated[float | UnsetType, _us("on the path with nested calls")] = UNSET


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
