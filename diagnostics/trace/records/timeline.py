"""The timeline's records: what timeline.timeline_data returns (and ranks.merge_timelines, several ranks on
one axis). Times are µs from the trace's first event."""

from __future__ import annotations

from diagnostics.results import UNSET, Record, UnsetType


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
