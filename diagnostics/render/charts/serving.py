"""The serving view of an inference server's trace (diagnostics.trace.serving, issue #42): per iteration its
time split (attention, GEMM, communication, sampling, other compute, copies, the GPU waiting on the host),
its phase, batch and tokens, and the CUDA / HIP graph replays. Draws and says; computes nothing."""

from __future__ import annotations

import plotly.graph_objects as go

from diagnostics.analyses.trace.result import Serving
from diagnostics.render.charts.style import readable_axes
from diagnostics.render.sections import Section, section
from diagnostics.render.tables import records_frame
from diagnostics.units import column_scale

#: The split's parts in the result's order, each a colour.
SPLIT_COLORS = (("attention_us", "attention", "#4c78a8"), ("GEMM_us", "GEMM", "#72b7b2"),
                ("communication_us", "communication", "#f58518"), ("sampling_us", "sampling", "#e45756"),
                ("other_us", "other compute", "#54a24b"), ("copies_us", "copies", "#b279a2"),
                ("host_us", "host (GPU idle)", "#bab0ac"))


def _label(it) -> str:
    bits = [f"#{it.iteration}", it.phase or "?"]
    if it.batch_size is not None:
        bits.append(f"bs={it.batch_size}")
    if it.tokens is not None:
        bits.append(f"toks={it.tokens}")
    return " ".join(bits)


def build_serving_figure(serving: Serving) -> go.Figure:
    """One stacked bar per iteration: its time split, the phase, batch and tokens in its label."""
    its = serving.iterations
    sc = column_scale([it.time_us for it in its], "us")
    fig = go.Figure()
    labels = [_label(it) for it in its]
    for key, name, color in SPLIT_COLORS:
        fig.add_bar(name=name, y=labels, x=[getattr(it, key) / sc.factor for it in its], orientation="h",
                    marker_color=color)
    fig.update_layout(barmode="stack", title="Serving iterations: where each iteration's time went",
                      xaxis_title=f"time ({sc.suffix})", height=max(320, 40 * len(its) + 220),
                      # below the axis, across: a few iterations leave no room for 7 entries stacked at the side
                      legend=dict(orientation="h", yanchor="top", y=-0.3, x=0), margin=dict(b=110))
    return readable_axes(fig)


def serving_lines(serving: Serving | None) -> list[str]:
    """The serving view in sentences (the CLI's text and the report's)."""
    if not serving or not serving.available:
        return []
    out = [f"Inference server trace ({serving.engine or 'engine not named'}): {len(serving.iterations)} iteration(s), "
           f"phases from the {serving.phase_source or 'annotations'}"]
    for p in serving.phases:
        bs = f", median batch {p.batch_size_median:g}" if p.batch_size_median is not None else ""
        out.append(f"  {p.phase}: {p.iterations} iteration(s), median {p.median_us / 1e3:,.3f} ms "
                   f"(GPU busy {p.median_gpu_busy_us / 1e3:,.3f} ms), {p.tokens:,} tokens{bs}")
    for it in serving.iterations[:20]:
        parts = ", ".join(f"{name} {getattr(it, key) / 1e3:,.3f}" for key, name, _ in SPLIT_COLORS
                          if getattr(it, key) > 0)
        out.append(f"  iteration {_label(it)}: {it.time_us / 1e3:,.3f} ms ({parts} ms); "
                   f"{it.kernels:,} GPU events, {it.graph_kernels:,} of them replayed by {it.graph_launches} graph "
                   "launch(es)")
    g = serving.graphs
    if g and g.launches:
        share = f" ({g.share_of_gpu:.0%} of the GPU time)" if g.share_of_gpu is not None else ""
        out.append(f"  graph replays: {g.launches:,} launch(es) replayed {g.kernels:,} kernels, "
                   f"{g.gpu_us / 1e3:,.3f} ms of kernel time{share}, each kernel attributed to its launch")
    out += [f"  note: {n}" for n in serving.notes]
    return out


def serving_sections(serving: Serving | None) -> list[Section]:
    if not serving or not serving.available:
        return []
    tables = [("serving_iterations", records_frame(serving.iterations))]
    if serving.graphs and serving.graphs.by_launch:
        tables.append(("graph_replays", records_frame(serving.graphs.by_launch)))
    return [section("Serving", [lambda: build_serving_figure(serving)], text=serving_lines(serving), tables=tables)]
