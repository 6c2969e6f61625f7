"""The Trace explorer's Holistic Trace Analysis parity tabs (kernel sequences, launch queue, memcpy
bandwidth, GPU annotations, launch delay) and the widgets choosing their definitions. The figures and
words come from diagnostics.render.charts.trace_hta; ui.views.traces opens these tabs."""

from __future__ import annotations

import streamlit as st

from diagnostics.analyses.trace.result import TraceResult
from diagnostics.render.charts.trace_hta import (
    build_annotations_figure, build_bandwidth_figure, build_kernel_sequences_figure, build_launch_delay_figure,
    build_queue_length_figure, definitions_text, has_parts, overlap_text, queue_text,
)
from diagnostics.render.tables import frame
from ui.widgets import option_input, chart_key

__all__ = ["option_inputs", "has_parts", "show_kernel_sequences", "show_queue_length", "show_memcpy_bandwidth",
           "show_annotations", "show_launch_delay", "show_comm_overlap"]


def option_inputs() -> dict:
    """The trace analysis' definition options, as widgets (declared in diagnostics.analyses.trace): HTA's
    rules, the fusion-candidate length and the user's pattern for in-house communication kernels."""
    with st.expander("Definitions (to compare with Holistic Trace Analysis; your communication kernels)"):
        c1, c2 = st.columns(2)
        out = {"definitions": option_input("trace", "definitions", c1, radio=True),
               "sequence_length": option_input("trace", "sequence_length", c2)}
        pattern = option_input("trace", "comm_kernels", label="Communication kernels (regular expression)")
        if pattern:
            out["comm_kernels"] = pattern
        return out


def _table(rows, units: dict) -> None:
    """Typed rows with their units in the column names (``units``: key -> label with unit)."""
    df = frame(rows)
    if df.empty:
        st.caption("(none)")
        return
    df = df.drop(columns=["kernels"], errors="ignore")
    for col in df.columns:
        if col.endswith("bytes_per_s"):
            df[col] = df[col] / 1e9
    st.dataframe(df.rename(columns=units), hide_index=True, width="stretch")


def _notes(notes) -> None:
    for n in notes:
        st.info(n)


def show_kernel_sequences(result: TraceResult) -> None:
    seqs = result.kernel_sequences
    st.plotly_chart(build_kernel_sequences_figure(seqs), width="stretch", key=chart_key("hta", result.path, 1))
    _notes(seqs.notes)
    st.caption(f"Runs of 2 to {seqs.max_len} consecutive kernels on one stream seen at least twice: "
               "fusing one saves its launches and the gaps inside it.")
    _table(seqs.by_time, {"total_us": "GPU time (µs)", "mean_us": "each (µs)", "span_us": "span (µs)",
                          "gap_us": "gaps (µs)", "count": "occurrences", "length": "kernels"})


def show_queue_length(result: TraceResult) -> None:
    q = result.queue_length
    st.plotly_chart(build_queue_length_figure(q), width="stretch", key=chart_key("hta", result.path, 2))
    st.caption(queue_text(q))
    _notes(q.notes)
    _table(q.streams, {"full_us": "at full queue (µs)", "span_us": "span (µs)", "max": "max queued",
                       "mean": "mean queued"})


def show_memcpy_bandwidth(result: TraceResult) -> None:
    bw = result.memcpy_bandwidth
    st.plotly_chart(build_bandwidth_figure(bw), width="stretch", key=chart_key("hta", result.path, 3))
    _notes(bw.notes)
    _table(bw.directions, {"time_us": "time (µs)", "bytes_per_s": "bandwidth (GB/s)",
                           "median_bytes_per_s": "median per copy (GB/s)",
                           "max_bytes_per_s": "max per copy (GB/s)", "bytes": "bytes"})


def show_annotations(result: TraceResult) -> None:
    ann = result.annotations
    st.plotly_chart(build_annotations_figure(ann), width="stretch", key=chart_key("hta", result.path, 4))
    _notes(ann.notes)
    _table(ann.annotations, {"total_us": "total (µs)", "mean_us": "mean (µs)", "max_us": "max (µs)",
                             "gpu_busy_us": "GPU busy inside (µs)"})


def show_launch_delay(result: TraceResult) -> None:
    ld = result.launch_delay
    st.markdown("**Launch delay**")
    st.plotly_chart(build_launch_delay_figure(ld), width="stretch", key=chart_key("hta", result.path, 5))
    _notes(ld.notes)
    _table(ld.by_name, {"mean_us": "mean (µs)", "min_us": "min (µs)", "p50_us": "median (µs)",
                        "p90_us": "p90 (µs)", "max_us": "max (µs)", "op": "launched by"})
    st.caption(definitions_text(result))


def show_comm_overlap(result: TraceResult) -> None:
    """The communication / computation overlap sentence; the communication's own notes are shown above it
    (ui.views.traces), so they are not repeated here."""
    shown = result.communication.notes if result.communication else ()
    st.caption(overlap_text(result.comm_overlap, shown) + " " + definitions_text(result))
