"""Figures for the trace explorer, each drawn from one part of the trace analysis' typed result
(diagnostics.analyses.trace.result)."""

from __future__ import annotations

import plotly.graph_objects as go

from diagnostics.analyses.trace.result import (
    GraphLaunches, IdleTime, LaunchStats, TemporalBreakdown, Timeline, TopOperators, TraceDiff,
    TraceDiffResult, TraceResult, TraceSummary,
)

from diagnostics.render.charts.style import bottom_up_labels, empty_figure, readable_axes
from diagnostics.render.charts.ranks import ranks_sections
from diagnostics.render.charts.timeline import build_timeline_figure as draw_timeline
from diagnostics.render.charts.critical_path import critical_path_sections, mark_critical_path
from diagnostics.units import column_scale
from diagnostics.render.sections import Section, section
from diagnostics.render.tables import records_frame
from diagnostics.render.trace_text import communication_lines  # plotly-free words (render.text's)

from diagnostics.render.charts.trace_hta import hta_sections  # the HTA-parity sections (#18)
from diagnostics.render.charts.serving import serving_sections  # an inference server's iterations (#42)

GPU_KINDS = (("compute_us", "compute", "#4c78a8"), ("communication_us", "communication", "#f58518"),
             ("memcpy_us", "memcpy", "#54a24b"), ("memset_us", "memset", "#b279a2"),
             ("idle_us", "idle", "#bab0ac"))
STATUS_COLORS = {"faster": "#54a24b", "slower": "#e45756", "added": "#f58518",
                 "removed": "#4c78a8", "unchanged": "#bab0ac"}
MAX_BARS = 25
#: What a step's GPU bar covers (temporal_breakdown's definition), shown under the chart.
GPU_WINDOW_HELP = ("GPU work counts in the step whose CPU launched it (correlation id or flow arrow). A step's "
                   "window runs from its first GPU event to the next step's first, so the windows follow each "
                   "other and add up to the GPU's span; idle is the window less busy time.")


#: The x label of temporal_breakdown's step -1: a trace without ProfilerStep ranges, read as one window.
WHOLE_TRACE = "whole trace (no steps)"


def _step_label(step: int) -> str:
    return WHOLE_TRACE if step == -1 else str(step)


def build_category_figure(summary: TraceSummary) -> go.Figure:
    """Event count per category (hover: total time)."""
    rows = summary.categories
    fig = go.Figure(go.Bar(x=[r.cat for r in rows], y=[r.events for r in rows],
                           customdata=[r.total_us / 1000 for r in rows],
                           hovertemplate="%{x}: %{y:,} events, %{customdata:.3f} ms<extra></extra>"))
    fig.update_layout(title="Events by category", yaxis_title="events (count)", xaxis_title=None)
    return fig


def build_gpu_breakdown_figure(breakdown: TemporalBreakdown) -> go.Figure:
    """Per step, GPU time by kind stacked with idle (temporal_breakdown)."""
    rows = breakdown.gpu
    if not rows:
        return empty_figure("GPU time per step", "No GPU activity in this trace")
    steps = [_step_label(r.step) for r in rows]
    fig = go.Figure([go.Bar(name=label, x=steps, y=[getattr(r, key) / 1000 for r in rows],
                            marker_color=color) for key, label, color in GPU_KINDS])
    fig.update_layout(barmode="stack", title="GPU time per step", xaxis_title="step",
                      yaxis_title="ms", xaxis_type="category")
    return fig


def build_cpu_breakdown_figure(breakdown: TemporalBreakdown) -> go.Figure:
    """Per step, host self time by operator family / category (temporal_breakdown)."""
    rows = breakdown.cpu
    if not rows:
        return empty_figure("Host self time per step", "No host events in the steps")
    groups = sorted({r.group for r in rows},
                    key=lambda g: -sum(r.self_us for r in rows if r.group == g))
    steps = sorted({r.step for r in rows})
    value = {(r.step, r.group): r.self_us / 1000 for r in rows}
    fig = go.Figure([go.Bar(name=g, x=[_step_label(s) for s in steps],
                            y=[value.get((s, g), 0.0) for s in steps]) for g in groups])
    fig.update_layout(barmode="stack", title="Host self time per step", xaxis_title="step",
                      yaxis_title="ms", xaxis_type="category")
    return fig


def build_top_operators_figure(top: TopOperators, kind: str = "operators") -> go.Figure:
    """Top host operators by self time (kind="operators") or GPU kernels by time ("kernels")."""
    if kind not in ("operators", "kernels"):
        raise ValueError(f"kind must be 'operators' or 'kernels', not {kind!r}")
    ops = kind == "operators"
    rows = (top.operators if ops else top.kernels)[:MAX_BARS]
    title = "Top operators by self time" if ops else "Top GPU kernels by time"
    if not rows:
        return empty_figure(title, "None in this trace")
    rows = rows[::-1]
    fig = go.Figure(go.Bar(
        x=[(r.self_us if ops else r.total_us) / 1000 for r in rows], y=bottom_up_labels([r.name for r in rows]),
        orientation="h", customdata=[[r.calls, r.total_us / 1000, r.name] for r in rows],
        hovertemplate="%{customdata[2]}<br>%{x:.3f} ms, %{customdata[0]} calls, "
                      "total %{customdata[1]:.3f} ms<extra></extra>"))
    fig.update_layout(title=title, xaxis_title="time (ms)", height=max(300, 22 * len(rows) + 120))
    return readable_axes(fig)


def build_idle_time_figure(idle: IdleTime) -> go.Figure:
    """Idle time per GPU stream, split by cause (idle_time)."""
    rows = idle.streams
    if not rows:
        return empty_figure("GPU idle time by cause", "No GPU activity in this trace")
    labels = [f"GPU {r.device} stream {r.stream}" for r in rows]
    causes = (("host_wait_us", "host wait"), ("kernel_wait_us", "kernel wait"),
              ("other_wait_us", "other wait"))
    fig = go.Figure([go.Bar(name=name, x=labels, y=[getattr(r, key) / 1000 for r in rows])
                     for key, name in causes])
    fig.update_layout(barmode="stack", title="GPU idle time by cause", yaxis_title="ms")
    return fig


def build_launch_figure(launch: LaunchStats) -> go.Figure:
    """Launch call duration vs GPU duration; points under the diagonal are launch-bound."""
    pts = launch.sample
    if not pts:
        return empty_figure("Kernel launches", "No kernel launches in this trace")
    x = [p.launch_dur_us for p in pts]
    y = [p.dur_us for p in pts]
    top = max(max(x), max(y))
    fig = go.Figure([
        go.Scatter(x=x, y=y, mode="markers", name="launches", text=[p.name for p in pts],
                   customdata=[p.delay_us for p in pts],
                   hovertemplate="%{text}<br>launch %{x:.1f} µs, kernel %{y:.1f} µs, "
                                 "delay %{customdata:.1f} µs<extra></extra>"),
        go.Scatter(x=[0, top], y=[0, top], mode="lines", name="kernel = launch",
                   line={"dash": "dash", "color": "gray"})])
    fig.update_layout(title=f"Kernel launches ({launch.short_kernels} shorter than their "
                            "launch call)", xaxis_title="runtime call (µs)",
                      yaxis_title="GPU duration (µs)")
    return fig


def graph_launch_text(graphs: GraphLaunches) -> str:
    """One sentence on launch_stats' graph launches (kept out of the per-kernel launch figures)."""
    return (f"{graphs.launches:,} graph launches started {graphs.kernels:,} kernels "
            f"({graphs.mean_kernels_per_launch:.1f} per launch, {graphs.gpu_us / 1e3:,.3f} ms of kernel time); "
            f"a launch call took {graphs.mean_runtime_us:,.1f} µs on average and its first kernel started "
            f"{graphs.mean_delay_us:,.1f} µs after the call began. Graph kernels are left out of the "
            "per-kernel launch figures above (one call starts them all).")


def build_timeline_figure(timeline: Timeline, search: str | None = None) -> go.Figure:
    """The trace's timeline (timeline_data), drawn by the one timeline figure (charts.timeline)."""
    return draw_timeline(timeline, search=search, title="Timeline")


def build_diff_figure(diff: TraceDiff) -> go.Figure:
    """Largest time changes from before to after, coloured by status (diff_traces). The axis takes the
    scale of the largest change (µs for a small trace, ms otherwise), the one the page's tiles use."""
    rows = [r for r in diff.rows if r.status != "unchanged"][:MAX_BARS][::-1]
    if not rows:
        return empty_figure("Trace diff", "No operator changed beyond the thresholds")
    sc = column_scale([r.delta_us for r in rows] + [r.time_us_before for r in rows]
                      + [r.time_us_after for r in rows], "us")
    labels = bottom_up_labels([r.name for r in rows])
    fig = go.Figure()
    for status, color in STATUS_COLORS.items():  # a trace per status: the legend says what a colour means
        mine = [(r, label) for r, label in zip(rows, labels) if r.status == status]
        if not mine:
            continue
        fig.add_bar(
            name=status, x=[r.delta_us / sc.factor for r, _ in mine], y=[label for _, label in mine],
            orientation="h", marker_color=color,
            customdata=[[r.status, r.time_us_before / sc.factor, r.time_us_after / sc.factor, r.name] for r, _ in mine],
            hovertemplate="%{customdata[3]}: %{customdata[0]}<br>%{customdata[1]:.3f} → %{customdata[2]:.3f} "
                          + sc.suffix + "<extra></extra>")
    fig.update_layout(title=f"Change in time ({diff.unit}), after − before", barmode="relative",
                      yaxis=dict(categoryorder="array", categoryarray=labels),  # largest change at the top
                      xaxis_title=f"change in time ({sc.suffix})", height=max(300, 22 * len(rows) + 120))
    return readable_axes(fig)


# ----------------------------------------------------------------------------- report sections
def trace_sections(result: TraceResult) -> list[Section]:
    s = result.summary
    text = [f"{result.name}: {s.events:,} events, duration {s.duration_us / 1e3:,.3f} ms, {s.n_steps} steps, "
            f"{'GPU' if s.has_gpu else 'CPU only'}"] + [f"warning: {w}" for w in s.warnings] \
        + [f"note: {n}" for n in s.notes]
    top, idle, launch, tb = result.top_operators, result.idle_time, result.launch_stats, result.temporal_breakdown
    sections = [section("Trace", [lambda: build_category_figure(s)], text=text + communication_lines(
        result.communication))]
    sections += serving_sections(result.serving or None)   # only on an inference server's trace
    sections.append(section("Per step", [lambda: build_gpu_breakdown_figure(tb), lambda: build_cpu_breakdown_figure(tb)],
                            text=([GPU_WINDOW_HELP] if tb.gpu else []) + list(tb.notes)))
    builders = [lambda: build_top_operators_figure(top, "operators")]
    if top.kernels:
        builders.append(lambda: build_top_operators_figure(top, "kernels"))
    sections.append(section("Top operators", builders, tables=[("operators", records_frame(top.operators))]))
    if idle.streams:
        sections.append(section("GPU idle time", [lambda: build_idle_time_figure(idle)]))
    if s.has_gpu:
        graphs = launch.graphs
        sections.append(section("Kernel launches", [lambda: build_launch_figure(launch)],
                                text=[graph_launch_text(graphs)] if graphs and graphs.launches else []))
    sections += hta_sections(result)   # the HTA-parity analyses (render.charts.trace_hta)
    sections += critical_path_sections(result)   # #18: render/charts/critical_path.py
    sections.append(section("Timeline", [lambda: mark_critical_path(build_timeline_figure(result.timeline),
                                                                    result.critical_path, result.timeline)]))
    if result.ranks:  # several ranks' traces (diagnostics.trace.ranks)
        sections += ranks_sections(result.ranks)
    return sections


def trace_diff_sections(result: TraceDiffResult) -> list[Section]:
    d, c = result.diff, result.diff.counts
    text = [f"{result.before} -> {result.after} ({d.unit}): {d.time_us_before / 1e3:,.3f} ms -> "
            f"{d.time_us_after / 1e3:,.3f} ms; {c.added} added, {c.removed} removed, {c.faster} faster, "
            f"{c.slower} slower, {c.unchanged} unchanged"]
    return [section("Trace diff", [lambda: build_diff_figure(d)], text=text, tables=[("changes", records_frame(d.rows))])]
