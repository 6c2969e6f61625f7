"""The timeline's records: what timeline.timeline_data returns (and ranks.merge_timelines, several ranks on
one axis; profiler_tables.timeline, the profile's, with input shapes). Times are µs from the trace's first event.

``from_legacy`` reads the profile's timeline as runs stored before it was typed hold it (times in ms, lanes
as their labels), for the profile result's decode hook (analyses.profile.ProfileResult.upgrade)."""

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
    #: the operator's recorded input shapes ("[[8,64],[64]]"), where the profile recorded them
    shapes: str | UnsetType = UNSET


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


def is_legacy(plain) -> bool:
    """A stored profile timeline of the shape before this record (ms, lanes as labels, ``shown_events``)."""
    return isinstance(plain, dict) and "shown_events" in plain and "in_range" not in plain


def from_legacy(plain: dict) -> Timeline:
    """The profile's timeline as stored before it was typed ({"lanes": [label, ...], "events": [{lane (a label),
    depth, name, cat, start_ms, dur_ms, count, shapes}], "total_events", "shown_events", "deeper", "span_ms",
    "builder"}) as a Timeline: µs, each label a lane of its own (a GPU stream's label starts "GPU"); the range
    from the first bar to ``span_ms`` (the bars' end where it is missing); ``bucket_us`` 0 (the old form did not
    say; a merged bar still has its ``count``); an empty ``shapes`` left out."""
    events = tuple(TimelineEvent(lane=str(e["lane"]), depth=int(e.get("depth", 0)), name=str(e["name"]),
                                 cat=str(e.get("cat") or ""), start_us=float(e["start_ms"]) * 1e3,
                                 dur_us=float(e["dur_ms"]) * 1e3, count=int(e.get("count", 1)),
                                 shapes=str(e["shapes"]) if e.get("shapes") else UNSET)
                   for e in plain.get("events") or ())
    labels = list(plain.get("lanes") or ())
    labels += [lane for lane in dict.fromkeys(e.lane for e in events) if lane not in labels]
    lanes = tuple(TimelineLane(lane=label, kind="gpu" if label.startswith("GPU") else "cpu", name=label, label=label)
                  for label in labels)
    end = max((e.start_us + e.dur_us for e in events), default=0.0)
    span = plain.get("span_ms")
    return Timeline(t0=min((e.start_us for e in events), default=0.0),
                    t1=float(span) * 1e3 if span is not None else end, lanes=lanes, events=events,
                    in_range=int(plain.get("total_events", len(events))), shown=int(plain.get("shown_events", len(events))),
                    bucket_us=0.0, deeper=int(plain.get("deeper") or 0))
