"""The Trace explorer's multi-rank part: the "Ranks" input (several uploads, or files / a folder on the
dashboard's machine) and the "Ranks" tab of a result (per-rank table, step-time chart, problems, the
merged timeline). The figures come from diagnostics.render.charts.ranks, the numbers from
diagnostics.trace.ranks (run inside the "trace" analysis, its "ranks" option)."""

from __future__ import annotations

import streamlit as st

from ui.widgets import chart_key

from diagnostics.render.charts.ranks import build_rank_steps_figure, build_ranks_timeline_figure, rank_table
from ui.views.timeline import show_timeline


def pick_ranks(safe: bool) -> tuple[list[str], dict]:
    """(paths, {stored path: upload's own name}) of several ranks' traces: uploads (stored in the data
    folder under a name of ours) or, outside server-safe mode, files or folders on the dashboard's
    machine, one per line."""
    from diagnostics.errors import TorchScopeError
    from diagnostics.uploads import save_upload
    from ui.jobs import get_store

    sources = ["Upload", "Local paths"] if not safe else ["Upload"]
    source = st.radio("Open ranks from", sources, horizontal=True, key="trace_ranks_src")
    if source == "Upload":
        ups = st.file_uploader("One trace per rank (.json or .json.gz)", type=["json", "gz"],
                               accept_multiple_files=True, key="trace_ranks_up")
        paths, names = [], {}
        for up in ups or []:
            try:
                path, _ = save_upload(up.getvalue(), "trace", get_store().data_dir, up.name)
            except TorchScopeError as e:
                st.error(f"{up.name}: {e}")
                return [], {}
            paths.append(str(path))
            names[str(path)] = up.name
        return paths, names
    text = st.text_area("Trace files or a folder of them on the dashboard's machine, one per line",
                        key="trace_ranks_paths", placeholder="/data/traces/job42/")
    return [line.strip() for line in text.splitlines() if line.strip()], {}


def show_ranks(ranks: dict) -> None:
    """The "Ranks" tab: problems as warnings, the per-rank table and chart, the merged timeline."""
    n = len(ranks.get("ranks") or [])
    st.caption(f"{n} ranks analysed, {ranks.get('mode')}. Figures are medians per profiler step.")
    for p in ranks.get("problems") or []:
        prefix = "" if p["check"] == "unreadable" else f"Not one run? ({p['check'].replace('_', ' ')}) "
        st.warning(prefix + p["message"])
    if not ranks.get("problems"):
        st.success("No sign that these ranks come from different runs (world size, process groups, rank numbers, "
                   "versions, start times and step numbers agree).")
    for note in ranks.get("notes") or []:
        st.info(note)
    if ranks.get("slowest_rank") is not None:
        spread = ranks.get("spread")
        cols = st.columns(2)
        cols[0].metric("Slowest rank", str(ranks["slowest_rank"]), help="highest median step time")
        cols[1].metric("Step-time spread", f"{spread:.2f}x" if spread else "n/a",
                       help="slowest rank's median step time / fastest rank's")
        st.plotly_chart(build_rank_steps_figure(ranks), width="stretch", key=chart_key("ranks", ranks, 1))
    st.dataframe(rank_table(ranks), hide_index=True, width="stretch")
    timeline = ranks.get("timeline") or {}
    if timeline.get("events"):
        st.markdown("**All ranks on one timeline**")
        st.caption(f"Alignment: {ranks.get('alignment')}. {timeline['shown']:,} bars drawn for "
                   f"{timeline['in_range']:,} events.")
        show_timeline(timeline, lambda search: build_ranks_timeline_figure(ranks, search=search), key="trace_ranks")
