"""Figures for the gradient-flow result: norm across depth, layer × step heatmap, global norm,
dead / saturated activations."""

from __future__ import annotations

import math

import plotly.graph_objects as go

from diagnostics.analyses.gradients import ANALYSIS as GRADIENTS
from diagnostics.analyses.gradients import GradientsResult
from diagnostics.render.sections import Section, notes, section
from diagnostics.render.tables import declared_tables

STATUS_COLORS = {
    "healthy": "#2E7D32",
    "vanishing": "#1565C0",
    "exploding": "#C62828",
    "dead": "#616161",
    "non-finite": "#6A1B9A",
}


def _threshold(result: GradientsResult, name: str) -> float | None:
    return next((t.value for t in result.thresholds if t.name == name), None)


def build_grad_norm_depth_figure(result: GradientsResult) -> go.Figure:
    """Each layer's mean gradient L2 norm in forward order (log scale), coloured by its status."""
    layers = result.layers
    fig = go.Figure()
    x = [f"{l.index}: {l.layer}" for l in layers]
    fig.add_scatter(x=x, y=[l.grad_norm_mean for l in layers], mode="lines", line=dict(color="#B0BEC5"),
                    showlegend=False, hoverinfo="skip")
    for status, color in STATUS_COLORS.items():
        pts = [(xi, l) for xi, l in zip(x, layers) if l.status == status]
        if not pts:
            continue
        fig.add_scatter(x=[p[0] for p in pts], y=[p[1].grad_norm_mean for p in pts], mode="markers",
                        name=status, marker=dict(color=color, size=9),
                        customdata=[[p[1].type, p[1].reason or "within thresholds", p[1].rule or ""] for p in pts],
                        hovertemplate="%{x} (%{customdata[0]})<br>gradient norm %{y:.3g}<br>%{customdata[1]}"
                                      "<br>vanishing rule: %{customdata[2]}"
                                      "<extra>" + status + "</extra>")
    exploding = _threshold(result, "EXPLODING_NORM")
    if exploding:
        fig.add_hline(y=exploding, line_dash="dot", line_color=STATUS_COLORS["exploding"],
                      annotation_text=f"exploding > {exploding:g}", annotation_position="top left")
    # no "vanishing" line on this axis: a layer is judged on its relative gradient ‖g‖/‖w‖ against the model's
    # reference and its peers (each point's hover gives its reason), not on its norm against the largest
    fig.update_layout(title="Gradient norm per layer across depth (mean over steps)", height=440,
                      xaxis_title="layer (forward order)", yaxis_title="gradient L2 norm (log scale)",
                      yaxis_type="log", margin=dict(t=50, l=10, r=10, b=10),
                      legend=dict(orientation="h", y=1.02, x=1, xanchor="right", yanchor="bottom"))
    return fig


def build_grad_heatmap_figure(result: GradientsResult) -> go.Figure:
    """Layer × step heatmap of log10 of the gradient norm (blank: zero or non-finite)."""
    names = [l.layer for l in result.layers]
    steps = sorted({s.step for s in result.steps})
    grid = {(s.layer, s.step): s.grad_norm for s in result.steps}
    z = [[math.log10(v) if v else None for v in (grid.get((n, st)) for st in steps)] for n in names]
    fig = go.Figure(go.Heatmap(z=z, x=steps, y=names, colorscale="Viridis",
                               colorbar=dict(title="log10 norm"),
                               hovertemplate="%{y}<br>step %{x}<br>log10 gradient norm %{z:.2f}<extra></extra>"))
    fig.update_layout(title="Gradient norm per layer and step (log10)", xaxis_title="training step",
                      yaxis=dict(title="layer (forward order)", autorange="reversed"), xaxis=dict(dtick=1),
                      height=max(320, 18 * len(names) + 140), margin=dict(t=50, l=10, r=10, b=10))
    return fig


def build_global_norm_figure(result: GradientsResult) -> go.Figure:
    """Global gradient norm (all parameters) and the loss over the steps."""
    g = result.global_norms
    fig = go.Figure()
    fig.add_scatter(x=[r.step for r in g], y=[r.global_norm for r in g], mode="lines+markers",
                    name="global gradient norm", hovertemplate="step %{x}: norm %{y:.3g}<extra></extra>")
    fig.add_scatter(x=[r.step for r in g], y=[r.loss for r in g], mode="lines+markers", name="loss",
                    yaxis="y2", line=dict(dash="dot"), hovertemplate="step %{x}: loss %{y:.4g}<extra></extra>")
    fig.update_layout(title="Global gradient norm and loss over the steps", xaxis=dict(title="training step", dtick=1),
                      yaxis=dict(title="global gradient L2 norm (log scale)", type="log"),
                      yaxis2=dict(title="loss (unitless)", overlaying="y", side="right"),
                      height=380, margin=dict(t=50, l=10, r=10, b=10),
                      legend=dict(orientation="h", y=1.02, x=1, xanchor="right", yanchor="bottom"))
    return fig


def build_activation_health_figure(result: GradientsResult) -> go.Figure:
    """Fraction of dead ReLU units and of saturated sigmoid / tanh outputs per activation module (%)."""
    acts = result.activations
    names = [f"{a.module} ({a.type})" for a in acts]
    fig = go.Figure()
    fig.add_bar(x=names, y=[None if a.dead_fraction is None else 100 * a.dead_fraction for a in acts],
                name="dead ReLU units", marker_color="#616161",
                hovertemplate="%{x}<br>%{y:.1f} % of units never positive<extra></extra>")
    fig.add_bar(x=names, y=[None if a.saturated_fraction is None else 100 * a.saturated_fraction for a in acts],
                name="saturated outputs", marker_color="#EF6C00",
                hovertemplate="%{x}<br>%{y:.1f} % of outputs saturated<extra></extra>")
    flag = _threshold(result, "ACTIVATION_FLAG_FRACTION")
    if flag is not None:
        fig.add_hline(y=100 * flag, line_dash="dot", line_color="#C62828",
                      annotation_text=f"flagged above {flag:.0%}", annotation_position="top left")
    fig.update_layout(title="Activation health (mean over the steps' batches)", barmode="group",
                      xaxis_title="activation module (forward order)", yaxis=dict(title="share of units (%)",
                                                                                 range=[0, 105]),
                      height=380, margin=dict(t=50, l=10, r=10, b=10),
                      legend=dict(orientation="h", y=1.02, x=1, xanchor="right", yanchor="bottom"))
    return fig


# ----------------------------------------------------------------------------- report sections
def gradients_sections(result: GradientsResult) -> list[Section]:
    text = [f"Verdict: {result.verdict}", *notes(result)]
    return [
        section("Gradient flow", [lambda: build_grad_norm_depth_figure(result),
                                   lambda: build_global_norm_figure(result)], text=text),
        section("Per layer and step", [lambda: build_grad_heatmap_figure(result)]),
        section("Activations", [lambda: build_activation_health_figure(result)]),
        Section("Tables", tables=declared_tables(GRADIENTS, result)),
    ]
