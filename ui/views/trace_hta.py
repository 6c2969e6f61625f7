"""The Trace explorer's Holistic Trace Analysis parity tabs (kernel sequences, launch queue, memcpy
bandwidth, GPU annotations, launch delay) and the widgets choosing their definitions. The figures and
words come from diagnostics.render.charts.trace_hta; ui.views.traces opens these tabs."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from diagnostics.render.charts.trace_hta import (
    build_annotations_figure, build_bandwidth_figure, build_kernel_sequences_figure, build_launch_delay_figure,
    build_queue_length_figure, definitions_text, notes_of, overlap_text, queue_text,
)
from ui.widgets import option_input, chart_key

TABS = ["Kernel sequences", "Launch queue", "Memcpy bandwidth", "GPU annotations", "Launch delay"]


def option_inputs() -> dict:
    """The trace analysis' definition options, as widgets (declared in diagnostics.analyses.trace)."""
    with st.expander("Definitions (to compare with Holistic Trace Analysis)"):
        c1, c2 = st.columns(2)
        return {"definitions": option_input("trace", "definitions", c1, radio=True),
                "sequence_length": option_input("trace", "sequence_length", c2)}


def _table(records: list, units: dict) -> None:
    """Rows with their units in the column names (``units``: key -> label with unit)."""
    if not records:
        st.caption("(none)")
        return
    df = pd.DataFrame(records).drop(columns=["kernels"], errors="ignore")
    for col in df.columns:
        if col.endswith("bytes_per_s"):
            df[col] = df[col] / 1e9
    st.dataframe(df.rename(columns=units), hide_index=True, width="stretch")


def _notes(part: dict) -> None:
    for n in notes_of(part):
        st.info(n)


def show_tabs(tabs, result: dict) -> None:
    """Fill ``tabs`` (one per TABS entry) from a trace result; a result made before these analyses
    existed says so."""
    if "kernel_sequences" not in result:
        for tab in tabs:
            with tab:
                st.info("This result predates these analyses: open the trace again to compute them.")
        return
    seqs, q, bw = result["kernel_sequences"], result["queue_length"], result["memcpy_bandwidth"]
    ann, ld = result["annotations"], result["launch_delay"]
    with tabs[0]:
        st.plotly_chart(build_kernel_sequences_figure(seqs), width="stretch", key=chart_key("hta", result, 1))
        _notes(seqs)
        st.caption(f"Runs of 2 to {seqs['max_len']} consecutive kernels on one stream seen at least twice: "
                   "fusing one saves its launches and the gaps inside it.")
        _table(seqs["by_time"], {"total_us": "GPU time (µs)", "mean_us": "each (µs)", "span_us": "span (µs)",
                                 "gap_us": "gaps (µs)", "count": "occurrences", "length": "kernels"})
    with tabs[1]:
        st.plotly_chart(build_queue_length_figure(q), width="stretch", key=chart_key("hta", result, 2))
        st.caption(queue_text(q))
        _notes(q)
        _table(q["streams"], {"full_us": "at full queue (µs)", "span_us": "span (µs)", "max": "max queued",
                              "mean": "mean queued"})
    with tabs[2]:
        st.plotly_chart(build_bandwidth_figure(bw), width="stretch", key=chart_key("hta", result, 3))
        _notes(bw)
        _table(bw["directions"], {"time_us": "time (µs)", "bytes_per_s": "bandwidth (GB/s)",
                                  "median_bytes_per_s": "median per copy (GB/s)",
                                  "max_bytes_per_s": "max per copy (GB/s)", "bytes": "bytes"})
    with tabs[3]:
        st.plotly_chart(build_annotations_figure(ann), width="stretch", key=chart_key("hta", result, 4))
        _notes(ann)
        _table(ann["annotations"], {"total_us": "total (µs)", "mean_us": "mean (µs)", "max_us": "max (µs)",
                                    "gpu_busy_us": "GPU busy inside (µs)"})
    with tabs[4]:
        st.plotly_chart(build_launch_delay_figure(ld), width="stretch", key=chart_key("hta", result, 5))
        _notes(ld)
        _table(ld["by_name"], {"mean_us": "mean (µs)", "min_us": "min (µs)", "p50_us": "median (µs)",
                               "p90_us": "p90 (µs)", "max_us": "max (µs)", "op": "launched by"})
        st.caption(overlap_text(result.get("comm_overlap") or {}) + " " + definitions_text(result))
