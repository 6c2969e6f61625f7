"""Figures, report sections and text of the trace explorer's Holistic Trace Analysis parity results
(diagnostics.trace.gpu_activity: kernel_sequences, queue_length, memcpy_bandwidth, annotations,
launch_delay, comm_overlap). They draw, never compute; what was not counted is said, not drawn as 0."""

from __future__ import annotations

import plotly.graph_objects as go

from diagnostics.analyses.trace.result import (
    Annotations, KernelSequences, LaunchDelay, MemcpyBandwidth, QueueLength, TraceResult,
)
from diagnostics.render.charts.style import empty_figure

from diagnostics.render.sections import Section, section
from diagnostics.render.tables import records_frame
# the words, plotly-free (trace analyze's text and a reopen import no chart module); named here too
from diagnostics.render.trace_text import (  # noqa: F401
    _clip, _gbps, definitions_text, has_parts, hta_text, overlap_text, queue_text,
)

MAX_BARS = 20


def build_kernel_sequences_figure(seqs: KernelSequences) -> go.Figure:
    """Frequent kernel sequences by total GPU time (bars), occurrences in the hover."""
    rows = seqs.by_time[:MAX_BARS][::-1]
    title = "Frequent kernel sequences (fusion candidates)"
    if not rows:
        return empty_figure(title, "; ".join(seqs.notes) or "No run of kernels occurs twice on a stream")
    fig = go.Figure(go.Bar(
        x=[r.total_us for r in rows], y=[_clip(r.sequence) for r in rows], orientation="h",
        customdata=[[r.count, r.gap_us, r.sequence] for r in rows],
        hovertemplate="%{customdata[2]}<br>%{x:,.1f} µs of GPU time in %{customdata[0]} occurrences, "
                      "%{customdata[1]:,.1f} µs of gaps<extra></extra>"))
    fig.update_layout(title=title, xaxis_title="GPU time, all occurrences (µs)", yaxis_title="kernel sequence",
                      height=max(300, 24 * len(rows) + 140))
    return fig


def build_queue_length_figure(queue: QueueLength) -> go.Figure:
    """Launched GPU work queued per stream over time (a step line each), with the full-queue level."""
    series = queue.series
    title = "Launch queue length per stream"
    if not series:
        return empty_figure(title, "; ".join(queue.notes) or "No launched GPU work")
    fig = go.Figure([go.Scatter(x=[t / 1e3 for t in s.t_us], y=list(s.queued), mode="lines", line_shape="hv",
                                name=f"GPU {s.device} stream {s.stream}" + (" (sampled)" if s.sampled else ""))
                     for s in series])
    top = max(max(s.queued) for s in series)
    if top >= 0.5 * queue.full:
        fig.add_hline(y=queue.full, line_dash="dash", line_color="gray", annotation_text="full queue")
    until = "ends" if queue.until == "kernel_end" else "starts"
    fig.update_layout(title=f"{title} (a launch counts until its GPU work {until})",
                      xaxis_title="time (ms from trace start)", yaxis_title="launches queued (count)")
    return fig


def build_bandwidth_figure(bw: MemcpyBandwidth) -> go.Figure:
    """Bandwidth per copy direction; a direction whose bytes were not recorded is named, not drawn."""
    rows = bw.directions
    title = "Memcpy / memset bandwidth"
    counted = [r for r in rows if r.bytes_per_s is not None]
    if not counted:
        return empty_figure(title, "; ".join(bw.notes) or "No copies")
    fig = go.Figure([
        go.Bar(name="overall (bytes / time)", x=[r.direction for r in counted],
               y=[r.bytes_per_s / 1e9 for r in counted]),
        go.Bar(name="median per copy", x=[r.direction for r in counted],
               y=[(r.median_bytes_per_s or 0) / 1e9 for r in counted])])
    missing = [r.direction for r in rows if r.bytes_per_s is None]
    fig.update_layout(title=title + (f" (not counted: {', '.join(missing)})" if missing else ""),
                      xaxis_title="direction", yaxis_title="bandwidth (GB/s)", barmode="group")
    return fig


def build_annotations_figure(ann: Annotations) -> go.Figure:
    """Time per GPU user annotation, and GPU busy time inside it."""
    rows = ann.annotations[:MAX_BARS][::-1]
    title = "GPU user annotations"
    if not rows:
        return empty_figure(title, "; ".join(ann.notes) or "No GPU user annotations")
    names = [_clip(r.name) for r in rows]
    fig = go.Figure([
        go.Bar(name="annotation time", x=[r.total_us / 1e3 for r in rows], y=names, orientation="h",
               customdata=[r.count for r in rows],
               hovertemplate="%{y}: %{x:,.3f} ms over %{customdata} ranges<extra></extra>"),
        go.Bar(name="GPU busy inside", x=[r.gpu_busy_us / 1e3 for r in rows], y=names, orientation="h")])
    fig.update_layout(title=title, xaxis_title="time (ms)", yaxis_title="annotation", barmode="group",
                      height=max(300, 36 * len(rows) + 140))
    return fig


def _bin_label(b) -> str:
    return f"≥ {b.lo_us:g}" if b.hi_us is None else f"{b.lo_us:g}–{b.hi_us:g}"


def build_launch_delay_figure(ld: LaunchDelay) -> go.Figure:
    """How long after its launch call GPU work started: a histogram over all launches."""
    bins = ld.histogram
    title = f"Launch delay (call {'end' if ld.since == 'call_end' else 'start'} to GPU start)"
    if not bins:
        return empty_figure(title, "; ".join(ld.notes) or "No launches")
    fig = go.Figure(go.Bar(x=[_bin_label(b) for b in bins], y=[b.count for b in bins],
                           hovertemplate="%{x} µs: %{y:,} launches<extra></extra>"))
    fig.update_layout(title=f"{title}: median {ld.p50_us:,.1f} µs, p90 {ld.p90_us:,.1f} µs",
                      xaxis_title="launch delay (µs)", yaxis_title="launches (count)", xaxis_type="category")
    return fig


def hta_sections(result: TraceResult) -> list[Section]:
    """The report's sections for the HTA-parity results (none when the result predates them)."""
    if not has_parts(result):
        return []
    seqs, q, bw = result.kernel_sequences, result.queue_length, result.memcpy_bandwidth
    ann, ld = result.annotations, result.launch_delay
    return [
        section("Kernel sequences", [lambda: build_kernel_sequences_figure(seqs)], text=list(seqs.notes),
                tables=[("kernel sequences", records_frame(seqs.by_time).drop(columns=["kernels"], errors="ignore"))]),
        section("Launch queue", [lambda: build_queue_length_figure(q)], text=[queue_text(q), *q.notes],
                tables=[("queue per stream", records_frame(q.streams))]),
        section("Memcpy bandwidth", [lambda: build_bandwidth_figure(bw)], text=list(bw.notes),
                tables=[("bandwidth per direction", records_frame(bw.directions))]),
        section("GPU annotations", [lambda: build_annotations_figure(ann)], text=list(ann.notes),
                tables=[("annotations", records_frame(ann.annotations))]),
        section("Launch delay", [lambda: build_launch_delay_figure(ld)], text=list(ld.notes),
                tables=[("launch delay per kernel", records_frame(ld.by_name))]),
        section("Definitions", [], text=[overlap_text(result.comm_overlap), definitions_text(result)]),
    ]
