"""Figures for the memory and batch-scan results: breakdown, per layer, timeline, estimate, scan."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots
from diagnostics.render.sections import MAX_HTML_ROWS, Section, notes, section
from diagnostics.render.tables import find_tables, records_frame

MIB = 2**20
COLORS = {
    "parameters": "#2E7D32",
    "gradients": "#1565C0",
    "optimizer state": "#F9A825",
    "activations": "#C62828",
    "temporaries": "#8E7CC3",
    "workspaces": "#6D4C41",
    "inputs": "#424242",
    "unattributed": "#9E9E9E",
}
ORDER = tuple(COLORS)


def _mib(v) -> float | None:
    return None if v is None else v / MIB


def build_memory_breakdown_figure(result: dict) -> go.Figure:
    """Stacked bars (MiB): what holds the training-step peak, per source, beside the inference peak."""
    bars = []
    if result.get("breakdown_at_peak"):
        bars.append(("At the peak<br>(profiler timeline)", result["breakdown_at_peak"]["parts"]))
    bars.append(("Resident sizes<br>(accounting)", result["accounting"]["parts"]))
    fig = go.Figure()
    for cat in ORDER:
        ys = [_mib(parts.get(cat, 0)) for _, parts in bars]
        if not any(ys):
            continue
        fig.add_bar(x=[b for b, _ in bars], y=ys, name=cat, marker_color=COLORS[cat],
                    hovertemplate="%{x}<br>" + cat + ": %{y:.2f} MiB<extra></extra>")
    peak = _mib(result["metrics"]["peak_train_bytes"])
    if peak is not None:  # None: a model on the meta device, counted without running
        fig.add_hline(y=peak, line_dash="dash", line_color="black",
                      annotation_text=f"measured training peak {peak:.2f} MiB", annotation_position="top left")
    title = (f"What holds the training-step peak (batch {result['batch_size']})" if peak is not None else
             "Weights, gradients and optimizer state (counted; activations not measured)")
    fig.update_layout(title=title, barmode="stack",
                      yaxis_title="memory (MiB)", height=420, margin=dict(t=50, l=10, r=10, b=10),
                      legend=dict(orientation="h", y=-0.15))
    return fig


def build_layer_activation_figure(result: dict, n: int = 30) -> go.Figure:
    """Per layer (forward order): output bytes and bytes saved for backward, in MiB."""
    rows = [r for r in result["layers"] if r["output_bytes"] or r["saved_bytes"]]
    if len(rows) > n:
        keep = set(id(r) for r in sorted(rows, key=lambda r: r["saved_bytes"] + r["output_bytes"], reverse=True)[:n])
        rows = [r for r in rows if id(r) in keep]
    names = [f"{r['layer']} ({r['type']})" for r in rows]
    fig = go.Figure()
    fig.add_bar(y=names, x=[_mib(r["saved_bytes"]) for r in rows], orientation="h", name="saved for backward",
                marker_color=COLORS["activations"], hovertemplate="%{y}<br>saved: %{x:.3f} MiB<extra></extra>")
    fig.add_bar(y=names, x=[_mib(r["output_bytes"]) for r in rows], orientation="h", name="output",
                marker_color="#EF9A9A", hovertemplate="%{y}<br>output: %{x:.3f} MiB<extra></extra>")
    fig.update_layout(title=f"Activation memory per layer (forward order, batch {result['batch_size']})",
                      barmode="group", xaxis_title="memory (MiB)", yaxis=dict(autorange="reversed"),
                      height=max(300, 24 * len(rows) + 140), margin=dict(t=50, l=10, r=10, b=40),
                      legend=dict(orientation="h", y=1.02, x=1, xanchor="right", yanchor="bottom"))
    return fig


def build_memory_timeline_figure(result: dict) -> go.Figure:
    """Memory by category over one training step (stacked areas, MiB), phases shaded."""
    tl = result["timeline"]
    fig = go.Figure()
    phases_only = tl.get("phases_only", False)
    x = tl["labels"] if phases_only else tl["times_ms"]
    for cat in ORDER:
        ys = tl["series"].get(cat)
        if not ys or not any(ys):
            continue
        fig.add_scatter(x=x, y=[_mib(v) for v in ys], name=cat, stackgroup="mem", mode="lines",
                        line=dict(width=0.5, color=COLORS[cat], shape="hv"),
                        hovertemplate=cat + ": %{y:.2f} MiB<extra></extra>")
    shades = {"forward": "#E3F2FD", "backward": "#FCE4EC", "optimizer": "#FFF8E1"}
    for name, (a, b) in (result.get("phases_ms") or {}).items():
        fig.add_vrect(x0=a, x1=b, fillcolor=shades.get(name, "#EEEEEE"), opacity=0.5, layer="below", line_width=0,
                      annotation_text=name, annotation_position="top left")
    fig.update_layout(title="Memory over one training step, by category", height=420,
                      xaxis_title="phase" if phases_only else "time since the step started (ms)",
                      yaxis_title="memory (MiB)", margin=dict(t=50, l=10, r=10, b=10), hovermode="x unified",
                      legend=dict(orientation="h", y=-0.2))
    return fig


def build_estimate_figure(result: dict) -> go.Figure:
    """Estimates made before running next to the measured peak (MiB), with the error in %."""
    est = result["estimate"]
    names = [e["name"] for e in est["estimates"]] + ["measured training peak"]
    values = [_mib(e["bytes"]) for e in est["estimates"]] + [_mib(est["measured_peak_bytes"])]
    text = [f"{e['error_pct']:+.1f} %" if e["error_pct"] is not None else "" for e in est["estimates"]] + ["measured"]
    fig = go.Figure(go.Bar(x=names, y=values, text=text, textposition="outside",
                           marker_color=["#90A4AE", "#5C6BC0", "#212121"],
                           hovertemplate="%{x}<br>%{y:.2f} MiB (%{text})<extra></extra>"))
    fig.update_layout(title="Estimate before running vs measured peak (error in %)", yaxis_title="memory (MiB)",
                      height=380, margin=dict(t=50, l=10, r=10, b=10))
    return fig


def build_batch_scan_figure(result: dict) -> go.Figure:
    """Latency, throughput and peak memory against the batch size, with the memory budget."""
    rows = [r for r in result["rows"] if r.get("fits")]
    batches = [r["batch"] for r in rows]
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.07,
                        subplot_titles=("Latency per step", "Throughput", "Peak memory"))
    fig.add_scatter(x=batches, y=[r["latency_ms"] for r in rows], mode="lines+markers", name="latency",
                    hovertemplate="batch %{x}: %{y:.2f} ms<extra></extra>", row=1, col=1)
    fig.add_scatter(x=batches, y=[r["throughput"] for r in rows], mode="lines+markers", name="throughput",
                    hovertemplate="batch %{x}: %{y:.0f} samples/s<extra></extra>", row=2, col=1)
    probes = rows + [s for s in result.get("search", []) if s["fits"]]
    probes = sorted(probes, key=lambda r: r["batch"])
    fig.add_scatter(x=[r["batch"] for r in probes], y=[_mib(r["peak_bytes"]) for r in probes],
                    mode="lines+markers", name="peak memory",
                    hovertemplate="batch %{x}: %{y:.2f} MiB<extra></extra>", row=3, col=1)
    failed = [r for r in result["rows"] if not r.get("fits")] + [s for s in result.get("search", []) if not s["fits"]]
    if failed:
        budget = _mib(result["budget"]["bytes"])
        fig.add_scatter(x=[r["batch"] for r in failed], y=[budget] * len(failed), mode="markers",
                        marker=dict(symbol="x", size=11, color="#C62828"), name="over budget / out of memory",
                        customdata=[r.get("reason") or "" for r in failed],
                        hovertemplate="batch %{x}: %{customdata}<extra></extra>", row=3, col=1)
    budget = _mib(result["budget"]["bytes"])
    fig.add_hline(y=budget, line_dash="dash", line_color="#C62828", row=3, col=1,
                  annotation_text=f"budget {budget:,.1f} MiB", annotation_position="bottom right")
    fig.update_xaxes(type="log", dtick=0.30102999566, title_text="batch size (samples, log scale)", row=3, col=1)
    fig.update_xaxes(type="log", dtick=0.30102999566, row=1, col=1)
    fig.update_xaxes(type="log", dtick=0.30102999566, row=2, col=1)
    fig.update_yaxes(title_text="latency (ms)", row=1, col=1)
    fig.update_yaxes(title_text="samples/s", row=2, col=1)
    peaks = [_mib(r["peak_bytes"]) for r in probes if r["peak_bytes"]]
    if peaks and budget > 4 * max(peaks):  # far-off budget: a log axis keeps the peaks from lying flat at 0
        fig.update_yaxes(type="log", title_text="peak (MiB, log scale)", row=3, col=1)
    else:
        fig.update_yaxes(title_text="peak (MiB)", row=3, col=1)
    fig.update_layout(title=f"Batch-size scan ({result['mode']})", height=720, showlegend=True,
                      margin=dict(t=70, l=10, r=10, b=10), legend=dict(orientation="h", y=-0.08))
    return fig


# ----------------------------------------------------------------------------- report sections
def memory_sections(result: dict) -> list[Section]:
    if result.get("meta"):  # a model on the meta device: what was counted, nothing measured
        return [section("Memory counted without running", [lambda: build_memory_breakdown_figure(result)],
                        text=notes(result))]

    sections = [section("Memory at the peak", [lambda: build_memory_breakdown_figure(result)],
                         text=notes(result)),
                section("Estimate against measurement", [lambda: build_estimate_figure(result)]),
                section("Activations by layer", [lambda: build_layer_activation_figure(result)]),
                section("Over time", [lambda: build_memory_timeline_figure(result)])]
    tables = [(name, records_frame(rows)) for name, rows in find_tables(result).items()
              if name not in ("inputs",) and not name.startswith("timeline")]
    if tables:
        sections.append(Section("Tables", tables=[(n, df.head(MAX_HTML_ROWS)) for n, df in tables]))
    return sections


def batch_scan_sections(result: dict) -> list[Section]:

    return [section("Batch-size scan", [lambda: build_batch_scan_figure(result)], text=notes(result),
                     tables=[(n, records_frame(r)) for n, r in find_tables(result).items() if n != "inputs"])]
