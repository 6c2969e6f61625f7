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

#: Where each Holistic Trace Analysis parity part is shown on the Trace explorer (ui.views.traces):
#: the fusion candidates beside the kernels, the rest in the "GPU" tab's own tabs.
PARTS = ("kernel_sequences", "queue_length", "memcpy_bandwidth", "annotations", "launch_delay", "comm_overlap")


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


def has_parts(result: dict) -> bool:
    """False for a result made before these analyses existed (then the page says so once)."""
    return "kernel_sequences" in result


def show_kernel_sequences(result: dict) -> None:
    seqs = result["kernel_sequences"]
    st.plotly_chart(build_kernel_sequences_figure(seqs), width="stretch", key=chart_key("hta", result, 1))
    _notes(seqs)
    st.caption(f"Runs of 2 to {seqs['max_len']} consecutive kernels on one stream seen at least twice: "
               "fusing one saves its launches and the gaps inside it.")
    _table(seqs["by_time"], {"total_us": "GPU time (µs)", "mean_us": "each (µs)", "span_us": "span (µs)",
                             "gap_us": "gaps (µs)", "count": "occurrences", "length": "kernels"})


def show_queue_length(result: dict) -> None:
    q = result["queue_length"]
    st.plotly_chart(build_queue_length_figure(q), width="stretch", key=chart_key("hta", result, 2))
    st.caption(queue_text(q))
    _notes(q)
    _table(q["streams"], {"full_us": "at full queue (µs)", "span_us": "span (µs)", "max": "max queued",
                          "mean": "mean queued"})


def show_memcpy_bandwidth(result: dict) -> None:
    bw = result["memcpy_bandwidth"]
    st.plotly_chart(build_bandwidth_figure(bw), width="stretch", key=chart_key("hta", result, 3))
    _notes(bw)
    _table(bw["directions"], {"time_us": "time (µs)", "bytes_per_s": "bandwidth (GB/s)",
                              "median_bytes_per_s": "median per copy (GB/s)",
                              "max_bytes_per_s": "max per copy (GB/s)", "bytes": "bytes"})


def show_annotations(result: dict) -> None:
    ann = result["annotations"]
    st.plotly_chart(build_annotations_figure(ann), width="stretch", key=chart_key("hta", result, 4))
    _notes(ann)
    _table(ann["annotations"], {"total_us": "total (µs)", "mean_us": "mean (µs)", "max_us": "max (µs)",
                                "gpu_busy_us": "GPU busy inside (µs)"})


def show_launch_delay(result: dict) -> None:
    ld = result["launch_delay"]
    st.markdown("**Launch delay**")
    st.plotly_chart(build_launch_delay_figure(ld), width="stretch", key=chart_key("hta", result, 5))
    _notes(ld)
    _table(ld["by_name"], {"mean_us": "mean (µs)", "min_us": "min (µs)", "p50_us": "median (µs)",
                           "p90_us": "p90 (µs)", "max_us": "max (µs)", "op": "launched by"})
    st.caption(definitions_text(result))


def show_comm_overlap(result: dict) -> None:
    """The communication / computation overlap sentence; the communication's own notes are shown above it
    (ui.views.traces), so they are not repeated here."""
    o = dict(result.get("comm_overlap") or {})
    shown = set((result.get("communication") or {}).get("notes") or [])
    o["notes"] = [n for n in o.get("notes") or [] if n not in shown]
    st.caption(overlap_text(o) + " " + definitions_text(result))
