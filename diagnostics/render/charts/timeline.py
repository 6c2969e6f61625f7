"""The one timeline figure, for the Profiler and the Trace explorer alike.

A lane per host thread / GPU stream, named as a user reads it (trace.timeline's labels); nested
calls are drawn as thinner bars inside their lane's band, not as extra rows. Bars carry their
event's name, shown on the bar once zoomed in far enough for it to fit (Plotly hides text that
does not fit and shows it again on zoom). Hover gives the name, lane, start, duration, the number
of events a merged bar stands for and, where the profile recorded them, the input shapes. A
search dims every bar but the events whose name matches, and ``find_events`` lists them.

It draws the trace layer's ``Timeline`` record (diagnostics/trace/records/timeline.py: times in µs,
lanes as records), which the profile result, the trace analyses' results and the ranks' merged
timeline all hold.
"""

from __future__ import annotations

from typing import NamedTuple

import plotly.graph_objects as go

from diagnostics.results import given
from diagnostics.trace.records.timeline import Timeline
from diagnostics.render.charts.style import empty_figure
from diagnostics.units import human_seconds

CAT_COLORS = {"user_annotation": "#B279A2", "cpu_op": "#4C78A8", "kernel": "#F58518", "gpu_memcpy": "#E45756",
              "gpu_memset": "#FF9DA6", "cuda_runtime": "#72B7B2", "cuda_driver": "#9D755D",
              "python_function": "#54A24B", "gpu_user_annotation": "#EECA3B", "cuda_sync": "#8C564B"}
OTHER_COLOR = "#BAB0AC"
#: smallest font for a name on a bar; names that do not fit at this size are hidden until zoomed in
MIN_TEXT_PX = 9
#: pixels per call depth inside a lane, and the least height of a lane
DEPTH_PX, LANE_MIN_PX = 20, 44
#: opacity of the bars a search does not match
DIMMED = 0.18


class Bars(NamedTuple):
    """The record's bars in the figure's terms: ``lanes`` [{label, kind, depths}] in drawing order, ``events``
    [{lane (its label), depth, name, cat, start_ms, dur_ms, count, shapes}] (ms; shapes "" where none)."""

    lanes: list[dict]
    events: list[dict]


def normalize(timeline: Timeline) -> Bars:
    """The Timeline record's lanes and bars as the figure draws them (Bars); counts stay on the record."""
    label = {l.lane: l.label or l.name or l.lane for l in timeline.lanes}
    kinds = {label[l.lane]: l.kind for l in timeline.lanes}
    order = [label[l.lane] for l in timeline.lanes]
    evs = [{"lane": label.get(e.lane, e.lane), "depth": e.depth, "name": e.name, "cat": e.cat,
            "start_ms": e.start_us / 1e3, "dur_ms": e.dur_us / 1e3, "count": e.count,
            "shapes": e.shapes if given(e.shapes) else ""}
           for e in timeline.events]
    for e in evs:  # lanes an event names but the lane list lacks still get drawn
        if e["lane"] not in kinds:
            order.append(e["lane"])
            kinds[e["lane"]] = "cpu"
    depths: dict = {}
    for e in evs:
        depths[e["lane"]] = max(depths.get(e["lane"], 0), e["depth"] + 1)
    lanes = [{"label": l, "kind": kinds[l], "depths": depths.get(l, 1)} for l in order if l in depths]
    return Bars(lanes=lanes, events=evs)


def matches(name: str, query: str) -> bool:
    """Case-insensitive substring match; a query in double quotes must match the whole name."""
    q = query.strip()
    if len(q) >= 2 and q[0] == q[-1] == '"':
        return name == q[1:-1]
    return q.lower() in name.lower()


def find_events(timeline: Timeline, query: str, limit: int = 200) -> list[dict]:
    """The drawn events whose name matches ``query`` (see ``matches``), longest first: lane, name,
    start (ms), duration (ms), depth, count, shapes."""
    if not query or not query.strip():
        return []
    hits = [e for e in normalize(timeline).events if matches(e["name"], query)]
    hits.sort(key=lambda e: -e["dur_ms"])
    return hits[:limit]


def build_timeline_figure(timeline: Timeline, *, search: str | None = None, title: str | None = None) -> go.Figure:
    """Zoomable timeline bars (module doc); ``search`` dims the events whose name does not match."""
    bars = normalize(timeline)
    events = bars.events
    if not events:
        return empty_figure(title or "Timeline", "No events in this range").update_layout(height=200)
    fig = go.Figure()
    depth_of = {l["label"]: l["depths"] for l in bars.lanes}
    query = (search or "").strip()
    n_hits = 0
    by_cat: dict = {}
    for e in events:
        by_cat.setdefault(e["cat"] or "other", []).append(e)
    for cat, evs in sorted(by_cat.items()):
        band = [0.84 / depth_of[e["lane"]] for e in evs]
        hit = [matches(e["name"], query) for e in evs] if query else [True] * len(evs)
        n_hits += sum(hit) if query else 0
        fig.add_bar(
            y=[e["lane"] for e in evs], x=[max(e["dur_ms"], 1e-7) for e in evs], base=[e["start_ms"] for e in evs],
            orientation="h", name=cat, marker_color=CAT_COLORS.get(cat, OTHER_COLOR),
            marker_opacity=[1.0 if h else DIMMED for h in hit],
            marker_line=dict(width=[1.5 if (h and query) else 0 for h in hit], color="#111"),
            # parents on top, children below them (as Perfetto and chrome://tracing draw it)
            width=band, offset=[0.42 - (e["depth"] + 1) * b for e, b in zip(evs, band)],
            text=[e["name"] for e in evs], textposition="inside", insidetextanchor="start",
            textfont=dict(color="white", size=11), constraintext="inside", cliponaxis=True,
            customdata=[[e["name"], human_seconds(e["dur_ms"] / 1e3), e["depth"], e["count"],
                         f"<br>shapes {e['shapes']}" if e["shapes"] else "", e["lane"]] for e in evs],
            hovertemplate="<b>%{customdata[0]}</b><br>%{customdata[5]}<br>start %{base:.3f} ms · duration "
                          "%{customdata[1]}%{customdata[4]}<br>depth %{customdata[2]} · stands for %{customdata[3]} "
                          "event(s)<extra>" + cat + "</extra>")
    lanes = [l["label"] for l in bars.lanes]
    deeper = timeline.deeper
    shown = f"{timeline.shown:,} of {timeline.in_range:,} events" + (
        " (downsampled: the longest kept, a bar may stand for several)" if timeline.shown < timeline.in_range - deeper
        else "") + (f"; {deeper:,} calls nested too deep to draw" if deeper else "")
    if query:
        shown += f"; {n_hits:,} match '{query}'"
    height = sum(max(LANE_MIN_PX, DEPTH_PX * depth_of[l]) for l in lanes) + 150
    fig.update_layout(
        title=f"{title or 'Timeline'}: {shown}", barmode="overlay", template="plotly_white",
        xaxis=dict(title="time since the first event (ms)", showgrid=True),
        yaxis=dict(title="thread / stream", categoryorder="array", categoryarray=list(reversed(lanes)),
                   automargin=True),
        uniformtext=dict(minsize=MIN_TEXT_PX, mode="hide"),
        height=min(max(300, height), 2400), margin=dict(l=10, r=10, t=60, b=40),
        legend=dict(orientation="h", y=1.02, x=1, xanchor="right", yanchor="bottom", title_text=""),
        dragmode="zoom", hoverlabel=dict(align="left"))
    return fig
