"""Figures for the profiler result: latency histogram, step breakdown, top operators, module tree,
kernels and a zoomable timeline. Each takes the typed ProfileResult; times are shown in ms."""

from __future__ import annotations

import textwrap
from pathlib import Path

import plotly.graph_objects as go

from diagnostics.analyses.profile import KernelRow, OperatorRow, ProfileResult, SplitRow, StepRow
from diagnostics.render.charts.timeline import build_timeline_figure as draw_timeline
from diagnostics.render.tables import is_trace_file, records_frame
from diagnostics.render.sections import Section
from diagnostics.render.charts.style import HIERARCHY_COLORSCALE, readable_axes, short_names

PHASE_COLORS = {"forward": "#4C78A8", "backward": "#F58518", "optimizer": "#54A24B", "zero_grad": "#B279A2",
                "other": "#BAB0AC"}
SPLIT_COLORS = {"kernel": "#4C78A8", "memcpy": "#F58518", "memset": "#E45756", "runtime": "#72B7B2",
                "cpu_exec": "#54A24B", "other": "#BAB0AC"}
SPLIT_LABELS = {"kernel": "kernel", "memcpy": "memcpy", "memset": "memset", "runtime": "CUDA runtime",
                "cpu_exec": "CPU exec", "other": "other"}


def _empty(title: str, message: str) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_layout(title=title, xaxis_visible=False, yaxis_visible=False, height=260)
    return fig


def build_latency_histogram_figure(result: ProfileResult) -> go.Figure:
    """Histogram of the timed iterations (ms) with median / p90 / p99 marked."""
    lat = result.latency
    fig = go.Figure(go.Histogram(x=list(lat.samples_ms), nbinsx=min(60, max(10, len(lat.samples_ms) // 3)),
                                 marker_color="#4C78A8", name="iterations",
                                 hovertemplate="%{x} ms<br>%{y} iterations<extra></extra>"))
    for value, label, dash in ((lat.median_ms, "median", "solid"), (lat.p90_ms, "p90", "dash"),
                               (lat.p99_ms, "p99", "dot")):
        fig.add_vline(x=value, line_dash=dash, line_color="#E45756",
                      annotation_text=f"{label} {value:.3g} ms", annotation_position="top")
    unit = "training step" if result.mode == "train" else "forward pass"
    fig.update_layout(title=f"Latency of {len(lat.samples_ms)} timed iterations ({unit}, {lat.method})",
                      xaxis_title="latency per iteration (ms)", yaxis_title="iterations (count)",
                      height=360, margin=dict(t=60, l=10, r=10, b=40), bargap=0.05)
    return readable_axes(fig)


def build_step_breakdown_figure(result: ProfileResult) -> go.Figure:
    """Stacked bars per profiled step: forward / backward / optimizer / zero_grad / other (ms)."""
    steps = result.steps
    if not steps:
        return _empty("Step time breakdown", "no profiled steps")
    x = [_step_label(s) for s in steps]
    fig = go.Figure()
    for phase in ("forward", "backward", "optimizer", "zero_grad", "other"):
        values = [getattr(s, f"{phase}_ms") for s in steps]
        if phase != "forward" and not any(values):
            continue
        fig.add_bar(x=x, y=values, name=phase, marker_color=PHASE_COLORS[phase],
                    hovertemplate="%{x}<br>" + phase + ": %{y:.3f} ms<extra></extra>")
    fig.update_layout(title="Step time breakdown (record_function ranges, CPU time)", barmode="stack",
                      xaxis_title="profiled step", yaxis_title="time (ms)", height=380,
                      margin=dict(t=50, l=10, r=10, b=40), legend=dict(orientation="h", y=1.02, x=1,
                                                                       xanchor="right", yanchor="bottom"))
    return fig


def _step_label(s: StepRow | SplitRow) -> str:
    return f"step {s.step}" + (f" (cycle {s.cycle})" if s.cycle else "")


def build_device_split_figure(result: ProfileResult) -> go.Figure:
    """The TensorBoard plugin's split per step: kernel / memcpy / memset / runtime / CPU exec / other (ms)."""
    rows = result.device_split
    if not rows:
        return _empty("Step time by execution category", "no profiled steps")
    x = [_step_label(s) for s in rows]
    fig = go.Figure()
    for cat in SPLIT_COLORS:
        fig.add_bar(x=x, y=[getattr(r, f"{cat}_ms") for r in rows], name=SPLIT_LABELS[cat], marker_color=SPLIT_COLORS[cat],
                    hovertemplate="%{x}<br>" + SPLIT_LABELS[cat] + ": %{y:.3f} ms<extra></extra>")
    fig.update_layout(title="Step time by execution category (kernel > memcpy > memset > runtime > CPU exec)",
                      barmode="stack", xaxis_title="profiled step", yaxis_title="time (ms)", height=380,
                      margin=dict(t=50, l=10, r=10, b=40), legend=dict(orientation="h", y=1.02, x=1,
                                                                       xanchor="right", yanchor="bottom"))
    return fig


def build_top_operators_figure(result: ProfileResult, n: int = 15, by: str = "self_cpu_ms",
                               rows: tuple[OperatorRow, ...] | None = None) -> go.Figure:
    """Horizontal bars of the top-n operators (default: the result's, or ``rows``: a filtered or by-shape
    table) by self CPU time or self device time (ms)."""
    rows = result.operators if rows is None else rows
    label = {"self_cpu_ms": "self CPU time", "self_device_ms": "self device time",
             "cpu_total_ms": "total CPU time", "device_total_ms": "total device time"}[by]
    top = sorted(rows, key=lambda r: -getattr(r, by))[:n]
    top = [r for r in top if getattr(r, by) > 0]
    if not top:
        return _empty(f"Top operators by {label}", f"no operator has {label}")
    names = [r.name + (f" {r.input_shapes}" if r.input_shapes else "") for r in top]
    fig = go.Figure(go.Bar(
        y=short_names(names), x=[getattr(r, by) for r in top], orientation="h", marker_color="#4C78A8",
        customdata=[[r.calls, r.cpu_total_ms, name] for r, name in zip(top, names)],
        hovertemplate="%{customdata[2]}<br>" + label + ": %{x:.3f} ms<br>calls: %{customdata[0]}"
                      "<br>total CPU: %{customdata[1]:.3f} ms<extra></extra>"))
    fig.update_layout(title=f"Top {len(top)} operators by {label} (all profiled steps)", xaxis_title=f"{label} (ms)",
                      yaxis=dict(autorange="reversed", title="operator"), height=max(300, 26 * len(top) + 120),
                      margin=dict(l=10, r=10, t=50, b=40))
    return readable_axes(fig)


def modules_missing(result: ProfileResult) -> str:
    """Why a profile has no module times: the analysis says (modules_note); a profile stored before it
    did is told apart by its with_modules setting."""
    if result.modules_note:
        return result.modules_note
    if not result.config.get("with_modules"):
        return "per-module times need with_modules (module ranges); it was off"
    return "no per-module times were recorded (with_modules was on)"


def build_module_tree_figure(result: ProfileResult, which: str = "forward") -> go.Figure:
    """Icicle of the module tree; a box's size is its module's inclusive forward or backward time (ms)."""
    mods = [m for m in result.modules if m.name != "(backward, no module)"]
    if not mods:
        return _empty(f"Module {which} time", "<br>".join(textwrap.wrap(modules_missing(result), 90)))
    total = [getattr(m, f"{which}_ms") for m in mods]
    own = [getattr(m, f"{which}_self_ms") for m in mods]
    if not any(total):
        return _empty(f"Module {which} time", f"no {which} time recorded"
                      + (" (inference runs no backward)" if which == "backward" else ""))
    fig = go.Figure(go.Icicle(
        ids=[m.name for m in mods], labels=[_module_label(m.name) for m in mods],
        marker=dict(colors=total, colorscale=HIERARCHY_COLORSCALE, colorbar=dict(title="ms"), showscale=True),
        parents=[m.parent or "" for m in mods], values=own, branchvalues="remainder",
        customdata=[[m.name, m.type, t, o, m.calls] for m, t, o in zip(mods, total, own)],
        hovertemplate="<b>%{customdata[0]}</b> (%{customdata[1]})<br>" + which
                      + " incl. children: %{customdata[2]:.3f} ms<br>self: %{customdata[3]:.3f} ms"
                        "<br>calls: %{customdata[4]}<extra></extra>",
        texttemplate="%{label}<br>%{customdata[2]:.2f} ms", tiling=dict(orientation="v")))
    fig.update_layout(title=f"Module {which} time (ms, all profiled steps; width = time incl. children)",
                      height=480, margin=dict(t=50, l=5, r=5, b=5))
    return fig


def _module_label(name: str) -> str:
    """A module's box label: its attribute name, with its parent's for Sequential children
    ('features.0', not '0')."""
    parts = name.split(".")
    i = len(parts) - 1
    while i > 0 and parts[i].isdigit():  # 'features.0.1', not '0.1'
        i -= 1
    return ".".join(parts[i:])


def build_kernel_figure(result: ProfileResult, n: int = 15) -> go.Figure:
    """Top-n GPU kernels by total time (ms), coloured by Tensor Core use."""
    kernels: tuple[KernelRow, ...] = result.kernels[:n]
    if not kernels:
        return _empty("GPU kernels", "no GPU kernels: CUDA did not run in this profile")
    # one label per row, named together: kernels whose names share their first 60 characters (CUTLASS's
    # templates often do) stay apart instead of drawn as one bar
    order = short_names([k.name for k in kernels], 60)
    fig = go.Figure()
    for tc, color, label in ((True, "#54A24B", "Tensor Cores"), (False, "#4C78A8", "no Tensor Cores")):
        ks = [(k, lab) for k, lab in zip(kernels, order) if k.tensor_cores == tc]
        if not ks:
            continue
        fig.add_bar(y=[lab for _, lab in ks], x=[k.total_us / 1e3 for k, _ in ks], orientation="h",
                    name=label, marker_color=color,
                    customdata=[[k.calls, k.mean_us, k.max_us, k.grid, k.block, k.name] for k, _ in ks],
                    hovertemplate="%{customdata[5]}<br>total %{x:.3f} ms over %{customdata[0]} calls<br>"
                                  "mean %{customdata[1]:.1f} µs, max %{customdata[2]:.1f} µs<br>"
                                  "grid %{customdata[3]}, block %{customdata[4]}<extra></extra>")
    fig.update_layout(title=f"Top {len(kernels)} GPU kernels by total time", xaxis_title="total kernel time (ms)",
                      yaxis=dict(categoryorder="array", categoryarray=order, autorange="reversed"),
                      height=max(300, 26 * len(kernels) + 120), margin=dict(l=10, r=10, t=50, b=40))
    return readable_axes(fig)


def build_timeline_figure(result: ProfileResult, search: str | None = None) -> go.Figure:
    """The last profiler cycle's timeline, drawn by the one timeline figure (charts.timeline)."""
    return draw_timeline(result.timeline, search=search, title="Timeline of the last profiler cycle")


# ----------------------------------------------------------------------------- report sections
def build_roofline_figure(result: ProfileResult) -> go.Figure:
    """Log-log roofline: one point per operator (achieved FLOP/s against FLOP per byte), sized by its
    time per step; the measured compute roof and memory roof drawn as lines."""
    import math

    rows = [r for r in result.roofline if r.flops > 0 and r.intensity]
    roofs = result.roofs
    if not rows or not roofs:
        return _empty("Roofline", "no operator with counted FLOPs and a measured time (or the roofline was off)")
    peak, bw = roofs.peak_flops, roofs.bandwidth_bytes_per_s
    xs = [r.intensity for r in rows]
    lo, hi = min(xs + [peak / bw]) / 4, max(xs + [peak / bw]) * 4
    grid = [lo * (hi / lo) ** (i / 60) for i in range(61)]
    fig = go.Figure()
    fig.add_scatter(x=grid, y=[min(peak, bw * x) for x in grid], mode="lines", name="roof (measured)",
                    line=dict(color="#616161"), hovertemplate="roof %{y:.3s}FLOP/s at %{x:.3g} FLOP/B<extra></extra>")
    cache = roofs.cache_bandwidth_bytes_per_s
    if cache and cache > bw:
        fig.add_scatter(x=grid, y=[min(peak, cache * x) for x in grid], mode="lines", name="roof in cache (measured)",
                        line=dict(color="#616161", dash="dot"))
    ds = roofs.datasheet
    if ds:
        fig.add_scatter(x=grid, y=[min(ds.peak_flops, ds.bandwidth_bytes_per_s * x) for x in grid], mode="lines",
                        name=f"roof ({ds.gpu} datasheet)", line=dict(color="#9e9e9e", dash="dash"))
    tmax = max(r.time_ms for r in rows)
    fig.add_scatter(
        x=xs, y=[r.achieved_tflops * 1e12 for r in rows], mode="markers", name="operators",
        marker=dict(size=[8 + 30 * math.sqrt(r.time_ms / tmax) for r in rows],
                    color=["#c62828" if r.bound == "memory" else "#4C78A8" for r in rows], opacity=0.75),
        text=[r.op for r in rows],
        customdata=[[r.time_ms, r.roof_ms, r.bound] for r in rows],
        hovertemplate="%{text}<br>%{y:.3s}FLOP/s at %{x:.3g} FLOP/B<br>%{customdata[0]:.3f} ms per step, "
                      "%{customdata[1]:.3f} ms at the roof (%{customdata[2]}-bound)<extra></extra>")
    fig.update_xaxes(type="log", title_text="arithmetic intensity (FLOP per byte moved, log)")
    fig.update_yaxes(type="log", title_text="achieved FLOP/s (log; G = 10^9)", exponentformat="SI")
    mfu = result.metrics.mfu
    fig.update_layout(title=f"Roofline ({roofs.device_name}, {roofs.dtype}; MFU "
                            f"{'n/a' if mfu is None else f'{100 * mfu:.1f}%'})",
                      height=440, margin=dict(l=10, r=10, t=50, b=40),
                      legend=dict(orientation="h", y=-0.18, x=1, xanchor="right"))
    return fig


def profile_sections(result: ProfileResult) -> list[Section]:
    lat = result.latency
    cfg = [f"{result.model} · {result.mode} · batch {result.batch_size} · device {result.device} · torch "
           f"{result.torch_version}",
           f"Latency: {lat.iterations} timed iterations after {lat.warmup} warm-up, outside the profiler "
           f"({lat.method}).", *result.notes]
    sections = [
        Section("Run", text=cfg),
        Section("Latency", figures=[build_latency_histogram_figure(result)]),
        Section("Steps", figures=[build_step_breakdown_figure(result), build_device_split_figure(result)],
                tables=[("steps", records_frame(result.steps))]),
        Section("Operators", figures=[build_top_operators_figure(result)],
                tables=[("operators (operators.csv has all, operators_by_shape.csv by input shape)",
                         records_frame(result.operators[:50]))]),
    ]
    if result.roofline:
        sections.append(Section("Roofline", figures=[build_roofline_figure(result)],
                                tables=[("roofline per operator (time per step, at the roof, headroom)",
                                         records_frame(result.roofline[:50]))]))
    if result.modules:
        sections.append(Section("Modules", figures=[build_module_tree_figure(result)]))
    if result.kernels:
        sections.append(Section("GPU kernels", figures=[build_kernel_figure(result)],
                                tables=[("kernels", records_frame(result.kernels[:50]))]))
    if result.timeline.events:
        sections.append(Section("Timeline", figures=[build_timeline_figure(result)]))
    files = [Path(p).name for p in (result.artifacts.trace_json, result.artifacts.trace_json_gz,
                                    result.artifacts.tb_zip)]
    sections.append(Section("Trace files", text=[
        "The Chrome trace in this folder (" + ", ".join(f for f in files if is_trace_file(Path(f))) + ") opens in "
        "https://ui.perfetto.dev or chrome://tracing, and in `python -m diagnostics trace analyze`."]))
    return sections
