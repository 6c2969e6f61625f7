"""Figures for stored runs: two runs' metrics side by side (change per metric) and a metric's trend."""

from __future__ import annotations

import plotly.graph_objects as go

from diagnostics.history import Comparison, Trend
from diagnostics.units import UNITS, format_value

#: verdict -> bar colour (improvements green, regressions red, the rest grey)
VERDICT_COLORS = {"better": "#2E7D32", "worse": "#C62828", "same": "#9E9E9E", "within noise": "#9E9E9E",
                  "changed": "#6D6D6D", "n/a": "#BDBDBD"}


#: The compare chart's axis reaches the largest change up to this many percent (then a little more);
#: larger changes are drawn to the edge with their value written: one +200,000 % metric must not squash
#: every other bar to nothing.
COMPARE_AXIS_CAP = 100.0


def compare_axis_limit(changes: list[float]) -> float:
    """Half the compare chart's x range: the largest |change| within COMPARE_AXIS_CAP (at least 1 %), or,
    when every change is larger, the largest one."""
    mags = [abs(c) for c in changes]
    inside = [c for c in mags if c <= COMPARE_AXIS_CAP]
    top = max(inside) if inside else max(mags, default=1.0)
    return max(top, 1.0) * 1.15


def build_compare_figure(comparison: Comparison) -> go.Figure:
    """Horizontal bars: each metric's change from run A to run B in percent, coloured by its verdict, each
    with its value written. The axis is scaled to the changes it can show side by side; a change too large
    for it (past COMPARE_AXIS_CAP beside smaller ones) reaches the edge, hatched, its value written.

    Metrics without a ratio (a run has no value, or A is 0) are left out of the chart (the table keeps
    them)."""
    rows = [r for r in comparison.rows if r.change_pct is not None]
    labels = [r.label for r in rows]
    changes = [r.change_pct for r in rows]
    limit = compare_axis_limit(changes)
    edge = limit / 1.15 * 1.05
    shown = [max(-edge, min(edge, c)) for c in changes]
    off = [abs(c) > limit for c in changes]
    fig = go.Figure(go.Bar(
        y=labels, x=shown, orientation="h",
        marker_color=[VERDICT_COLORS[r.verdict] for r in rows],
        marker_pattern_shape=["/" if o else "" for o in off],
        text=[f"{c:+,.1f} %" + (" (off scale)" if o else "") for c, o in zip(changes, off)],
        textposition="auto", cliponaxis=False,
        customdata=[[r.a_text, r.b_text, r.verdict, c] for r, c in zip(rows, changes)],
        hovertemplate="<b>%{y}</b><br>A: %{customdata[0]}<br>B: %{customdata[1]}<br>change: %{customdata[3]:+,.1f} %"
                      "<br>%{customdata[2]}<extra></extra>",
    ))
    fig.add_vline(x=0, line_color="#444", line_width=1)
    title = "Change from run A to run B per metric (green: better, red: worse, grey: same / noise)"
    if any(off):
        title += f"; hatched: beyond ±{limit:,.0f} %, value written"
    fig.update_layout(title=title, xaxis=dict(title="change from run A (%)", range=[-limit, limit]),
                      yaxis=dict(autorange="reversed", automargin=True),
                      height=max(260, 26 * len(rows) + 120), margin=dict(l=10, r=20, t=50, b=50),
                      template="plotly_white")
    return fig


def build_trend_figure(trend: Trend) -> go.Figure:
    """A metric over a model's runs (oldest left), one line per series (runs of the same model, device and
    settings: a line never joins an inference run to a training one), a marker per run; disturbed runs
    drawn hollow."""
    rows = trend.rows
    unit = trend.unit
    labels = [s.label for s in trend.series] or [trend.label]
    scale, axis_unit = 1.0, UNITS[unit][1]
    if unit == "bytes":  # one binary scale for the whole axis, chosen from the largest value
        top = max((abs(r.value) for r in rows), default=0)
        for scale, axis_unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"), (1, "B")):
            if top >= scale:
                break
    fig = go.Figure()
    for i, name in enumerate(labels):
        mine = [r for r in rows if r.series == i]
        fig.add_scatter(
            x=[r.started * 1000 for r in mine],  # epoch ms: Plotly reads a date axis from it
            y=[r.value / scale for r in mine], mode="lines+markers" if len(mine) > 1 else "markers",
            name=name,
            marker=dict(size=9, symbol=["circle-open" if r.disturbed else "circle" for r in mine]),
            customdata=[[r.id, format_value(r.value, unit), r.model or "", r.device or "",
                         " (machine busy)" if r.disturbed else "", name] for r in mine],
            hovertemplate="%{x|%Y-%m-%d %H:%M:%S}<br><b>%{customdata[1]}</b>%{customdata[4]}<br>%{customdata[2]} on "
                          "%{customdata[3]}<br>%{customdata[5]}<br>run %{customdata[0]}<extra></extra>",
        )
    better = {"lower": " (lower is better)", "higher": " (higher is better)"}.get(trend.better or "", "")
    title = f"{trend.label} over {len(rows)} run{'s' * (len(rows) != 1)}{better}"
    if len(labels) > 1:
        title += f"; {len(labels)} series of different settings, never joined"
    span_s = (rows[-1].started - rows[0].started) if len(rows) > 1 else 0.0
    # runs seconds apart would otherwise get millisecond ticks; show clock times to the second
    tickformat = "%H:%M:%S" if span_s < 86400 else "%b %d %H:%M"
    fig.update_layout(title=title, xaxis=dict(title="run started", type="date", tickformat=tickformat),
                      yaxis=dict(title=f"{trend.label} ({axis_unit})" if axis_unit else trend.label,
                                 rangemode="tozero", automargin=True),
                      showlegend=len(labels) > 1, legend=dict(orientation="h", y=-0.25),
                      height=380 + (30 if len(labels) > 1 else 0), margin=dict(l=10, r=20, t=50, b=50),
                      template="plotly_white")
    return fig
