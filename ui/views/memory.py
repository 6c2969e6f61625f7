"""Show the memory result (peaks, breakdown, per layer, timeline, estimate, CUDA snapshot) and the
batch-scan result (table, chart, largest batch under the budget)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from diagnostics.render.charts.memory import (build_batch_scan_figure, build_estimate_figure, build_layer_activation_figure,
                                       build_memory_breakdown_figure, build_memory_timeline_figure)
from diagnostics.units import human_bytes
from ui.widgets import Tile, artifact_bytes, artifact_size, metric_row, unit_columns


def _source_caption(label: str, source: str) -> None:
    st.caption(f"**{label}** — {source}")


def _show_counted(result: dict) -> None:
    """A model on the meta device (too big to build here): the counted static memory, no peaks."""
    m = result["metrics"]
    st.caption(f"{result['model']} · built on the meta device · optimizer {result['options']['optimizer']}")
    metric_row([
        Tile("Parameters", m["param_bytes"], "bytes", "weights as stored, tied weights once"),
        Tile("Gradients", m["grad_bytes"], "bytes", "one per trainable parameter"),
        Tile("Optimizer state", m["optimizer_state_bytes"], "bytes", result["accounting"]["source"]),
        Tile("Static total", m["static_train_bytes"], "bytes",
             "weights + gradients + optimizer state; activations not included"),
        Tile("Training peak", None, "bytes", "the model was not built: no activations, inputs or peaks",
             missing="not measured"),
    ])
    for note in result.get("notes", []):
        st.info(note)
    st.plotly_chart(build_memory_breakdown_figure(result), width="stretch")


def tiles(result: dict) -> list[Tile]:
    m = result["metrics"]
    est = result["estimate"]["estimates"][-1]  # the one estimate_bytes is
    return [
        Tile("Training peak", m["peak_train_bytes"], "bytes", "peak of one training step: " + result["train"]["source"]),
        Tile("Inference peak", m["peak_inference_bytes"], "bytes", result["inference"]["source"]),
        Tile("Reserved", m["reserved_train_bytes"], "bytes",
             "reserved by the CUDA caching allocator (torch.cuda.max_memory_reserved); the CPU has no caching "
             "allocator to report"),
        Tile("Saved for backward", m["saved_activation_bytes"], "bytes",
             "activations autograd keeps for backward (saved_tensors_hooks), each storage once"),
        Tile("Estimate", m["estimate_bytes"], "bytes",
             "estimated before running" + (f"; error vs measured: {est['error_pct']:+.1f} %"
                                           if est["error_pct"] is not None else "")),
        Tile("Process RSS", result["rss"]["end_bytes"], "bytes", result["rss"]["source"]),
    ]


def scan_tiles(result: dict) -> list[Tile]:
    m = result["metrics"]
    return [
        Tile("Largest batch", m["largest_batch_under_budget"], "count",
             "the largest batch under the memory budget, found by doubling, then binary search", missing="none"),
        Tile("Memory budget", m["budget_bytes"], "bytes", result["budget"]["source"]),
        Tile("Best throughput", m["max_throughput"], "per_s",
             "samples per second" + ("" if m["best_throughput_batch"] is None
                                     else f", at batch {m['best_throughput_batch']}")),
        Tile("Probes", m["probes"], "count", "batch sizes tried"),
    ]


def show(result: dict) -> None:
    if result.get("meta"):
        _show_counted(result)
        return
    m = result["metrics"]
    st.caption(f"{result['model']} · device {result['device']} · batch {result['batch_size']} · optimizer "
               f"{result['options']['optimizer']}")
    metric_row(tiles(result))
    with st.expander("Where each figure comes from"):
        _source_caption("Training-step peak", result["train"]["source"])
        _source_caption("Inference peak", result["inference"]["source"])
        _source_caption("Breakdown at the peak", (result.get("breakdown_at_peak") or {}).get("source", "not available"))
        _source_caption("Resident sizes", result["accounting"]["source"])
        _source_caption("Timeline", result["timeline"]["source"])
        _source_caption("Estimate", result["estimate"]["method"])
        _source_caption("Process RSS", result["rss"]["source"])
    for note in result.get("notes", []):
        st.info(note)
    snap = result.get("snapshot")
    if snap and artifact_size(snap["path"]) is not None:
        st.download_button("Download CUDA memory snapshot (.pickle)", lambda: artifact_bytes(snap["path"]),
                           file_name=snap["file"], mime="application/octet-stream",
                           help="Open it at https://pytorch.org/memory_viz (drag the file onto the page)", on_click="ignore")
        st.caption(f"Snapshot: {human_bytes(snap['bytes'])} — {snap['note']}")

    tab_break, tab_layers, tab_time, tab_est = st.tabs(["Breakdown", "Per layer", "Timeline", "Estimate"])
    with tab_break:
        st.plotly_chart(build_memory_breakdown_figure(result), width="stretch")
        parts = result["accounting"]["parts"]
        at_peak = (result.get("breakdown_at_peak") or {}).get("parts", {})
        df, config = unit_columns(
            pd.DataFrame([{"category": c, "at_peak": at_peak.get(c, 0) if at_peak else None,
                           "resident": parts.get(c, 0)} for c in dict.fromkeys(list(parts) + list(at_peak))]),
            {"at_peak": ("At the peak", "bytes"), "resident": ("Resident size", "bytes")},
            {"category": st.column_config.TextColumn("Category")})
        st.dataframe(df, hide_index=True, width="stretch", column_config=config)
    with tab_layers:
        st.plotly_chart(build_layer_activation_figure(result), width="stretch")
        df = pd.DataFrame(result["layers"])
        if not df.empty:
            df, config = unit_columns(df[["layer", "type", "output_bytes", "saved_bytes"]], {
                "output_bytes": ("Output", "bytes"), "saved_bytes": ("Saved for backward", "bytes")}, {
                "layer": st.column_config.TextColumn("Layer (forward order)"),
                "type": st.column_config.TextColumn("Type")})
            st.dataframe(df, hide_index=True, width="stretch", column_config=config)
    with tab_time:
        st.plotly_chart(build_memory_timeline_figure(result), width="stretch")
        st.caption(result["timeline"]["source"])
    with tab_est:
        st.plotly_chart(build_estimate_figure(result), width="stretch")
        st.caption(result["estimate"]["method"] + ". The first bar leaves out activations, as torchinfo's "
                   "estimate does.")


def show_scan(result: dict) -> None:
    metric_row(scan_tiles(result))
    if result["stopped"]:
        st.warning(result["summary"])
    else:
        st.success(result["summary"])
    st.plotly_chart(build_batch_scan_figure(result), width="stretch")
    st.caption(f"Memory: {result['memory_source']}. Timing: {result['timing_source']}.")
    df = pd.DataFrame(result["rows"] + [{**s, "searched": True} for s in result["search"]])
    cols = [c for c in ["batch", "fits", "latency_ms", "throughput", "peak_bytes", "reason"] if c in df]
    df, config = unit_columns(df[cols], {"latency_ms": ("Latency", "ms"), "peak_bytes": ("Peak", "bytes")}, {
        "throughput": st.column_config.NumberColumn("Throughput (samples/s)", format="%.0f")})
    st.dataframe(df, hide_index=True, width="stretch", column_config=config)
