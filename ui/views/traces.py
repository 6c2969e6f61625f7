"""Show a trace-explorer result (summary, breakdown, top ops/kernels, idle, launches, timeline) and diffs."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from diagnostics.render.charts.traces import (
    GPU_WINDOW_HELP, build_category_figure, build_cpu_breakdown_figure, build_diff_figure, build_gpu_breakdown_figure,
    build_idle_time_figure, build_launch_figure, build_timeline_figure, build_top_operators_figure, graph_launch_text,
)
from diagnostics.units import human_bytes, human_count
from ui.views import trace_hta
from ui.widgets import metric_row
from ui.views.timeline import show_timeline
from ui.views.trace_ranks import show_ranks


def _table(records: list, rename: dict | None = None, height: int | None = None) -> None:
    if not records:
        st.caption("(none)")
        return
    df = pd.DataFrame(records)
    config = {}
    for col in df.columns:  # engine times are µs; people read ms. Bytes get their unit in the name.
        if col in (rename or {}):
            continue
        if col.endswith("_us") and pd.api.types.is_numeric_dtype(df[col]):
            df[col] = df[col] / 1e3
            label = col[:-3].replace("_", " ") + " (ms)"
            config[col] = st.column_config.NumberColumn(label, format="%.3f")
        elif pd.api.types.is_float_dtype(df[col]):
            config[col] = st.column_config.NumberColumn(col.replace("_", " "), format="%.4g")
    st.dataframe(df.rename(columns=rename or {}), hide_index=True, width="stretch", height=height or "auto",
                 column_config=config)


def _timeline(result: dict) -> None:
    from ui.jobs import run_analysis  # a range re-query is another (cached) job

    timeline = result["timeline"]
    lo, hi = float(timeline["t0"]) / 1e3, float(timeline["t1"]) / 1e3
    columns_dir = result.get("columns_dir")
    if columns_dir and hi > lo:
        key = f"trace-range-{result['path']}"
        t0, t1 = st.slider("Time range (ms from trace start)", min_value=lo, max_value=hi, value=(lo, hi),
                           step=max((hi - lo) / 1000, 1e-3), key=key,
                           help="Pick a range to redraw it with more detail; zoom in the chart for a quick look")
        if (t0, t1) != (lo, hi):
            out = run_analysis("trace_timeline", None, {"columns_dir": columns_dir, "t0": t0 * 1e3, "t1": t1 * 1e3},
                               label="Timeline for the range")
            if out.ok:
                timeline = out.result["timeline"]
            else:
                st.error(out.error)
    show_timeline(timeline, lambda search: build_timeline_figure(timeline, search=search), key="trace")
    st.caption(f"{timeline['shown']:,} bars drawn for {timeline['in_range']:,} events in range; a bar with count > 1 "
               f"stands for several short events of its row merged (bucket {timeline.get('bucket_us', 0):.1f} µs).")


def cache_caption(cache: dict | None) -> str:
    """Where the trace was read from: the parsed-trace cache or the file (diagnostics.trace.cache)."""
    if not cache:
        return "Parsed from the file (this run did not record the trace cache)"
    if cache["hit"]:
        return f"Reopened from the trace cache in {cache['open_s']:.2f} s (the file is unchanged since it was parsed)"
    return (f"Parsed from the file in {cache['open_s']:.2f} s; its columns are kept in the trace cache, so the "
            "next open of the unchanged file is faster")


def show(result: dict) -> None:
    s = result["summary"]
    st.caption(f"{result['name']} · {human_bytes(s['bytes'])} · rank {s['rank'] if s['rank'] is not None else 'n/a'}"
               f" · schema {s.get('schema_version')}")
    st.caption(cache_caption(result.get("trace_cache")))
    metric_row([
        ("Duration", f"{s['duration_us'] / 1e3:,.2f} ms", "first event start to last event end"),
        ("Events", human_count(s["events"]), f"{s['events']:,} events parsed"),
        ("Steps", str(s["n_steps"]), "ProfilerStep#N ranges"),
        ("Threads", str(len(s["threads"])), None),
        ("GPU streams", str(len(s["streams"])), None if s["has_gpu"] else "CPU-only trace"),
        ("Skipped events", str(s["skipped_events"]), "malformed events left out"),
    ])
    for w in s.get("warnings") or []:
        st.warning(w)
    for n in s.get("notes") or []:
        st.info(n)
    has_ranks = bool(result.get("ranks"))  # several ranks' traces (ui.views.trace_ranks): their tab first
    tabs = st.tabs((["Ranks"] if has_ranks else []) +
                   ["Summary", "Breakdown", "Top operators & kernels", "GPU idle & launches", "Timeline"]
                   + trace_hta.TABS)
    if has_ranks:
        with tabs[0]:
            show_ranks(result["ranks"])
        tabs = tabs[1:]
    trace_hta.show_tabs(tabs[-len(trace_hta.TABS):], result)   # the HTA-parity tabs (ui.views.trace_hta)
    with tabs[0]:
        st.plotly_chart(build_category_figure(s), width="stretch")
        c1, c2 = st.columns(2)
        with c1:
            st.markdown("**Threads**")
            _table(s["threads"])
        with c2:
            st.markdown("**Steps**")
            _table(s["steps"])
        if s["streams"]:
            st.markdown("**GPU streams**")
            _table(s["streams"])
        if s.get("memory"):
            st.markdown("**Memory (from [memory] events)**")
            _table(s["memory"], {"peak_allocated_bytes": "peak allocated (bytes)"})
    with tabs[1]:
        b = result["temporal_breakdown"]
        if b["gpu"]:
            st.plotly_chart(build_gpu_breakdown_figure(b), width="stretch")
            st.caption(GPU_WINDOW_HELP)
            for n in b.get("notes") or []:
                st.info(n)
        st.plotly_chart(build_cpu_breakdown_figure(b), width="stretch")
    with tabs[2]:
        top = result["top_operators"]
        st.plotly_chart(build_top_operators_figure(top, "operators"), width="stretch")
        _table(top["operators"], height=300)
        if top["kernels"]:
            st.plotly_chart(build_top_operators_figure(top, "kernels"), width="stretch")
            _table(top["kernels"], height=300)
    with tabs[3]:
        if not s["has_gpu"]:
            st.info("CPU-only trace: no GPU streams, so no idle time or kernel launches to analyse.")
        else:
            st.plotly_chart(build_idle_time_figure(result["idle_time"]), width="stretch")
            _table(result["idle_time"]["streams"])
            launch = result["launch_stats"]
            st.plotly_chart(build_launch_figure(launch), width="stretch")
            _table(launch["by_name"], height=300)
            graphs = launch.get("graphs") or {}
            if graphs.get("launches"):
                st.markdown("**CUDA graph launches**")
                st.caption(graph_launch_text(graphs))
                _table(graphs["by_launch"], height=300)
    with tabs[4]:
        _timeline(result)


def show_diff(result: dict) -> None:
    d = result["diff"]
    st.caption(f"before: {result['before']} · after: {result['after']} · times {d['unit']}")
    counts = d["counts"]
    metric_row([
        ("Time before", f"{d['time_us_before'] / 1e3:,.3f} ms", f"summed operator/kernel time, {d['unit']}"),
        ("Time after", f"{d['time_us_after'] / 1e3:,.3f} ms", None),
        ("Faster", str(counts.get("faster", 0)), f"changed by ≥ {d['change_ratio']:.0%} and ≥ {d['noise_floor_us']} µs"),
        ("Slower", str(counts.get("slower", 0)), None),
        ("Added", str(counts.get("added", 0)), None),
        ("Removed", str(counts.get("removed", 0)), None),
    ])
    st.plotly_chart(build_diff_figure(d), width="stretch")
    status = st.multiselect("Status", ["faster", "slower", "added", "removed", "unchanged"],
                            default=["faster", "slower", "added", "removed"], key="trace_diff_status")
    _table([r for r in d["rows"] if r["status"] in status], {"time_us_before": "before (µs)",
                                                              "time_us_after": "after (µs)", "delta_us": "Δ (µs)"})


#: How this module shows each analysis' result (ui.views.show finds it through the analysis' ``view``).
VIEWS = {"trace": show, "trace_diff": show_diff}
