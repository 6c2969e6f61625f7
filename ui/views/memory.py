"""Show the memory result (peaks, breakdown, per layer, timeline, estimate, CUDA snapshot) and the
batch-scan result (table, chart, largest batch under the budget)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from diagnostics.render.charts.memory import (build_batch_scan_figure, build_estimate_figure, build_layer_activation_figure,
                                       build_memory_breakdown_figure, build_memory_timeline_figure)
from diagnostics.units import human_bytes
from ui.widgets import metric_row

MIB = 2**20


def _source_caption(label: str, source: str) -> None:
    st.caption(f"**{label}** — {source}")


def _show_counted(result: dict) -> None:
    """A model on the meta device (too big to build here): the counted static memory, no peaks."""
    m = result["metrics"]
    st.caption(f"{result['model']} · built on the meta device · optimizer {result['options']['optimizer']}")
    metric_row([
        ("Parameters", human_bytes(m["param_bytes"]), "weights as stored, tied weights once"),
        ("Gradients", human_bytes(m["grad_bytes"]), "one per trainable parameter"),
        ("Optimizer state", human_bytes(m["optimizer_state_bytes"]), result["accounting"]["source"]),
        ("Weights + gradients + optimizer", human_bytes(m["static_train_bytes"]), "activations not included"),
        ("Training-step peak", "not measured", "the model was not built: no activations, inputs or peaks"),
    ])
    for note in result.get("notes", []):
        st.info(note)
    st.plotly_chart(build_memory_breakdown_figure(result), width="stretch")


def show(result: dict) -> None:
    if result.get("meta"):
        _show_counted(result)
        return
    m = result["metrics"]
    st.caption(f"{result['model']} · device {result['device']} · batch {result['batch_size']} · optimizer "
               f"{result['options']['optimizer']}")
    est = result["estimate"]["estimates"][-1]  # the one estimate_bytes is
    metric_row([
        ("Training-step peak", human_bytes(m["peak_train_bytes"]), result["train"]["source"]),
        ("Inference peak", human_bytes(m["peak_inference_bytes"]), result["inference"]["source"]),
        ("Reserved (CUDA cache)", human_bytes(m["reserved_train_bytes"]) if m["reserved_train_bytes"] is not None
         else "n/a", "torch.cuda.max_memory_reserved; the CPU has no caching allocator to report"),
        ("Saved for backward", human_bytes(m["saved_activation_bytes"]),
         "activations autograd keeps for backward (saved_tensors_hooks), each storage once"),
        ("Estimate before running", human_bytes(m["estimate_bytes"]),
         f"error vs measured: {est['error_pct']:+.1f} %" if est["error_pct"] is not None else None),
        ("Process RSS", human_bytes(result["rss"]["end_bytes"]), result["rss"]["source"]),
    ])
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
    if snap and Path(snap["path"]).exists():
        st.download_button("Download CUDA memory snapshot (.pickle)", Path(snap["path"]).read_bytes(),
                           file_name=snap["file"], mime="application/octet-stream",
                           help="Open it at https://pytorch.org/memory_viz (drag the file onto the page)", on_click="ignore")
        st.caption(f"Snapshot: {human_bytes(snap['bytes'])} — {snap['note']}")

    tab_break, tab_layers, tab_time, tab_est = st.tabs(["Breakdown", "Per layer", "Timeline", "Estimate"])
    with tab_break:
        st.plotly_chart(build_memory_breakdown_figure(result), width="stretch")
        parts = result["accounting"]["parts"]
        at_peak = (result.get("breakdown_at_peak") or {}).get("parts", {})
        st.dataframe(pd.DataFrame([{"category": c, "at the peak (MiB)": at_peak.get(c, 0) / MIB if at_peak else None,
                                    "resident size (MiB)": parts.get(c, 0) / MIB}
                                   for c in dict.fromkeys(list(parts) + list(at_peak))]),
                     hide_index=True, width="stretch",
                     column_config={"at the peak (MiB)": st.column_config.NumberColumn(format="%.3f"),
                                    "resident size (MiB)": st.column_config.NumberColumn(format="%.3f")})
    with tab_layers:
        st.plotly_chart(build_layer_activation_figure(result), width="stretch")
        df = pd.DataFrame(result["layers"])
        if not df.empty:
            df = df.assign(output_mib=df["output_bytes"] / MIB, saved_mib=df["saved_bytes"] / MIB)
            st.dataframe(df[["layer", "type", "output_mib", "saved_mib"]], hide_index=True, width="stretch",
                         column_config={
                             "layer": st.column_config.TextColumn("Layer (forward order)"),
                             "type": st.column_config.TextColumn("Type"),
                             "output_mib": st.column_config.NumberColumn("Output (MiB)", format="%.4f"),
                             "saved_mib": st.column_config.NumberColumn("Saved for backward (MiB)", format="%.4f"),
                         })
    with tab_time:
        st.plotly_chart(build_memory_timeline_figure(result), width="stretch")
        st.caption(result["timeline"]["source"])
    with tab_est:
        st.plotly_chart(build_estimate_figure(result), width="stretch")
        st.caption(result["estimate"]["method"] + ". The first bar leaves out activations, as torchinfo's "
                   "estimate does.")


def show_scan(result: dict) -> None:
    m = result["metrics"]
    metric_row([
        ("Largest batch under budget", "none" if m["largest_batch_under_budget"] is None
         else str(m["largest_batch_under_budget"]), "found by doubling, then binary search"),
        ("Memory budget", human_bytes(m["budget_bytes"]), result["budget"]["source"]),
        ("Best throughput", "n/a" if m["max_throughput"] is None else f"{m['max_throughput']:,.0f} samples/s",
         None if m["best_throughput_batch"] is None else f"at batch {m['best_throughput_batch']}"),
        ("Probes", str(m["probes"]), None),
    ])
    if result["stopped"]:
        st.warning(result["summary"])
    else:
        st.success(result["summary"])
    st.plotly_chart(build_batch_scan_figure(result), width="stretch")
    st.caption(f"Memory: {result['memory_source']}. Timing: {result['timing_source']}.")
    df = pd.DataFrame(result["rows"] + [{**s, "searched": True} for s in result["search"]])
    df = df.assign(peak_mib=df["peak_bytes"].astype(float) / MIB)
    cols = [c for c in ["batch", "fits", "latency_ms", "throughput", "peak_mib", "reason"] if c in df]
    st.dataframe(df[cols], hide_index=True, width="stretch",
                 column_config={"latency_ms": st.column_config.NumberColumn("Latency (ms)", format="%.2f"),
                                "throughput": st.column_config.NumberColumn("Throughput (samples/s)", format="%.0f"),
                                "peak_mib": st.column_config.NumberColumn("Peak (MiB)", format="%.2f")})


#: How this module shows each analysis' result (ui.views.show finds it through the analysis' ``view``).
VIEWS = {"memory": show, "batch_scan": show_scan}
