"""The Trace explorer's multi-rank part: the "Ranks" input (several uploads, or files / a folder on the
dashboard's machine) and the "Ranks" tab of a result (per-rank table, step-time chart, problems, the
merged timeline). The figures come from diagnostics.render.charts.ranks, the numbers from
diagnostics.trace.ranks (run inside the "trace" analysis, its "ranks" option)."""

from __future__ import annotations

import streamlit as st

from ui.widgets import chart_key, md_text

from diagnostics.analyses.trace.result import Ranks
from diagnostics.render.tables import records_frame
from diagnostics.trace.ranks.executors import REMOTE_TRUST, is_remote

from diagnostics.render.charts.ranks import (
    build_heatmap_figure, build_lateness_figure, build_rank_steps_figure, build_ranks_timeline_figure,
    build_skew_figure, collectives_table, late_table, rank_table, waits_table, widest_table, workers_table,
)
from ui.views.timeline import show_timeline

#: The session key of the "Ranks on the timeline" picker (the page reads it into the job's timeline_ranks).
TIMELINE_PICK_KEY = "trace_ranks_timeline"
#: The picks themselves, kept while the job runs (a widget's own key is dropped in a run that does not draw it).
PICKS_KEY = "trace_ranks_timeline_picks"
DASK_KEY = "trace_ranks_dask"
DASK_TRUST_KEY = "trace_ranks_dask_trust"


def execution_options(safe: bool) -> dict:
    """Where the ranks are analysed: local processes, or a Dask cluster (outside server-safe mode), and the
    ranks the user picked for the timeline: the job's dask / timeline_ranks options."""
    out = {}
    if not safe:
        dask = st.text_input("Dask scheduler (optional)", key=DASK_KEY, placeholder="tcp://scheduler:8786 or local:4",
                             help="Analyse the ranks on a Dask cluster: its scheduler address, or local:N for N "
                                  "worker processes on this machine (needs the packages dask and distributed). "
                                  "Empty: local processes.").strip()
        if dask and is_remote(dask):  # off unless ticked: a scheduler runs code as the dashboard's user
            trusted = st.checkbox("I trust this scheduler: it runs code as me", key=DASK_TRUST_KEY, value=False,
                                  help=REMOTE_TRUST[0].upper() + REMOTE_TRUST[1:] + ".")
            if trusted:
                out["dask"], out["trust_dask_scheduler"] = dask, True
            else:
                st.warning(f"The scheduler at {dask} is not used until you tick that you trust it: "
                           f"{REMOTE_TRUST.split(': ', 1)[1].split('. Use', 1)[0]}. The ranks run in local "
                           "processes meanwhile.", icon=":material/warning:")
        elif dask:
            out["dask"] = dask
    picked = st.session_state.get(PICKS_KEY)
    if picked:
        out["timeline_ranks"] = ",".join(str(r) for r in sorted(picked))
    return out


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
                st.error(f"{md_text(up.name)}: {md_text(e)}")
                return [], {}
            paths.append(str(path))
            names[str(path)] = up.name
        return paths, names
    text = st.text_area("Trace files or a folder of them on the dashboard's machine, one per line",
                        key="trace_ranks_paths", placeholder="/data/traces/job42/")
    return [line.strip() for line in text.splitlines() if line.strip()], {}


def _ident(ranks: Ranks) -> str:
    """What tells this ranks result's charts apart on a page: its alignment and files."""
    return ranks.alignment + "|" + "|".join(r.file for r in ranks.ranks)


def _show_problems(ranks: Ranks) -> None:
    """Ranks left out, signs of different runs, notes, stragglers and the first late collectives."""
    for f in ranks.failed:
        st.error(f"{md_text(f.name)}: left out ({md_text(f.error)})")
    for p in ranks.problems:
        if p.check == "unreadable":
            continue
        st.warning(f"Not one run? ({p.check.replace('_', ' ')}) " + p.message)
    if not ranks.problems:
        st.success("No sign that these ranks come from different runs (world size, process groups, rank numbers, "
                   "versions, start times and step numbers agree).")
    for note in ranks.notes:
        st.info(note)
    limit = ranks.thresholds.straggler_limit_us or 0
    for s in ranks.stragglers:
        st.warning(f"Straggler: rank {s.rank} arrives {s.late_us_median:,.0f} µs after the median rank at its "
                   f"collectives (median; the limit is {limit:,.0f} µs).")
    for c in ranks.late_collectives[:3]:
        st.warning(f"Late collective {md_text(c.key)} ({md_text(c.name)}, step {c.step}): rank {c.rank} arrived "
                   f"{c.late_us:,.0f} µs after the median rank, {c.excess_us:,.0f} µs later than it usually is.")


def _show_slowest(ranks: Ranks, ident) -> None:
    """The slowest rank, the step-time spread, the stragglers, and each rank's step times."""
    spread = ranks.spread
    cols = st.columns(3)
    cols[0].metric("Slowest rank", str(ranks.slowest_rank), help="highest median step time")
    cols[1].metric("Step-time spread", f"{spread:.2f}x" if spread else "n/a",
                   help="slowest rank's median step time / fastest rank's")
    cols[2].metric("Stragglers", ", ".join(str(s.rank) for s in ranks.stragglers) or "none",
                   help="ranks whose median lateness at the collectives is over the limit")
    st.plotly_chart(build_rank_steps_figure(ranks), width="stretch", key=chart_key("ranks", ident, 1))


def _show_collectives(ranks: Ranks, ident) -> None:
    """Collectives matched across ranks: the table, lateness and skew, late ones, the widest, who waits."""
    coll = ranks.collectives
    st.markdown("**Collectives across ranks**")
    st.caption(f"{coll.matched:,} collectives matched on every rank, {coll.partial:,} on some (by "
               f"{', '.join(coll.matched_by)}; {', '.join(coll.events)}). Clock: "
               f"{ranks.clock.aligned}. Transfer time: the shortest duration across ranks "
               "(the last to arrive waits for nobody).")
    st.dataframe(collectives_table(ranks), hide_index=True, width="stretch")
    c1, c2 = st.columns(2)
    with c1:
        st.plotly_chart(build_lateness_figure(ranks), width="stretch", key=chart_key("ranks", ident, 3))
    with c2:
        st.plotly_chart(build_skew_figure(ranks), width="stretch", key=chart_key("ranks", ident, 4))
    for title, table in (("Late collectives", late_table(ranks)), ("Widest arrival skew", widest_table(ranks)),
                         ("Who waits for whom", waits_table(ranks))):
        if not table.empty:
            st.markdown(f"**{title}**")
            st.dataframe(table, hide_index=True, width="stretch")


def _show_critical_path(cp) -> None:
    st.markdown(f"**Critical path of rank {cp.rank}** (the first straggler, else the slowest rank)")
    if cp.available:
        st.caption(f"Step {cp.step} ({cp.chosen_as}): {cp.length_us / 1e3:,.3f} ms; by kind: "
                   + ", ".join(f"{k.kind} {k.us / 1e3:,.3f} ms" for k in cp.by_kind if k.us > 0))
        st.dataframe(records_frame(cp.longest or ()), hide_index=True, width="stretch")
    else:
        st.info(f"Not computed: {cp.reason}")


def _show_picked_timeline(ranks: Ranks) -> None:
    """The ranks picked (at most 8) on one timeline; a new pick is kept for the next job (PICKS_KEY)."""
    timeline = ranks.timeline
    st.markdown("**Picked ranks on one timeline**")
    choices = sorted({r.rank for r in ranks.ranks})
    if TIMELINE_PICK_KEY not in st.session_state or not set(st.session_state[TIMELINE_PICK_KEY]) <= set(choices):
        st.session_state[TIMELINE_PICK_KEY] = list(ranks.timeline_ranks)  # what this result drew

    def picked():
        st.session_state[PICKS_KEY] = list(st.session_state[TIMELINE_PICK_KEY])

    st.multiselect("Ranks on the timeline", choices, max_selections=8, key=TIMELINE_PICK_KEY, on_change=picked,
                   help="Only the ranks picked are read again and drawn (default: the slowest rank and the rank "
                        "that waits most)")
    for e in ranks.timeline_errors:
        st.error(f"rank {e.rank}: not drawn ({e.error})")
    if timeline.events:
        st.caption(f"Alignment: {ranks.alignment}. {timeline.shown:,} bars drawn for "
                   f"{timeline.in_range:,} events.")
        show_timeline(timeline, lambda search: build_ranks_timeline_figure(ranks, search=search), key="trace_ranks")


def show_ranks(ranks: Ranks) -> None:
    """The "Ranks" tab: problems as warnings, the per-rank table and charts, the cross-rank views (collectives,
    stragglers, late collectives, who waits for whom, the heat map, the slowest rank's critical path), and the
    picked ranks on one timeline."""
    ident = _ident(ranks)
    st.caption(f"{len(ranks.ranks)} ranks analysed, {ranks.mode}. Figures are medians per profiler step.")
    _show_problems(ranks)
    if ranks.slowest_rank is not None:
        _show_slowest(ranks, ident)
    st.dataframe(rank_table(ranks), hide_index=True, width="stretch")
    if ranks.heatmap.steps:
        st.plotly_chart(build_heatmap_figure(ranks), width="stretch", key=chart_key("ranks", ident, 2))
    if ranks.collectives.by_name:
        _show_collectives(ranks, ident)
    if ranks.critical_path:
        _show_critical_path(ranks.critical_path)
    if ranks.workers:
        with st.expander("Workers (where the ranks were analysed)"):
            st.dataframe(workers_table(ranks), hide_index=True, width="stretch")
    _show_picked_timeline(ranks)
