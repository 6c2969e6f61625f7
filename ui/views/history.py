"""History's run comparison and trend: the views of diagnostics.history' results."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from diagnostics.history import Comparison, MetricChange, Trend
from diagnostics.render.charts.history import build_compare_figure, build_trend_figure
from diagnostics.units import format_value

_VERDICT_ICONS = {"better": "▲ better", "worse": "▼ worse", "same": "= same", "within noise": "≈ within noise",
                  "changed": "changed", "n/a": "n/a"}


def _delta_text(row: MetricChange) -> str:
    if row.delta is None:
        return "—"
    sign = "+" if row.delta > 0 else "−" if row.delta < 0 else "±"
    if row.unit in ("percent", "fraction"):  # a change of a percentage is in percentage points
        pp = abs(row.delta) * (100.0 if row.unit == "fraction" else 1.0)
        text = f"{sign}{pp:.1f} pp"
    else:
        text = f"{sign}{format_value(abs(row.delta), row.unit)}"
    if row.change_pct is not None:
        text += f" ({row.change_pct:+.1f} %)"
    return text


def show_comparison(comparison: Comparison) -> None:
    """Counts of better / worse metrics, the table of metrics with their change, the settings that
    differ, the chart and the notes (measured at different times; busy machine)."""
    counts = comparison.counts
    c = st.columns(4)
    c[0].metric("Better", counts.better, help="metrics that moved the way their declaration calls better")
    c[1].metric("Worse", counts.worse, help="metrics that moved the other way")
    c[2].metric("Within noise", counts.within_noise,
                help="latency differences smaller than the runs' own spread allows")
    c[3].metric("Same", counts.same, help="exactly equal (counts, bytes, FLOPs)")
    table = pd.DataFrame([{
        "metric": r.label, "run A": r.a_text, "run B": r.b_text, "change": _delta_text(r),
        "ratio B/A": None if r.ratio is None else f"x{r.ratio:.3g}",
        "verdict": _VERDICT_ICONS[r.verdict],
    } for r in comparison.rows])
    if table.empty:
        st.info("Neither run has metrics to compare.")
    else:
        st.dataframe(table, hide_index=True, width="stretch")
    if comparison.settings:
        st.markdown("**What differs between the runs** (model, device, options)")
        st.dataframe(pd.DataFrame([{"setting": s.setting, "a": s.a, "b": s.b} for s in comparison.settings]).astype(str), hide_index=True, width="stretch")
    else:
        st.caption("Same model, device and options: only the time of the run differs.")
    if any(r.change_pct is not None for r in comparison.rows):
        st.plotly_chart(build_compare_figure(comparison), width="stretch")
    for note in comparison.notes:
        st.caption(note)


def show_trend(trend: Trend) -> None:
    rows = trend.rows
    if not rows:
        st.info(f"No finished {trend.analysis} run of this model has '{trend.label}'.")
        return
    st.plotly_chart(build_trend_figure(trend), width="stretch")
    if len(trend.series) > 1:
        st.caption(f"{len(trend.series)} series: runs of different settings (mode, batch, options) are drawn as "
                   "separate lines, never joined, since they measured different things.")
    if trend.missing:
        st.caption(f"{trend.missing} run(s) without this metric are left out (not drawn as 0).")
    if any(r.disturbed for r in rows):
        st.caption("Hollow markers: runs timed on a busy machine (their disturbance report says so).")
