"""Show a trace-explorer result (summary, breakdown, top ops/kernels, idle, launches, timeline) and diffs."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from diagnostics.analyses.trace.result import (
    Communication, TraceCache, TraceDiffResult, TracePartial, TraceResult, TraceTimelineResult,
)
from diagnostics.render.charts.traces import (
    GPU_WINDOW_HELP, build_category_figure, build_cpu_breakdown_figure, build_diff_figure, build_gpu_breakdown_figure,
    build_idle_time_figure, build_launch_figure, build_timeline_figure, build_top_operators_figure, graph_launch_text,
)
from diagnostics.render.tables import frame
from diagnostics.render.charts.serving import build_serving_figure, serving_lines
from diagnostics.units import compact, human_bytes
from ui.views import trace_hta
from diagnostics.render.charts.critical_path import mark_critical_path
from ui.views.critical_path import show_critical_path
from ui.widgets import Tile, md_text, metric_row, missing_as, unit_columns
from ui.views.timeline import show_timeline
from ui.views.trace_ranks import show_ranks


#: Words a header keeps in capitals ("median_gpu_busy" -> "Median GPU busy").
_ACRONYMS = {"gpu": "GPU", "cpu": "CPU", "cuda": "CUDA", "id": "ID", "sm": "SM"}
#: A text column with values longer than this (kernel names, annotations) gets a set width, so that the
#: numbers right of it stay in view; the full text stays in the cell (its tooltip and the result's JSON).
LONG_TEXT_CHARS = 48


def _label(col: str) -> str:
    words = col.replace("_", " ").strip().split(" ")
    words = [_ACRONYMS.get(w.lower(), w if w.isupper() and len(w) > 1 else w.lower()) for w in words]
    text = " ".join(words)
    return text[:1].upper() + text[1:]


def _text_width(df: pd.DataFrame, col: str) -> int | None:
    """The width (px) of a text column with long values: wide beside few other columns, less beside many."""
    longest = df[col].dropna().astype(str).str.len().max()
    if not longest or longest <= LONG_TEXT_CHARS:
        return None
    return 400 if len(df.columns) <= 5 else 260


def _table(rows, rename: dict | None = None, height: int | None = None, missing: dict | None = None) -> None:
    """A trace table of typed rows (or a DataFrame): times (engine µs) in one scale per table with the unit
    in the header, bytes the same, ratios to three significant digits; ``rename``: headers for columns
    without a unit suffix; ``missing``: what a column's missing numbers read ("n/a" where not said;
    Streamlit would show 'None')."""
    df = rows if isinstance(rows, pd.DataFrame) else frame(rows)
    if df.empty:
        st.caption("(none)")
        return
    units = {}
    for col in df.columns:
        if not pd.api.types.is_numeric_dtype(df[col]) or pd.api.types.is_bool_dtype(df[col]):
            continue
        if col == "pct":  # a row's share of its table's total (the records declare it "share", in percent)
            units[col] = ((rename or {}).get(col) or "Share", "percent")
            continue
        for suffix, unit in (("_us", "us"), ("_ms", "ms"), ("_bytes", "bytes"), ("_pct", "percent")):
            if col.endswith(suffix) or f"{suffix}_" in col:
                name = (rename or {}).get(col) or _label(col.replace(suffix, " ").strip())
                units[col] = (name, unit)
                break
    df, config = unit_columns(df, units)
    for col in df.columns:
        if col in config:
            continue
        label = (rename or {}).get(col) or _label(col)
        if pd.api.types.is_float_dtype(df[col]):
            whole = df[col].dropna().map(float.is_integer).all()
            config[col] = st.column_config.NumberColumn(label, format="%d" if whole else "%.3g")
        else:
            config[col] = st.column_config.Column(label, width=_text_width(df, col))
    gaps = {c: (missing or {}).get(c, "n/a") for c in df.columns if df[c].isna().all() or (
        pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c]) and df[c].isna().any())}
    if gaps:
        df, config = missing_as(df, config, gaps)
    st.dataframe(df, hide_index=True, width="stretch", height=height or "auto", column_config=config)


def _timeline(result: TraceResult) -> None:
    from ui.jobs import run_analysis  # a range re-query is another (cached) job: trace_timeline on the kept columns

    timeline = result.timeline
    lo, hi = timeline.t0 / 1e3, timeline.t1 / 1e3
    columns_dir = result.columns_dir
    if columns_dir and hi > lo:
        key = f"trace-range-{result.path}"
        t0, t1 = st.slider("Time range (ms from trace start)", min_value=lo, max_value=hi, value=(lo, hi),
                           step=max((hi - lo) / 1000, 1e-3), key=key,
                           help="Pick a range to redraw it with more detail; zoom in the chart for a quick look")
        if (t0, t1) != (lo, hi):
            out = run_analysis("trace_timeline", None, {"columns_dir": columns_dir, "t0": t0 * 1e3, "t1": t1 * 1e3},
                               label="Timeline for the range")
            if out.ok:
                part: TraceTimelineResult = out.result
                timeline = part.timeline
            else:
                st.error(out.error)
    show_timeline(timeline, lambda search: mark_critical_path(build_timeline_figure(timeline, search=search),
                                                          result.critical_path, timeline),
                  key="trace")
    bucket = timeline.bucket_us
    st.caption(f"{timeline.shown:,} bars drawn for {timeline.in_range:,} events in range"
               + (f"; a bar with count > 1 stands for several short events of its row merged (bucket "
                  f"{bucket:.1f} µs)." if bucket > 0 else ": every event has its own bar."))


def cache_caption(cache: TraceCache | None) -> str:
    """Where the trace was read from: the parsed-trace cache or the file (diagnostics.trace.cache)."""
    if not cache:
        return "Parsed from the file (this run did not record the trace cache)"
    if cache.result:
        return (f"Reopened in {cache.open_s:.2f} s: the stored analysis of this trace (the files, the options and "
                "TorchScope's trace code are unchanged since it ran)")
    if cache.hit:
        return f"Reopened from the trace cache in {cache.open_s:.2f} s (the file is unchanged since it was parsed)"
    return (f"Parsed from the file in {cache.open_s:.2f} s; its columns are kept in the trace cache, so the "
            "next open of the unchanged file is faster")


def tiles(result: TraceResult) -> list[Tile]:
    return summary_tiles(result.summary)


def summary_tiles(s) -> list[Tile]:
    """The headline tiles of a trace, from its Summary alone (the result's and the partial result's)."""
    return [
        Tile("Duration", s.duration_us, "us", "first event start to last event end"),
        Tile("Events", s.events, "count", f"{s.events:,} events parsed"),
        Tile("Steps", s.n_steps, "count", "ProfilerStep#N ranges"),
        Tile("Threads", len(s.threads), "count", "CPU threads with events"),
        Tile("GPU streams", len(s.streams), "count", "GPU streams with kernels or copies" if s.has_gpu
             else "CPU-only trace"),
        Tile("Skipped events", s.skipped_events, "count", "malformed events left out"),
    ]


def _left_out(lo) -> str:
    """A diff's GPU time left out of one trace, said in a tile's caption ("" for none)."""
    if not lo or not (lo.before_profiling_us or lo.outside_steps_us):
        return ""
    return f"; {compact(lo.before_profiling_us + lo.outside_steps_us, 'us')} of GPU work queued before profiling " \
           "or launched outside the steps left out"


def diff_tiles(result: TraceDiffResult) -> list[Tile]:
    d = result.diff
    counts = d.counts
    return [
        Tile("Time before", d.time_us_before, "us", f"summed operator/kernel time, {d.unit}{_left_out(d.left_out_before)}"),
        Tile("Time after", d.time_us_after, "us", f"summed operator/kernel time, {d.unit}{_left_out(d.left_out_after)}"),
        Tile("Faster", counts.faster, "count",
             f"operators changed by ≥ {d.change_ratio:.0%} and ≥ {compact(d.noise_floor_us, 'us')}"),
        Tile("Slower", counts.slower, "count", "operators slower by the same margin"),
        Tile("Added", counts.added, "count", "operators only in the second trace"),
        Tile("Removed", counts.removed, "count", "operators only in the first trace"),
    ]


#: The Trace explorer's tabs (issue #31: eleven overflowed the page at 1280 px): what a trace is, its steps,
#: what ran, what the GPU did (with its own tabs), the timeline, one step's critical path.
TABS = ("Summary", "Per step", "Operators & kernels", "GPU", "Timeline", "Critical path")
#: The "GPU" tab's own tabs.
GPU_TABS = ("Idle time", "Launches", "Launch queue", "Copies", "Annotations", "Communication")


def _summary_tab(s) -> None:
    """The Summary tab's body: categories, threads, steps, streams, memory (the trace's TraceSummary)."""
    st.plotly_chart(build_category_figure(s), width="stretch")
    c1, c2 = st.columns(2)
    with c1:
        st.markdown("**Threads**")
        _table(s.threads)
    with c2:
        st.markdown("**Steps**")
        _table(s.steps)
    if s.streams:
        st.markdown("**GPU streams**")
        _table(s.streams)
    if s.memory:
        st.markdown("**Memory (from [memory] events)**")
        _table(s.memory, {"peak_allocated_bytes": "Peak allocated"})


def show_partial(partial: TracePartial) -> None:
    """While the trace job runs (issue #42's first answer): its Summary, sent right after the ingest; the
    other views come with the result."""
    s = partial.summary
    st.caption(f"{md_text(partial.name)} · {human_bytes(s.bytes)} · rank {s.rank if s.rank is not None else 'n/a'}"
               f" · schema {s.schema_version} · the other views are being computed")
    metric_row(summary_tiles(s))
    for w in s.warnings:  # they may quote the file's names: shown as written
        st.warning(md_text(w))
    for n in s.notes:
        st.info(n)
    st.markdown("**Summary**")
    _summary_tab(s)


def show(result: TraceResult) -> None:
    s = result.summary
    st.caption(f"{md_text(result.name)} · {human_bytes(s.bytes)} · rank {s.rank if s.rank is not None else 'n/a'}"
               f" · schema {s.schema_version}")
    st.caption(cache_caption(result.trace_cache))
    metric_row(tiles(result))
    for w in s.warnings:  # they may quote the file's names: shown as written
        st.warning(md_text(w))
    for n in s.notes:
        st.info(n)
    has_ranks = bool(result.ranks)  # several ranks' traces (ui.views.trace_ranks): their tab first
    serving = result.serving if result.serving and result.serving.available else None   # a server's trace (#42)
    tabs = st.tabs((["Ranks"] if has_ranks else []) + (["Serving"] if serving else []) + list(TABS))
    if has_ranks:
        with tabs[0]:
            show_ranks(result.ranks)
        tabs = tabs[1:]
    if serving:
        with tabs[0]:
            show_serving(serving)
        tabs = tabs[1:]
    hta = trace_hta.has_parts(result)
    with tabs[0]:
        _summary_tab(s)
    with tabs[1]:
        b = result.temporal_breakdown
        if b.gpu:
            st.plotly_chart(build_gpu_breakdown_figure(b), width="stretch")
            st.caption(GPU_WINDOW_HELP)
            for n in b.notes:
                st.info(n)
        st.plotly_chart(build_cpu_breakdown_figure(b), width="stretch")
    with tabs[2]:
        top = result.top_operators
        st.plotly_chart(build_top_operators_figure(top, "operators"), width="stretch")
        _table(top.operators, height=300)
        if top.kernels:
            st.plotly_chart(build_top_operators_figure(top, "kernels"), width="stretch")
            _table(top.kernels, height=300)
        if hta:
            st.markdown("**Kernel sequences (fusion candidates)**")
            trace_hta.show_kernel_sequences(result)
    with tabs[3]:
        if not s.has_gpu:
            st.info("CPU-only trace: no GPU streams, so no idle time, kernel launches or copies to analyse.")
            _communication(result.communication)
        else:
            _gpu(result, hta)
    with tabs[4]:
        _timeline(result)
    with tabs[5]:  # #18: ui/views/critical_path.py
        show_critical_path(result)


def show_serving(serving) -> None:
    """An inference server's iterations: their time split, phases, batch and tokens, the graph replays."""
    lines = serving_lines(serving)
    st.markdown(f"**{lines[0]}**")
    st.plotly_chart(build_serving_figure(serving), width="stretch")
    st.caption("Each iteration: the server's own annotation around one forward (vLLM's execute_..., SGLang's "
               "step[...]); its GPU work is what its host span launched (a graph's kernels through their launch). "
               "GPU time is counted once, first class first. The rest is the GPU idle: queued while work the "
               "iteration had launched waited to start (launch latency, a graph's set-up, the GPU busy with work "
               "this trace does not hold, or the device's clock out of step with the host's), host while nothing "
               "was launched yet.")
    if serving.phases:
        st.markdown("**Phases**")
        _table(serving.phases)
    st.markdown("**Iterations**")
    df = frame(serving.iterations)
    # what each iteration took first, the server's long annotation last (a table wider than the page scrolls)
    first = [c for c in ("iteration", "phase", "batch_size", "tokens", "time_us", "gpu_busy_us", "queued_us", "host_us")
             if c in df.columns]
    last = [c for c in ("annotation",) if c in df.columns]
    _table(df[first + [c for c in df.columns if c not in first + last] + last])
    g = serving.graphs
    if g and g.by_launch:
        st.markdown(f"**Graph replays**: {g.launches:,} launch(es) replayed {g.kernels:,} kernels, each attributed to "
                    "its launch")
        _table(g.by_launch)
    for n in serving.notes:
        st.info(n)


def idle_window_text(idle, duration_us: float) -> str:
    """What the idle table's window is, against the trace's duration: a server's trace (the GPU busy for half
    of an iteration) read 0.4 ms idle here and 151 ms of GPU idle on its Serving tab."""
    widest = max(r.window_us for r in idle.streams)
    return (f"Each stream's window runs from its first GPU event to its last (HTA's idle time): idle is the gaps "
            f"between them. The widest window is {widest / 1e3:,.1f} ms of the trace's {duration_us / 1e3:,.1f} ms; "
            "the time before a stream's first event and after its last is not counted here (the Serving tab counts "
            "the GPU idle within each iteration, Per step within each step's window).")


def _gpu(result: TraceResult, hta: bool) -> None:
    """The "GPU" tab: idle time, launches (with their delays), the launch queue, copies, annotations and
    communication, each in a tab of its own."""
    gt = st.tabs(list(GPU_TABS))
    with gt[0]:
        st.plotly_chart(build_idle_time_figure(result.idle_time), width="stretch")
        _table(result.idle_time.streams)
        if result.idle_time.streams:
            st.caption(idle_window_text(result.idle_time, result.summary.duration_us))
    with gt[1]:
        launch = result.launch_stats
        st.plotly_chart(build_launch_figure(launch), width="stretch")
        _table(launch.by_name, height=300)
        graphs = launch.graphs
        if graphs and graphs.launches:
            st.markdown("**CUDA graph launches**")
            st.caption(graph_launch_text(graphs))
            _table(graphs.by_launch, height=300)
        if hta:
            trace_hta.show_launch_delay(result)
    parts = ((gt[2], trace_hta.show_queue_length), (gt[3], trace_hta.show_memcpy_bandwidth),
             (gt[4], trace_hta.show_annotations))
    for tab, part in parts:
        with tab:
            if hta:
                part(result)
            else:
                st.info("This result predates these analyses: open the trace again to compute them.")
    with gt[5]:
        _communication(result.communication)
        if hta:
            trace_hta.show_comm_overlap(result)


def _communication(comm: Communication | None) -> None:
    """Communication by family (classify.communication) and what may be missing from it."""
    if not comm:
        st.info("This result predates communication families: open the trace again.")
        return
    if comm.families:
        df = frame(comm.families).rename(columns={"where": "runs on", "names": "distinct names", "example": "largest"})
        _table(df, {"time_us": "Time"})
    else:
        st.caption("No kernel or host call of this trace matches a communication family (NCCL, RCCL, MSCCL++, "
                   "NVSHMEM, expert-parallel dispatch / combine, custom all-reduce, gloo, c10d).")
    if comm.comm_kernels:
        st.caption(f"Your pattern for communication kernels: `{comm.comm_kernels}`")
    for n in comm.notes:
        st.warning(n)


def show_diff(result: TraceDiffResult) -> None:
    d = result.diff
    st.caption(f"before: {result.before} · after: {result.after} · times {d.unit}")
    metric_row(diff_tiles(result))
    st.plotly_chart(build_diff_figure(d), width="stretch")
    status = st.multiselect("Status", ["faster", "slower", "added", "removed", "unchanged"],
                            default=["faster", "slower", "added", "removed"], key="trace_diff_status")
    _table([r for r in d.rows if r.status in status], {"time_us_before": "Before", "time_us_after": "After",
                                                        "delta_us": "Δ", "ratio": "After / before (x)"},
           missing={"ratio": "new"})  # an added operator: nothing before to divide by


def show_range(result: TraceTimelineResult) -> None:
    """A trace_timeline run (the timeline of a trace opened before, for another time range) on its own."""
    timeline = result.timeline
    show_timeline(timeline, lambda search: build_timeline_figure(timeline, search=search), key="trace-range")
