"""The Trace explorer's "Critical path" tab: one step's critical path (the trace result's
``critical_path``), its time by kind, the what-ifs and the exported trace with the path marked. Another
step picked on the tab is the trace_critical_path part, recomputed from the columns the trace run kept
(not the whole trace job again)."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from diagnostics.analyses.trace.result import CriticalPath, TraceCriticalPathResult, TraceResult
from diagnostics.render.charts.critical_path import (
    CRITICAL_PATH_HELP, build_critical_path_breakdown_figure, build_critical_path_timeline_figure,
    build_what_if_figure, headline,
)
from diagnostics.render.tables import frame
from diagnostics.results import given
from ui.widgets import Tile, artifact_bytes, artifact_size, metric_row, chart_key

#: Columns of the path table, in µs in the result, shown in ms.
_PATH_COLS = {"name": "event", "kind": "kind", "where": "where", "start_us": "start (ms from step start)",
              "dur_us": "duration (ms)", "on_path_us": "on the path (ms)", "wait_before_us": "wait before (ms)",
              "waited_on": "waited on"}
_WHAT_IF_COLS = {"name": "event", "kind": "kind", "calls": "calls in the step", "on_path_us": "on the path (ms)",
                 "sped_up_us": "with nested calls (ms)", "saving_us": "step time saved (ms)",
                 "step_us_after": "step time after (ms)"}


def is_us(column: str) -> bool:
    """An engine column in µs: name ending in _us or with _us_ inside (step_us_after)."""
    return column.endswith("_us") or "_us_" in column


def _ms_table(rows, columns: dict, height: int | None = None) -> None:
    df = frame(rows)
    if df.empty:
        st.caption("(none)")
        return
    df = df[[c for c in columns if c in df.columns]]
    us = [c for c in df.columns if is_us(c)]  # engine µs shown in ms (step_us_after too, not only *_us)
    for c in us:
        df[c] = df[c] / 1e3
    config = {c: st.column_config.NumberColumn(columns[c], format="%.3f") for c in us}
    st.dataframe(df.rename(columns={c: columns[c] for c in df.columns if c not in us}), hide_index=True,
                 width="stretch", height=height or "auto", column_config=config)


def _other_step(result: TraceResult, cp: CriticalPath) -> tuple[CriticalPath | None, bool]:
    """(the critical path of the step the user picked, or None: none picked; False when its job failed or is
    still running, which the page shows). It is the trace_critical_path part on the columns the trace run
    kept; a result without them (keep_columns off, or its run folder gone) runs the trace job again with
    ``critical_path_step``."""
    from diagnostics.analyses.trace.job import columns_kept
    from diagnostics.trace.cache import stamp as file_stamp
    from ui.jobs import run_analysis

    steps = [s.step for s in result.summary.steps]
    if not steps or (len(steps) < 2 and cp.available):
        return None, True
    current = cp.step if cp.available else None
    pick = st.selectbox("Step", steps, index=steps.index(current) if current in steps else None,
                        placeholder="pick a step",
                        key=f"cp-step-{result.path}",
                        help="The profiler step whose critical path is shown (the default is the longest "
                             "complete step)")
    if pick is None or pick == current:
        return None, True
    label = f"Critical path of step {pick}"
    if result.columns_dir and columns_kept(result.columns_dir):
        out = run_analysis("trace_critical_path", None, {"columns_dir": result.columns_dir,
                                                         "critical_path_step": int(pick)}, label=label)
        part: TraceCriticalPathResult | None = out.result if out.ok else None
        other = part.critical_path if part is not None else None
    else:
        options = {"path": result.path, "stamp": file_stamp(result.path), "critical_path_step": int(pick)}
        if result.name != Path(result.path).name:
            options["display_name"] = result.name
        out = run_analysis("trace", None, options, label=label)
        whole: TraceResult | None = out.result if out.ok else None
        other = whole.critical_path if whole is not None and whole.critical_path else None
    if out.ok and other is not None:
        return other, True
    if out.error:
        st.error(out.error)
    return None, False


def show_critical_path(result: TraceResult) -> None:
    cp = result.critical_path
    if not cp:
        st.info("This result has no critical path (it was computed before TorchScope had one): open the trace again.")
        return
    if not cp.available:
        st.info(headline(cp))
    other, done = _other_step(result, cp)
    if not done or not (other or cp).available:
        if other:
            st.info(headline(other))
        return
    show_path(other or cp, result.path)


def show_part(result: TraceCriticalPathResult) -> None:
    """A trace_critical_path run on its own (History): another step's critical path of a trace opened before."""
    if not result.critical_path.available:
        st.info(headline(result.critical_path))
        return
    show_path(result.critical_path, result.critical_path.trace_file or "")


def show_path(cp: CriticalPath, ident: str) -> None:
    """One available critical path: tiles, headline, notes, the charts, the what-if and path tables, the
    exported trace (``ident``: what tells this result's charts apart on a page)."""
    metric_row([
        Tile("Step", str(cp.step), "text", "ProfilerStep number"),
        Tile("CPU step", cp.host_span_us, "us", "the ProfilerStep range on the CPU: the Steps table's figure"),
        Tile("To last GPU work", cp.step_us, "us",
             "from the step's start to the end of its host span or of its last GPU work, whichever is later: "
             "the critical path's length. Longer than the CPU step when the GPU runs behind the CPU"),
        Tile("GPU window", cp.gpu_window_us if given(cp.gpu_window_us) else None, "us",
             "the GPU's time for this step's work: from its first GPU event to the next step's (GPU time per step)"),
        Tile("Path events", cp.path_events, "count", f"events on the path, of {cp.events:,} in the step"),
    ])
    st.caption(headline(cp))
    for note in cp.notes or ():
        st.info(note)
    ident = f"{ident}-{cp.step}"
    st.plotly_chart(build_critical_path_breakdown_figure(cp), width="stretch", key=chart_key("cp", ident, 1))
    st.plotly_chart(build_critical_path_timeline_figure(cp), width="stretch", key=chart_key("cp", ident, 2))
    st.markdown("**What if it were faster**")
    st.plotly_chart(build_what_if_figure(cp), width="stretch", key=chart_key("cp", ident, 3))
    _ms_table(cp.what_if, _WHAT_IF_COLS)
    st.markdown("**Events on the critical path** (in path order)")
    if cp.path_events > len(cp.path):
        st.caption(f"the first {len(cp.path):,} of {cp.path_events:,} events are listed")
    _ms_table(cp.path, _PATH_COLS, height=360)
    st.caption(CRITICAL_PATH_HELP)
    f = cp.trace_file
    if f and artifact_size(f) is not None:
        st.download_button("Download the step's trace with the critical path (JSON)", lambda: artifact_bytes(f),
                           file_name=f"critical_path_step{cp.step}.pt.trace.json", mime="application/json",
                           key=f"cp-trace-{f}", on_click="ignore", icon=":material/download:",
                           help="Opens in Perfetto (ui.perfetto.dev) or chrome://tracing: path events carry "
                                "args critical = 1, arrows named 'critical path' chain them")
