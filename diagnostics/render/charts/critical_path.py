"""Figures and report sections for a step's critical path (the trace result's ``critical_path``, or a
trace_critical_path run's: diagnostics.trace.critical_path): time on the path by kind, the path on a
timeline, the what-ifs."""

from __future__ import annotations

import plotly.graph_objects as go

from diagnostics.analyses.trace.result import CriticalPath, Timeline, TraceCriticalPathResult, TraceResult
from diagnostics.render.charts.style import bottom_up_labels, empty_figure
from diagnostics.results import given

from diagnostics.render.sections import Section, section
from diagnostics.render.tables import records_frame

KIND_COLORS = {"cpu": "#4c78a8", "launch": "#f58518", "runtime": "#eeca3b", "kernel": "#54a24b", "copy": "#b279a2",
               "sync": "#e45756", "earlier-steps": "#9d755d", "idle-wait": "#bab0ac"}
#: Path events drawn on the timeline at most (the longest kept).
MAX_DRAWN = 1500
#: What the path is, shown under its charts.
CRITICAL_PATH_HELP = (
    "The critical path is the chain of dependent events (host calls in thread order, launch -> GPU work, "
    "GPU work in stream order, a sync -> the GPU work it waited for) whose summed length is the step's time: "
    "from the step's start to the end of its host span or of its last GPU work, whichever is later (when the "
    "GPU runs behind the CPU this is longer than the CPU step of the Steps table; 'earlier-steps' is the GPU "
    "still busy with work launched before the step). "
    "Shortening an event off the path does not shorten the step. A what-if makes every call of a name in the "
    "step faster and computes the longest path again; a queued kernel's launch or stream latency is taken as "
    "the median of those that decided a start, so the saving can be less than the time cut.")


def headline(cp: CriticalPath) -> str:
    """One sentence: the step, its time, and the largest kind on the path."""
    if not cp.available:
        return f"Critical path not computed: {cp.reason}"
    top = max(cp.by_kind, key=lambda r: r.us)
    cut = cp.incomplete_steps or ()
    spans = f"CPU step {cp.host_span_us / 1e3:,.3f} ms"
    if given(cp.gpu_window_us):
        spans += f", GPU window {cp.gpu_window_us / 1e3:,.3f} ms"
    return (f"Step {cp.step}" + (f" ({cp.chosen_as})" if cp.chosen_as else "")
            + f": {cp.length_us / 1e3:,.3f} ms on the critical path from the step's start to the end of its "
            f"last work ({spans}; {cp.path_events:,} of {cp.events:,} events on the path); the largest part "
            f"is {top.kind}, "
            f"{top.us / 1e3:,.3f} ms ({top.pct or 0:.1f} %)."
            + (f" Steps cut short by the end of profiling (a kernel launch with no kernel in the trace): "
               f"{', '.join(map(str, cut))}." if cut else ""))


def build_critical_path_breakdown_figure(cp: CriticalPath) -> go.Figure:
    """Time on the critical path by kind (ms), each bar labelled."""
    rows = cp.by_kind or ()
    if not rows:
        return empty_figure("Critical path by kind", "No critical path")
    fig = go.Figure(go.Bar(
        x=[r.kind for r in rows], y=[r.us / 1e3 for r in rows],
        marker_color=[KIND_COLORS.get(r.kind, "#888") for r in rows],
        text=[f"{r.us / 1e3:,.3f} ms" for r in rows], textposition="outside",
        hovertemplate="%{x}: %{y:.3f} ms<extra></extra>"))
    fig.update_layout(title=f"Step {cp.step}: time on the critical path by kind "
                            f"(total {cp.length_us / 1e3:,.3f} ms)",
                      xaxis_title="kind", yaxis_title="time on the path (ms)")
    return fig


def build_critical_path_timeline_figure(cp: CriticalPath) -> go.Figure:
    """The path's events on a timeline (ms from the step's start), one row per thread / stream."""
    path = cp.path or ()
    if not path:
        return empty_figure("Critical path on the timeline", "No critical path")
    drawn = sorted(path, key=lambda r: -r.dur_us)[:MAX_DRAWN]
    lanes = sorted({r.where for r in drawn}, key=lambda w: (w.startswith("GPU"), w))
    fig = go.Figure()
    for kind in KIND_COLORS:
        rows = [r for r in drawn if r.kind == kind]
        if not rows:
            continue
        fig.add_trace(go.Bar(
            name=kind, orientation="h", base=[r.start_us / 1e3 for r in rows],
            x=[max(r.dur_us, 0.0) / 1e3 for r in rows], y=[r.where for r in rows],
            marker_color=KIND_COLORS[kind],
            customdata=[[r.name, r.dur_us, r.on_path_us, r.waited_on or "-"] for r in rows],
            hovertemplate="%{customdata[0]}<br>%{customdata[1]:.1f} µs, %{customdata[2]:.1f} µs on the path"
                          "<br>waited on: %{customdata[3]}<extra></extra>"))
    # The path's order, as a line through the events' starts.
    fig.add_trace(go.Scatter(x=[r.start_us / 1e3 for r in path[:MAX_DRAWN]],
                             y=[r.where for r in path[:MAX_DRAWN]], mode="lines", name="path order",
                             line={"color": "black", "width": 1}, hoverinfo="skip"))
    fig.update_layout(barmode="overlay", title=f"Critical path of step {cp.step} on the timeline",
                      xaxis_title="time from the step's start (ms)",
                      yaxis={"categoryorder": "array", "categoryarray": lanes[::-1]},
                      height=max(260, 40 * len(lanes) + 160))
    return fig


def build_what_if_figure(cp: CriticalPath) -> go.Figure:
    """Step time saved if each name's calls were ``factor`` times faster (ms)."""
    rows = (cp.what_if or ())[::-1]
    title = f"What if it were {cp.factor if given(cp.factor) else 2:g}x faster: step time saved"
    if not rows:
        return empty_figure(title, "Nothing on the path to speed up")
    fig = go.Figure(go.Bar(
        x=[r.saving_us / 1e3 for r in rows], y=bottom_up_labels([r.name for r in rows], 50), orientation="h",
        marker_color=[KIND_COLORS.get(r.kind, "#888") for r in rows],
        text=[f"{r.saving_us / 1e3:,.3f} ms" for r in rows], textposition="outside",
        customdata=[[r.name, r.on_path_us / 1e3, r.calls, (r.sped_up_us if given(r.sped_up_us) else r.on_path_us) / 1e3]
                    for r in rows],
        hovertemplate="%{customdata[0]} (%{customdata[2]} calls)<br>%{customdata[1]:.3f} ms on the path, "
                      "%{customdata[3]:.3f} ms with the calls nested in them<br>saves %{x:.3f} ms<extra></extra>"))
    # room right of the longest bar for its value (drawn outside the bar, it was cut at the plot's edge)
    top = max(r.saving_us for r in rows) / 1e3
    fig.update_xaxes(range=[0, top * 1.22 if top > 0 else 1])
    fig.update_layout(title=title, xaxis_title="step time saved (ms)", height=max(280, 28 * len(rows) + 140))
    return fig


def _sections(cp: CriticalPath | None) -> list[Section]:
    if not cp:
        return []
    if not cp.available:
        return [Section("Critical path", text=[headline(cp)])]
    return [section("Critical path", [lambda: build_critical_path_breakdown_figure(cp),
                                      lambda: build_critical_path_timeline_figure(cp),
                                      lambda: build_what_if_figure(cp)],
                    text=[headline(cp), *(cp.notes or ()), CRITICAL_PATH_HELP],
                    tables=[("path", records_frame(cp.path)), ("what-ifs", records_frame(cp.what_if))])]


def critical_path_sections(result: TraceResult) -> list[Section]:
    """The report's critical-path section (none when the result predates the critical path)."""
    return _sections(result.critical_path)


def critical_path_part_sections(result: TraceCriticalPathResult) -> list[Section]:
    """The report of a trace_critical_path run: another step's critical path of a trace opened before."""
    return _sections(result.critical_path)


def mark_critical_path(fig: go.Figure, cp: CriticalPath | None, timeline: Timeline | None = None) -> go.Figure:
    """The trace timeline figure with the critical path drawn over it: a line through the path's events
    in order, a marker at each one's start (hover: its time on the path). ``timeline`` (the
    timeline the figure was drawn from) names its rows: a lane's label where it has one, else
    the path row's own "pid/tid · depth" label. Events whose row the figure does not draw (a range that
    leaves them out) are skipped."""
    if not cp or not cp.available or not cp.path:
        return fig
    rows = set(fig.layout.yaxis.categoryarray or ())
    labels = {lane.lane: lane.label for lane in (timeline.lanes if timeline else ()) if lane.label}
    t0 = float(cp.step_start_us or 0.0)
    pts = []
    for r in cp.path:
        y = labels.get(r.lane_key) or r.lane
        if y in rows:
            pts.append((r, y))
    if not pts:
        return fig
    fig.add_trace(go.Scatter(
        x=[(t0 + r.start_us) / 1e3 for r, _ in pts], y=[y for _, y in pts], mode="lines+markers",
        name=f"critical path (step {cp.step})", line={"color": "#d62728", "width": 2},
        marker={"symbol": "diamond", "size": 8, "color": "#d62728"},
        customdata=[[r.name, r.on_path_us, r.kind] for r, _ in pts],
        hovertemplate="critical path: %{customdata[0]} (%{customdata[2]})<br>%{customdata[1]:.1f} µs on the path"
                      "<extra></extra>"))
    return fig
