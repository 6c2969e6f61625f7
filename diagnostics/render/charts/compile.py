"""Figures for the torch.compile explorer: ops per graph (where the breaks cut the model), eager vs
compiled time with the interval, and compile time per frame."""

from __future__ import annotations

import plotly.graph_objects as go

from diagnostics.analyses.compile.result import CompilePartial, CompileResult
from diagnostics.render.sections import Section, notes, section
from diagnostics.render.tables import records_frame
from diagnostics.results import given
from diagnostics.units import format_value, speedup_text


def build_graphs_figure(result: CompileResult) -> go.Figure:
    """Ops captured per graph, in order: every gap between two bars is a graph break."""
    graphs = result.graphs
    labels = [f"graph {g.index}" for g in graphs]
    fig = go.Figure(go.Bar(x=labels, y=[g.ops for g in graphs], marker_color="#4C78A8",
                           customdata=[", ".join(g.modules) or "(no module: free functions)" for g in graphs],
                           hovertemplate="%{x}: %{y} ops<br>modules: %{customdata}<extra></extra>"))
    for i, b in enumerate(result.graph_breaks[: max(0, len(graphs) - 1)]):
        fig.add_annotation(x=i + 0.5, y=max((g.ops for g in graphs), default=1), text=f"break: {b.location}",
                           showarrow=False, textangle=-90, font=dict(size=10, color="#c62828"), yanchor="top")
    fig.update_layout(title=f"Ops per captured graph ({len(graphs)} graphs, "
                            f"{result.metrics.graph_break_count} breaks)",
                      xaxis_title="graph, in execution order", yaxis_title="ops captured (count)",
                      height=340, margin=dict(l=10, r=10, t=50, b=40), showlegend=False)
    return fig


def build_timing_figure(result: CompileResult) -> go.Figure:
    """Time per call, eager and compiled (inference; a training step when measured): the geometric mean of
    the interleaved rounds' times, whose ratio is the speed-up in the title (with its interval)."""
    m = result.metrics
    names, ms, colors = ["eager", "compiled"], [m.eager_ms, m.compiled_ms], ["#9e9e9e", "#2e7d32"]
    t = result.train_timing
    if t:
        names += ["eager train step", "compiled train step"]
        ms += [t.eager_ms, t.compiled_ms]
        colors += ["#9e9e9e", "#2e7d32"]
    fig = go.Figure(go.Bar(x=ms, y=names, orientation="h", marker_color=colors,
                           hovertemplate="%{y}: %{x:.3f} ms<extra></extra>"))
    sp = speedup_text(m.speedup, [m.speedup_ci_low, m.speedup_ci_high], m.verdict)
    fig.update_layout(title=f"Eager vs compiled, time per call (speed-up {sp})", xaxis_title="time per call (ms)",
                      yaxis=dict(autorange="reversed"), height=260 + 30 * len(names),
                      margin=dict(l=10, r=10, t=50, b=40), showlegend=False)
    return fig


def build_compile_time_figure(result: CompileResult) -> go.Figure:
    frames = result.compile_frames
    fig = go.Figure(go.Bar(x=[f"frame {f.frame}" for f in frames], y=[f.seconds for f in frames],
                           marker_color="#F58518", hovertemplate="%{x}: %{y:.3f} s<extra></extra>"))
    fig.update_layout(title="Compile time per compiled frame (first call)", xaxis_title="frame (a graph and its guards)",
                      yaxis_title="compile time (s)", height=300, margin=dict(l=10, r=10, t=50, b=40))
    return fig


def compile_sections(result: CompileResult) -> list[Section]:
    return [
        section("Graph breaks", [lambda: build_graphs_figure(result)], text=notes(result),
                tables=[("graph breaks (reason, file:line, suggested rewrite)", records_frame(result.graph_breaks)),
                        ("graphs", records_frame(result.graphs))]),
        section("Time", [lambda: build_timing_figure(result), lambda: build_compile_time_figure(result)],
                tables=[("recompiles", records_frame(result.recompiles))]),
    ]


# ----------------------------------------------------------------------------- lines as they come
def dynamo_lines(result: CompilePartial | CompileResult) -> list[tuple[tuple, str]]:
    """What the CLI prints while the compile job runs (then from the final result): Dynamo's graphs and
    breaks, fullgraph and the recompiles as soon as the light pass has them, then the compile time; (key,
    text) pairs, each key printed once."""
    m = result.metrics
    partial = isinstance(result, CompilePartial)
    out = [(("graphs",), f"  Dynamo: {m.graph_count} graph(s), {m.graph_break_count} graph break(s) at "
                         f"{m.break_sites} place(s), {m.op_count} ops")]
    for b in result.graph_breaks:
        out.append((("break", b.location, b.reason),
                    f"  break at {b.location}: {b.reason.splitlines()[0]}" + (f" (hit {b.count}x)" if b.count > 1 else "")))
    if given(m.fullgraph_ok):
        out.append((("fullgraph",), "  fullgraph=True: " + ("compiles as one graph" if m.fullgraph_ok else
                                                            f"fails: {result.fullgraph_error}")))
    if result.recompiles is not None and not (partial and result.stage == "explain"):
        out.append((("recompiles",), f"  recompiles: {len(result.recompiles)}"
                    + "".join(f"; {r.function}: {'; '.join(r.guard_failures[:1])}" for r in result.recompiles[:3])))
    seconds = result.compile_time_s if partial else m.compile_time_s
    if (not partial or result.stage == "compiled") and given(seconds):
        out.append((("compiled",), f"  compiled ({result.options['backend']}) in {format_value(seconds, 's')}"))
    return out
