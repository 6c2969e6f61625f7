"""The one timeline view, for the Profiler and the Trace explorer: search box, figure, occurrences.

``show_timeline`` draws the figure (diagnostics.render.charts.timeline) with a search that dims
every other bar and lists the matching events; ``occurrences`` is the link from an operator
table's row: the row's name becomes the timeline's search (exact match) and its occurrences are
listed under the table.
"""

from __future__ import annotations

from typing import Callable

import pandas as pd
import streamlit as st

from diagnostics.render.charts.timeline import find_events
from diagnostics.trace.records.timeline import Timeline
from ui.widgets import md_text

SEARCH_HELP = ("Case-insensitive part of an event's name (e.g. 'conv', 'gemm'); in double quotes, the whole name "
               "(\"aten::mm\"). Matching bars stay bright, the rest dim; the matches are listed below the chart. "
               "Names show on the bars once zoomed in far enough to fit (drag to zoom, double-click to reset).")


def search_key(key: str) -> str:
    return f"{key}_tl_search"


def _hits_table(hits: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([{"name": h["name"], "lane": h["lane"], "start (ms)": round(h["start_ms"], 4),
                          "duration (µs)": round(h["dur_ms"] * 1e3, 2), "depth": h["depth"],
                          "bar stands for": h["count"], "input shapes": h["shapes"]} for h in hits])


def show_timeline(timeline: Timeline, build: Callable[..., object], *, key: str) -> None:
    """Search box, the figure ``build(search=...)`` and the table of matching events."""
    query = st.text_input("Find on the timeline", key=search_key(key), placeholder='e.g. conv, or "aten::mm"',
                          help=SEARCH_HELP)
    st.plotly_chart(build(search=query or None), width="stretch")
    if query and query.strip():
        hits = find_events(timeline, query)
        if hits:
            st.caption(f"{len(hits):,} drawn event(s) match '{query.strip()}' (longest first"
                       + (", the first 200" if len(hits) >= 200 else "") + "). A bar that stands for several "
                       "merged events counts once; zoom in (a narrower range) to separate them.")
            st.dataframe(_hits_table(hits), hide_index=True, width="stretch", height=min(420, 38 + 35 * len(hits)))
        else:
            st.caption(f"No drawn event matches '{query.strip()}'.")


def occurrences(timeline: Timeline, name: str | None, *, key: str, where: str = "the Timeline tab") -> None:
    """Under an operator table: the selected operator's occurrences on the timeline, and the timeline's
    search set to its exact name (so ``where`` highlights them)."""
    if not name:
        return
    last = f"{key}_tl_linked"
    if st.session_state.get(last) != name:  # a new selection: point the timeline's search at it once
        st.session_state[last] = name
        st.session_state[search_key(key)] = f'"{name}"'
    hits = find_events(timeline, f'"{name}"')
    if hits:
        st.caption(f"**{md_text(name)}**: {len(hits):,} occurrence(s) drawn on the timeline, longest first; "
                   f"{where} highlights them.")
        st.dataframe(_hits_table(hits).drop(columns=["name"]), hide_index=True, width="stretch",
                     height=min(320, 38 + 35 * len(hits)))
    else:
        st.caption(f"**{md_text(name)}** is not among the events drawn on the timeline (it may be merged into longer "
                   "bars or be outside the drawn range).")
