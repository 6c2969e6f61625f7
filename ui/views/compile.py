"""Show a torch.compile exploration: graph breaks with their source lines and fixes, graphs,
recompiles, compile time and eager vs compiled; while the job runs, Dynamo's graphs, breaks and
recompiles as soon as they are known (``show_partial``), before the compile and the timing end."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from diagnostics.analyses.compile.result import CompilePartial, CompileResult, GraphBreak, Recompile
from diagnostics.render.charts.compile import build_compile_time_figure, build_graphs_figure, build_timing_figure
from diagnostics.results import given
from diagnostics.units import compact
from ui.widgets import Tile, comparison_detail, metric_row


def tiles(result: CompileResult) -> list[Tile]:
    m, o = result.metrics, result.options
    compiled = result.timing.get("compiled")
    return [
        Tile("Graphs", m.graph_count, "count", "as torch._dynamo.explain counts them"),
        Tile("Graph breaks", m.graph_break_count, "count", f"{m.break_sites} distinct places"),
        Tile("Recompiles", m.recompiles, "count", "guard failures while running (incl. the batch x2 probe)"
             if o["recompile_probe"] else "guard failures while running"),
        Tile("Compile time", m.compile_time_s, "s", "Dynamo + backend, all frames of the first call; first call "
             + compact(m.first_call_ms, "ms")),
        Tile("Speed-up", m.speedup, "ratio", "compiled vs eager: eager time / compiled time, with its 95% "
             f"interval and verdict over {compiled.rounds if compiled else '?'} interleaved rounds",
             detail=comparison_detail([m.speedup_ci_low, m.speedup_ci_high], m.verdict)),
    ]


def show(result: CompileResult) -> None:
    m, o = result.metrics, result.options
    st.caption(f"{result.model} · device {result.device} · backend {o['backend']} · mode {o['mode']} · "
               f"dynamic {o['dynamic']} · torch {result.torch_version}")
    metric_row(tiles(result))
    if m.fullgraph_ok is False:
        st.error(f"fullgraph=True fails: {result.fullgraph_error}", icon=":material/call_split:")
    elif m.fullgraph_ok:
        st.success("The whole forward compiles as one graph (fullgraph=True).", icon=":material/check_circle:")
    for note in result.notes:
        st.caption(note)
    tabs = st.tabs(["Graph breaks", "Graphs", "Recompiles", "Time"])
    with tabs[0]:
        _breaks(result.graph_breaks)
    with tabs[1]:
        _graphs(result)
    with tabs[2]:
        _recompiles(result.recompiles)
    with tabs[3]:
        st.plotly_chart(build_timing_figure(result), width="stretch")
        if result.compile_frames:
            st.plotly_chart(build_compile_time_figure(result), width="stretch")


def _breaks(breaks: tuple[GraphBreak, ...]) -> None:
    if not breaks:
        st.info("No graph breaks: Dynamo captured the forward whole.")
    for b in breaks:
        with st.expander(f"{b.location} · {b.reason.splitlines()[0]} · hit {b.count}x", expanded=len(breaks) <= 3):
            if b.code:
                st.code(b.code, language="python")
            if b.suggestion:
                st.markdown(f"**What to change:** {b.suggestion}")
            st.text(b.reason)


def _graphs(result: CompileResult) -> None:
    st.plotly_chart(build_graphs_figure(result), width="stretch")
    st.dataframe(pd.DataFrame([{"graph": g.index, "ops": g.ops, "modules": ", ".join(g.modules)}
                               for g in result.graphs]), hide_index=True, width="stretch")


def _recompiles(recompiles: tuple[Recompile, ...]) -> None:
    if not recompiles:
        st.info("No recompiles.")
    for r in recompiles:
        st.markdown(f"**{r.function}** ({r.where})")
        for g in r.guard_failures:
            st.text(f"guard failed: {g}")
        if r.advice:
            st.caption(r.advice)


def partial_tiles(partial: CompilePartial) -> list[Tile]:
    m = partial.metrics
    compiled = partial.stage == "compiled"
    return [
        Tile("Graphs", m.graph_count, "count", "as torch._dynamo.explain counts them"),
        Tile("Graph breaks", m.graph_break_count, "count", f"{m.break_sites} distinct places"),
        Tile("Recompiles", m.recompiles if given(m.recompiles) else None, "count",
             "Dynamo's guard failures at the batch and at twice it", missing="checking…"),
        Tile("Compile time", partial.compile_time_s if compiled and given(partial.compile_time_s) else None, "s",
             f"backend {partial.options['backend']}: compiling now" if not compiled else
             "Dynamo + backend, all frames of the first call", missing="compiling…"),
    ]


def show_partial(partial: CompilePartial) -> None:
    """While the job runs: Dynamo's graphs and breaks (seconds in), then fullgraph and the recompiles, then
    the compile time; the speed-up comes with the result."""
    metric_row(partial_tiles(partial))
    if partial.metrics.fullgraph_ok is False:
        st.error(f"fullgraph=True fails: {partial.fullgraph_error}", icon=":material/call_split:")
    st.markdown("**Graph breaks**")
    _breaks(partial.graph_breaks)
    if partial.recompiles is not None:
        st.markdown("**Recompiles**")
        _recompiles(partial.recompiles)
