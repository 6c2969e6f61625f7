"""The Trace explorer's "Critical path" tab: one step's critical path (the trace result's
"critical_path" key), its time by kind, the what-ifs and the exported trace with the path marked."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from diagnostics.render.charts.critical_path import (
    CRITICAL_PATH_HELP, build_critical_path_breakdown_figure, build_critical_path_timeline_figure,
    build_what_if_figure, headline,
)
from ui.widgets import Tile, artifact_bytes, artifact_size, metric_row, chart_key

#: Columns of the path table, in µs in the result, shown in ms.
_PATH_COLS = {"name": "event", "kind": "kind", "where": "where", "start_us": "start (ms from step start)",
              "dur_us": "duration (ms)", "on_path_us": "on the path (ms)", "wait_before_us": "wait before (ms)",
              "waited_on": "waited on"}
_WHAT_IF_COLS = {"name": "event", "kind": "kind", "calls": "calls in the step", "on_path_us": "on the path (ms)",
                 "saving_us": "step time saved (ms)", "step_us_after": "step time after (ms)"}


def is_us(column: str) -> bool:
    """An engine column in µs: name ending in _us or with _us_ inside (step_us_after)."""
    return column.endswith("_us") or "_us_" in column


def _ms_table(rows: list, columns: dict, height: int | None = None) -> None:
    if not rows:
        st.caption("(none)")
        return
    df = pd.DataFrame(rows)[[c for c in columns if c in rows[0]]]
    us = [c for c in df.columns if is_us(c)]  # engine µs shown in ms (step_us_after too, not only *_us)
    for c in us:
        df[c] = df[c] / 1e3
    config = {c: st.column_config.NumberColumn(columns[c], format="%.3f") for c in us}
    st.dataframe(df.rename(columns={c: columns[c] for c in df.columns if c not in us}), hide_index=True,
                 width="stretch", height=height or "auto", column_config=config)


def _other_step(result: dict, cp: dict) -> dict | None:
    """The critical path of another step, when the user picks one: the trace job again with
    ``critical_path_step`` (its other figures are the same)."""
    from diagnostics.trace.cache import stamp as file_stamp
    from ui.jobs import run_analysis

    steps = [int(s["step"]) for s in (result.get("summary") or {}).get("steps") or []]
    if not steps or (len(steps) < 2 and cp.get("available")):
        return None
    current = int(cp["step"]) if cp.get("available") else None
    pick = st.selectbox("Step", steps, index=steps.index(current) if current in steps else None,
                        placeholder="pick a step",
                        key=f"cp-step-{result['path']}",
                        help="The profiler step whose critical path is shown (the default is the longest "
                             "complete step)")
    if pick is None or pick == current:
        return None
    options = {"path": result["path"], "stamp": file_stamp(result["path"]), "critical_path_step": int(pick)}
    if result.get("name") and result["name"] != Path(result["path"]).name:
        options["display_name"] = result["name"]
    out = run_analysis("trace", None, options, label=f"Critical path of step {pick}")
    if out.ok:
        return out.result.get("critical_path")
    if out.error:
        st.error(out.error)
    return {}


def show_critical_path(result: dict) -> None:
    cp = result.get("critical_path")
    if not cp:
        st.info("This result has no critical path (it was computed before TorchScope had one): open the trace again.")
        return
    if not cp.get("available", True):
        st.info(headline(cp))
    other = _other_step(result, cp)
    if other == {} or not (other or cp).get("available", True):
        if other:
            st.info(headline(other))
        return
    cp = other or cp
    metric_row([
        Tile("Step", str(cp["step"]), "text", "ProfilerStep number"),
        Tile("CPU step", cp["host_span_us"], "us", "the ProfilerStep range on the CPU: the Steps table's figure"),
        Tile("To last GPU work", cp["step_us"], "us",
             "from the step's start to the end of its host span or of its last GPU work, whichever is later: "
             "the critical path's length. Longer than the CPU step when the GPU runs behind the CPU"),
        Tile("GPU window", cp.get("gpu_window_us"), "us",
             "the GPU's time for this step's work: from its first GPU event to the next step's (GPU time per step)"),
        Tile("Path events", cp["path_events"], "count", f"events on the path, of {cp['events']:,} in the step"),
    ])
    st.caption(headline(cp))
    for note in cp.get("notes") or []:
        st.info(note)
    st.plotly_chart(build_critical_path_breakdown_figure(cp), width="stretch", key=chart_key("cp", result, 1))
    st.plotly_chart(build_critical_path_timeline_figure(cp), width="stretch", key=chart_key("cp", result, 2))
    st.markdown("**What if it were faster**")
    st.plotly_chart(build_what_if_figure(cp), width="stretch", key=chart_key("cp", result, 3))
    _ms_table(cp["what_if"], _WHAT_IF_COLS)
    st.markdown("**Events on the critical path** (in path order)")
    if cp["path_events"] > len(cp["path"]):
        st.caption(f"the first {len(cp['path']):,} of {cp['path_events']:,} events are listed")
    _ms_table(cp["path"], _PATH_COLS, height=360)
    st.caption(CRITICAL_PATH_HELP)
    f = cp.get("trace_file")
    if f and artifact_size(f) is not None:
        st.download_button("Download the step's trace with the critical path (JSON)", lambda: artifact_bytes(f),
                           file_name=f"critical_path_step{cp['step']}.pt.trace.json", mime="application/json",
                           key=f"cp-trace-{f}", on_click="ignore", icon=":material/download:",
                           help="Opens in Perfetto (ui.perfetto.dev) or chrome://tracing: path events carry "
                                "args critical = 1, arrows named 'critical path' chain them")
