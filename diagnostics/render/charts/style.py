"""Figure looks shared by the dashboard and the static report: axis labels that are never cut
(automargin, titles set off from their ticks), long category names shortened with the full name
kept for the hover, and the report's own styling (it is opened outside Streamlit, so it gets no
Streamlit theme: the white template, and a colour scale on hierarchical charts)."""

from __future__ import annotations

import plotly.graph_objects as go

#: A category label longer than this is shortened on the axis ('…'); the hover keeps the full name.
MAX_NAME_CHARS = 60
#: Pixels between an axis title and its tick labels.
TITLE_STANDOFF = 12
#: The colour scale of icicles and treemaps (by each box's value).
HIERARCHY_COLORSCALE = "Blues"


def empty_figure(title: str, message: str) -> go.Figure:
    """A figure with nothing to draw: its title, hidden axes and the message in the middle."""
    fig = go.Figure()
    fig.update_layout(title=title, xaxis={"visible": False}, yaxis={"visible": False},
                      annotations=[{"text": message, "showarrow": False, "x": 0.5, "y": 0.5,
                                    "xref": "paper", "yref": "paper"}])
    return fig


def short_names(names: list[str], n: int = MAX_NAME_CHARS) -> list[str]:
    """Axis labels for ``names``: unchanged up to ``n`` characters, else cut to ``n`` with '…'.
    Two names that shorten alike get ' (2)', ' (3)' so their bars stay apart."""
    out, seen = [], {}
    for name in names:
        label = name if len(name) <= n else name[: n - 1] + "…"
        if label != name or label in seen:
            k = seen.get(label, 0) + 1
            seen[label] = k
            if k > 1:
                label = f"{label} ({k})"
        else:
            seen[label] = 1
        out.append(label)
    return out


def bottom_up_labels(names: list[str], n: int = MAX_NAME_CHARS) -> list[str]:
    """short_names for the bars of a horizontal chart drawn bottom-up (``names`` in drawing order, the largest
    last): named in ranked order, so that of two names that shorten alike the larger keeps the plain label."""
    return short_names(names[::-1], n)[::-1]


def readable_axes(fig: go.Figure) -> go.Figure:
    """Every axis makes room for its tick labels (automargin) and keeps its title off them."""
    fig.update_xaxes(automargin=True, title_standoff=TITLE_STANDOFF)
    fig.update_yaxes(automargin=True, title_standoff=TITLE_STANDOFF)
    return fig


def for_report(fig: go.Figure) -> go.Figure:
    """A copy of ``fig`` styled for the static HTML report: the white template, readable axes, and a
    colour scale on icicles and treemaps that set no colours of their own."""
    fig = go.Figure(fig)
    fig.update_layout(template="plotly_white", paper_bgcolor="white")
    readable_axes(fig)
    for trace in fig.data:
        if trace.type in ("icicle", "treemap", "sunburst") and trace.marker.colors is None and trace.values is not None:
            trace.marker.colors = list(trace.values)
            trace.marker.colorscale = HIERARCHY_COLORSCALE
    return fig
