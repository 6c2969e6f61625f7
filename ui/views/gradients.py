"""Show the gradient-flow result: verdict, thresholds, per-layer classification and charts."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from diagnostics.analyses.gradients import GradientsResult
from diagnostics.render.charts.gradients import (STATUS_COLORS, build_activation_health_figure, build_global_norm_figure,
                                          build_grad_heatmap_figure, build_grad_norm_depth_figure)
from diagnostics.render.tables import frame
from ui.widgets import Tile, metric_row


def _fmt(v) -> str:
    return "n/a" if v is None else f"{v:.3g}"


def _status_style(col: pd.Series) -> list[str]:
    return [f"color: white; background-color: {STATUS_COLORS.get(v, '#9E9E9E')}" for v in col]


def tiles(result: GradientsResult) -> list[Tile]:
    m = result.metrics
    return [
        Tile("Layers flagged", f"{m.layers_flagged} / {m.layers}", "text", "layers not classified healthy"),
        Tile("Vanishing", m.layers_vanishing, "count", "layers whose gradients vanish"),
        Tile("Exploding", m.layers_exploding, "count", "layers whose gradients explode"),
        Tile("Dead", m.layers_dead, "count", "layers whose gradients are (almost) all zero"),
        Tile("Non-finite", m.layers_nonfinite, "count", "layers with NaN or Inf gradients"),
        Tile("Global norm", _fmt(m.global_norm_last), "text",
             f"L2 norm of all gradients together at the last step (first step: {_fmt(m.global_norm_first)}); "
             "the Global norm tab shows every step"),
    ]


def show(result: GradientsResult) -> None:
    m = result.metrics
    o = result.options  # the options as run
    st.caption(f"{result.model} · device {result.device} · {o['steps']} step{'s' if o['steps'] != 1 else ''} "
               f"of {o['optimizer']} at lr "
               f"{o['lr']:g}")
    metric_row(tiles(result))
    if m.layers_flagged and result.confidence == "low":
        st.warning(f"Gradient flow: {result.verdict} (low confidence: a stand-in loss, see below)")
    elif m.layers_flagged:
        st.error(f"Gradient flow: {result.verdict}")
    else:
        st.success("Gradient flow: every layer within the thresholds")
    if isinstance(result.phase, str):  # runs stored before phases have none
        st.caption(f"Judged {result.phase}: {result.phase_reason}")
    for note in result.notes:
        st.info(note)

    tab_layers, tab_depth, tab_heat, tab_global, tab_act, tab_thr = st.tabs(
        ["Layers", "Norm across depth", "Layer × step", "Global norm", "Activations", "Thresholds"])
    with tab_layers:
        df = frame(result.layers)
        # the numbers first: the long texts (reason, rule) after them, so no number is pushed off-screen
        cols = ["index", "layer", "status", "relative_grad", "peer_median", "grad_norm_mean", "weight_norm",
                "grad_norm_relative", "grad_abs_mean", "grad_abs_max", "update_ratio_mean", "zero_fraction",
                "nan_count", "inf_count", "type", "kind", "reason", "peer_role", "neighbourhood", "rule"]
        cols = [c for c in cols if c in df.columns]  # results stored before layer kinds have no kind / rule
        st.dataframe(df[cols].style.apply(_status_style, subset=["status"]), hide_index=True, width="stretch",
                     column_config={
                         "index": st.column_config.NumberColumn("#", width="small"),
                         "layer": st.column_config.TextColumn("Layer (forward order)"),
                         "rule": st.column_config.TextColumn("Vanishing rule applied", width="medium"),
                         "neighbourhood": st.column_config.TextColumn("Neighbourhood", width="medium",
                                                                      help="the nearest module above the layer "
                                                                           "holding another layer, to read it beside"),
                         "relative_grad": st.column_config.NumberColumn(
                             "‖g‖ / ‖w‖", format="%.2e", help="what the layer is judged on: its mean gradient norm "
                                                              "over its weight norm"),
                         "peer_median": st.column_config.NumberColumn(
                             "Peers' ‖g‖ / ‖w‖", format="%.2e", help="the median of the same layer at the other "
                                                                     "depths (at least 3 of them)"),
                         "peer_role": st.column_config.TextColumn("Peers", width="medium"),
                         "weight_norm": st.column_config.NumberColumn("‖w‖", format="%.3e"),
                         "status": st.column_config.TextColumn("Status", width="small"),
                         "reason": st.column_config.TextColumn("Reason", width="medium"),
                         "grad_norm_mean": st.column_config.NumberColumn("Grad L2 norm", format="%.3e"),
                         "grad_norm_relative": st.column_config.NumberColumn("Norm / largest", format="%.2e"),
                         "grad_abs_mean": st.column_config.NumberColumn("Mean |g|", format="%.3e"),
                         "grad_abs_max": st.column_config.NumberColumn("Max |g|", format="%.3e"),
                         "update_ratio_mean": st.column_config.NumberColumn("‖Δw‖ / ‖w‖", format="%.2e"),
                         "zero_fraction": st.column_config.NumberColumn("Zero grads", format="percent", width="small"),
                         "nan_count": st.column_config.NumberColumn("NaN", width="small"),
                         "inf_count": st.column_config.NumberColumn("Inf", width="small"),
                     })
    with tab_depth:
        st.plotly_chart(build_grad_norm_depth_figure(result), width="stretch")
    with tab_heat:
        st.plotly_chart(build_grad_heatmap_figure(result), width="stretch")
    with tab_global:
        st.plotly_chart(build_global_norm_figure(result), width="stretch")
    with tab_act:
        if result.activations:
            st.plotly_chart(build_activation_health_figure(result), width="stretch")
        else:
            st.info("No ReLU, sigmoid or tanh modules: activations called as functions are not hooked.")
    with tab_thr:
        st.dataframe(frame(result.thresholds), hide_index=True, width="stretch",
                     column_config={"name": "Constant", "value": st.column_config.NumberColumn("Value", format="%g"),
                                    "meaning": "Meaning"})
        st.caption("Named constants in diagnostics/measure/gradient_health.py; see docs/gradients.md.")
