"""Show a memory plan: tiles, the fit table, the batch x sequence grid, the make-it-fit list, what holds each
peak and memory over the first configuration's step. (The Memory page's Plan tab shows it through
``views.show("plan", ...)``; nothing of the plan lives in ui/views/memory.py.)"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from diagnostics.analyses.plan.result import PlanResult
from diagnostics.render.charts.plan import (build_plan_breakdown_figure, build_plan_grid_figure,
                                            build_plan_suggestions_figure, build_plan_timeline_figure, device_line,
                                            fit_lines)
from diagnostics.render.tables import records_frame
from diagnostics.units import human_bytes
from ui.widgets import Tile, metric_row, unit_columns


def tiles(result: PlanResult) -> list[Tile]:
    m = result.metrics
    first = result.max_batch[0] if result.max_batch else None
    return [
        Tile("Fit", f"{m.fitting_configs} of {m.configs}", "text", "configurations whose predicted peak and the "
             "CUDA context fit the device"),
        Tile("Device memory", m.capacity_bytes, "bytes", device_line(result)),
        Tile("Largest peak", m.max_peak_bytes, "bytes", "the largest predicted peak among the configurations"),
        Tile("Largest batch", first.max_batch if first else None, "count",
             (f"{first.setting}" + (f" at seq {first.seq}" if first.seq is not None else "") + ": "
              + first.checked) if first else "no sweep ran", missing="n/a"),
        Tile("Traces", m.traces, "count", f"steps run on fake tensors, {m.trace_seconds:.1f} s in all; "
             f"{m.analytic_modules} module(s) estimated analytically"),
    ]


def _rows_table(result: PlanResult) -> None:
    df = pd.DataFrame([{"configuration": r.label, "fits": r.fits, "peak_bytes": None if r.error else r.peak_bytes,
                        "headroom_bytes": None if r.error else r.headroom_bytes, "phase": r.phase,
                        "module": r.error or r.module, "how": r.how} for r in result.rows])
    df, config = unit_columns(df, {"peak_bytes": ("Predicted peak", "bytes"), "headroom_bytes": ("Headroom", "bytes")},
                              {"configuration": st.column_config.TextColumn("Configuration"),
                               "fits": st.column_config.CheckboxColumn("Fits"),
                               "phase": st.column_config.TextColumn("Peak in"),
                               "module": st.column_config.TextColumn("Module at the peak"),
                               "how": st.column_config.TextColumn("How", help="traced: run on fake tensors; fitted: "
                                                                              "from the traced neighbours; failed: "
                                                                              "not planned (the module column says why)")})
    st.dataframe(df, hide_index=True, width="stretch", column_config=config)


def show(result: PlanResult) -> None:
    st.caption(f"{result.model} · {device_line(result)} · traced on {result.traced_on}")
    metric_row(tiles(result))
    for note in result.notes:
        st.info(note)
    _rows_table(result)
    tab_grid, tab_fit, tab_parts, tab_time = st.tabs(["Grid", "Make it fit", "What holds the peak", "Over the step"])
    with tab_grid:
        if result.grids:
            for i in range(len(result.grids)):
                st.plotly_chart(build_plan_grid_figure(result, i), width="stretch")
            mb, config = unit_columns(records_frame(result.max_batch)[["setting", "seq", "max_batch", "peak_bytes",
                                                                        "checked"]],
                                      {"peak_bytes": ("Peak at that batch", "bytes")},
                                      {"max_batch": st.column_config.NumberColumn("Largest batch"),
                                       "checked": st.column_config.TextColumn("Checked by")})
            st.dataframe(mb, hide_index=True, width="stretch", column_config=config)
        else:
            st.info("No sweep ran (turn on 'sweep').")
    with tab_fit:
        if result.suggestions:
            st.plotly_chart(build_plan_suggestions_figure(result), width="stretch")
            df, config = unit_columns(records_frame(result.suggestions)[["change", "fits", "peak_bytes", "cost"]],
                                      {"peak_bytes": ("Predicted peak", "bytes")},
                                      {"change": st.column_config.TextColumn("Change"),
                                       "fits": st.column_config.CheckboxColumn("Fits"),
                                       "cost": st.column_config.TextColumn("Cost")})
            st.dataframe(df, hide_index=True, width="stretch", column_config=config)
        elif all(r.fits for r in result.rows):
            st.success("Every configuration fits: nothing to change.")
        else:
            st.info("No suggestions were made (the sweep is off, or the configuration is sharded or for inference).")
    if result.fit:
        _fit_section(result.fit)
    with tab_parts:
        st.plotly_chart(build_plan_breakdown_figure(result), width="stretch")
    with tab_time:
        if result.timeline is not None:
            st.plotly_chart(build_plan_timeline_figure(result), width="stretch")
        st.caption(result.method)


def _fit_section(fit) -> None:
    """The budget answer: what to checkpoint, its predicted peak and recompute time, the candidates."""
    st.subheader(f"Fit in {human_bytes(fit.budget_bytes)}")
    lines = fit_lines(fit)
    (st.success if fit.fits else st.warning)(lines[1])
    for line in lines[2:]:
        st.caption(line)
    df, config = unit_columns(records_frame(fit.candidates), {"saved_bytes": ("Saved for backward", "bytes"),
                                                              "recompute_ms": ("Recompute", "ms"),
                                                              "forward_flops": ("Forward FLOPs", "flop")},
                              {"module": st.column_config.TextColumn("Module"),
                               "chosen": st.column_config.CheckboxColumn("Checkpointed")})
    st.dataframe(df, hide_index=True, width="stretch", column_config=config)
