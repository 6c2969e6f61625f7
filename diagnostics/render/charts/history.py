"""Figures for stored runs: two runs' metrics side by side (change per metric) and a metric's trend."""

from __future__ import annotations

import plotly.graph_objects as go

from diagnostics.units import UNITS, format_value

#: verdict -> bar colour (improvements green, regressions red, the rest grey)
VERDICT_COLORS = {"better": "#2E7D32", "worse": "#C62828", "same": "#9E9E9E", "within noise": "#9E9E9E",
                  "changed": "#6D6D6D", "n/a": "#BDBDBD"}


def build_compare_figure(comparison: dict) -> go.Figure:
    """Horizontal bars: each metric's change from run A to run B in percent, coloured by its verdict.

    Metrics without a ratio (a run has no value, or A is 0) are left out of the chart (the table keeps
    them)."""
    rows = [r for r in comparison["rows"] if r["change_pct"] is not None]
    labels = [r["label"] for r in rows]
    fig = go.Figure(go.Bar(
        y=labels, x=[r["change_pct"] for r in rows], orientation="h",
        marker_color=[VERDICT_COLORS[r["verdict"]] for r in rows],
        customdata=[[r["a_text"], r["b_text"], r["verdict"]] for r in rows],
        hovertemplate="<b>%{y}</b><br>A: %{customdata[0]}<br>B: %{customdata[1]}<br>change: %{x:+.1f} %"
                      "<br>%{customdata[2]}<extra></extra>",
    ))
    fig.add_vline(x=0, line_color="#444", line_width=1)
    fig.update_layout(title="Change from run A to run B per metric (green: better, red: worse, grey: same / noise)",
                      xaxis_title="change from run A (%)", yaxis=dict(autorange="reversed", automargin=True),
                      height=max(260, 26 * len(rows) + 120), margin=dict(l=10, r=20, t=50, b=50),
                      template="plotly_white")
    return fig


def build_trend_figure(trend: dict) -> go.Figure:
    """A metric over a model's runs (oldest left), a marker per run; disturbed runs drawn hollow."""
    rows = trend["rows"]
    unit = trend["unit"]
    scale, axis_unit = 1.0, UNITS[unit][1]
    if unit == "bytes":  # one binary scale for the whole axis, chosen from the largest value
        top = max((abs(r["value"]) for r in rows), default=0)
        for scale, axis_unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"), (1, "B")):
            if top >= scale:
                break
    x = [r["started"] * 1000 for r in rows]  # epoch ms: Plotly reads a date axis from it
    fig = go.Figure(go.Scatter(
        x=x, y=[r["value"] / scale for r in rows], mode="lines+markers", name=trend["label"],
        marker=dict(size=9, symbol=["circle-open" if r["disturbed"] else "circle" for r in rows]),
        customdata=[[r["id"], format_value(r["value"], unit), r["model"] or "", r["device"] or "",
                     " (machine busy)" if r["disturbed"] else ""] for r in rows],
        hovertemplate="%{x|%Y-%m-%d %H:%M:%S}<br><b>%{customdata[1]}</b>%{customdata[4]}<br>%{customdata[2]} on "
                      "%{customdata[3]}<br>run %{customdata[0]}<extra></extra>",
    ))
    better = {"lower": " (lower is better)", "higher": " (higher is better)"}.get(trend.get("better") or "", "")
    title = f"{trend['label']} over {len(rows)} run{'s' * (len(rows) != 1)}{better}"
    span_s = (rows[-1]["started"] - rows[0]["started"]) if len(rows) > 1 else 0.0
    # runs seconds apart would otherwise get millisecond ticks; show clock times to the second
    tickformat = "%H:%M:%S" if span_s < 86400 else "%b %d %H:%M"
    fig.update_layout(title=title, xaxis=dict(title="run started", type="date", tickformat=tickformat),
                      yaxis=dict(title=f"{trend['label']} ({axis_unit})" if axis_unit else trend["label"],
                                 rangemode="tozero", automargin=True),
                      height=380, margin=dict(l=10, r=20, t=50, b=50), template="plotly_white")
    return fig
