"""Figures for a distributed run: per-rank step and busy time against the straggler threshold,
the computation / communication / overlap / other split per rank, collectives, overlap ratio."""

from __future__ import annotations

import plotly.graph_objects as go

from diagnostics.analyses.distributed import DISTRIBUTED_TRACES
from diagnostics.analyses.distributed.result import DistributedResult
from diagnostics.units import human_bytes
from diagnostics.render.sections import Section, section
from diagnostics.render.tables import declared_tables

COLORS = {"compute_only_ms": "#4C78A8", "overlap_ms": "#72B7B2", "exposed_comm_ms": "#F58518",
          "other_ms": "#BAB0AC", "busy": "#54A24B", "straggler": "#E45756", "step": "#9D9D9D"}
PARTS = [("compute_only_ms", "computation only"), ("overlap_ms", "computation + communication (overlap)"),
         ("exposed_comm_ms", "communication only (exposed)"), ("other_ms", "other (idle, Python, sleeps)")]


def _rank_labels(result: DistributedResult) -> list[str]:
    return [f"rank {r.rank}" for r in result.ranks]


def build_rank_step_figure(result: DistributedResult) -> go.Figure:
    """Median step time and busy time per rank (ms), with the straggler threshold as a line."""
    ranks = result.ranks
    labels = _rank_labels(result)
    t = result.thresholds
    fig = go.Figure()
    fig.add_bar(x=labels, y=[r.step_ms for r in ranks], name="step time (median)",
                marker_color=COLORS["step"], hovertemplate="%{x}<br>step %{y:.2f} ms<extra></extra>")
    fig.add_bar(x=labels, y=[r.busy_ms for r in ranks], name="busy time = step - exposed communication",
                marker_color=[COLORS["straggler"] if r.straggler else COLORS["busy"] for r in ranks],
                hovertemplate="%{x}<br>busy %{y:.2f} ms<extra></extra>")
    fig.add_hline(y=t.threshold_ms, line_dash="dash", line_color=COLORS["straggler"],
                  # Short, so it fits a third of the page; the caption above the chart gives the rule.
                  annotation_text=f"straggler threshold {t.threshold_ms:.2f} ms",
                  annotation_position="top left")
    fig.update_layout(title="Step and busy time per rank<br><sup>median over steps; red = straggler</sup>",
                      barmode="group", xaxis_title="rank", yaxis_title="time per step (ms)", height=380,
                      margin=dict(l=10, r=10, t=70, b=40),
                      legend=dict(orientation="h", y=-0.28, x=0))
    return fig


def build_breakdown_figure(result: DistributedResult) -> go.Figure:
    """Stacked bars per rank: computation only, overlap, exposed communication, other (ms)."""
    ranks = result.ranks
    labels = _rank_labels(result)
    fig = go.Figure()
    for key, name in PARTS:
        fig.add_bar(x=labels, y=[getattr(r, key) for r in ranks], name=name, marker_color=COLORS[key],
                    hovertemplate="%{x}<br>" + name + ": %{y:.2f} ms<extra></extra>")
    fig.update_layout(title="Where each rank's step goes<br><sup>median over steps</sup>", barmode="stack",
                      xaxis_title="rank", yaxis_title="time per step (ms)", height=380,
                      margin=dict(l=10, r=10, t=70, b=40),
                      legend=dict(orientation="h", y=-0.28, x=0))
    return fig


def build_collectives_figure(result: DistributedResult, n: int = 15) -> go.Figure:
    """Total time per collective (ms), largest first; hover shows calls, mean and bytes."""
    rows = result.collectives[:n]
    names = [f"{c.name} ({c.where})" for c in rows]
    fig = go.Figure(go.Bar(
        y=names, x=[c.total_ms for c in rows], orientation="h", marker_color=COLORS["exposed_comm_ms"],
        customdata=[[c.calls, c.mean_ms, human_bytes(c.mean_bytes) if c.mean_bytes is not None
                     else "not recorded"] for c in rows],
        hovertemplate="%{y}<br>total %{x:.2f} ms over %{customdata[0]} calls<br>mean %{customdata[1]:.3f} ms"
                      "<br>mean message %{customdata[2]}<extra></extra>"))
    fig.update_layout(title="Collectives by total time (all ranks, profiled steps)",
                      xaxis_title="total time (ms)", yaxis=dict(autorange="reversed"),
                      height=max(260, 30 * len(rows) + 120), margin=dict(l=10, r=10, t=50, b=40))
    return fig


def build_overlap_figure(result: DistributedResult) -> go.Figure:
    """Gauge: share of communication time hidden behind computation (overlap / communication, %)."""
    ratio = result.metrics.overlap_ratio
    value = 0.0 if ratio is None else 100.0 * ratio
    fig = go.Figure(go.Indicator(
        mode="gauge+number", value=value, number={"suffix": " %", "valueformat": ".1f"},
        title={"text": "Comm. overlapped<br>with compute (%)", "font": {"size": 14}},
        gauge={"axis": {"range": [0, 100]}, "bar": {"color": COLORS["overlap_ms"]},
               "steps": [{"range": [0, 30], "color": "#FBE5D6"}, {"range": [30, 70], "color": "#FFF2CC"},
                         {"range": [70, 100], "color": "#E2F0D9"}]}))
    fig.update_layout(height=260, margin=dict(l=40, r=40, t=70, b=10))
    return fig


# ----------------------------------------------------------------------------- report sections
def distributed_sections(result: DistributedResult) -> list[Section]:
    return [
        section("Ranks", [lambda: build_rank_step_figure(result), lambda: build_breakdown_figure(result)],
                text=list(result.notes)),
        section("Communication", [lambda: build_collectives_figure(result),
                                  lambda: build_overlap_figure(result)]),
        # the tables the result type declares (distributed and distributed_traces share it)
        Section("Tables", tables=declared_tables(DISTRIBUTED_TRACES, result)),
    ]
