"""The serving view of an inference server's trace (diagnostics.trace.serving, issue #42): per iteration its
time split (attention, GEMM, communication, sampling, other compute, copies, the GPU idle: queued or waiting on
the host), its phase, batch and tokens, and the CUDA / HIP graph replays. Draws and says; computes nothing."""

from __future__ import annotations

import plotly.graph_objects as go

from diagnostics.analyses.trace.result import Serving
from diagnostics.render.charts.style import readable_axes
from diagnostics.render.sections import Section, section
from diagnostics.render.tables import records_frame
from diagnostics.units import column_scale
from diagnostics.render.trace_text import (  # noqa: F401  (plotly-free words)
    SPLIT_COLORS, _label, serving_lines, split_parts,
)

def build_serving_figure(serving: Serving) -> go.Figure:
    """One stacked bar per iteration: its time split, the phase, batch and tokens in its label."""
    its = serving.iterations
    sc = column_scale([it.time_us for it in its], "us")
    fig = go.Figure()
    labels = [_label(it) for it in its]
    for key, name, color in split_parts(its):
        fig.add_bar(name=name, y=labels, x=[getattr(it, key) / sc.factor for it in its], orientation="h",
                    marker_color=color)
    fig.update_layout(barmode="stack", title="Serving iterations: where each iteration's time went",
                      xaxis_title=f"time ({sc.suffix})", height=max(320, 40 * len(its) + 220),
                      # below the axis, across: a few iterations leave no room for 7 entries stacked at the side
                      # at the figure's foot (the container's coordinates): a fraction of a short plot's height
                      # put it on the axis title
                      legend=dict(orientation="h", yref="container", yanchor="bottom", y=0, x=0), margin=dict(b=120))
    return readable_axes(fig)


def serving_sections(serving: Serving | None) -> list[Section]:
    if not serving or not serving.available:
        return []
    tables = [("serving_iterations", records_frame(serving.iterations))]
    if serving.graphs and serving.graphs.by_launch:
        tables.append(("graph_replays", records_frame(serving.graphs.by_launch)))
    return [section("Serving", [lambda: build_serving_figure(serving)], text=serving_lines(serving), tables=tables)]
