"""History: every run from the dashboard and the CLI; reopen one, compare two, follow a metric's trend."""

import pandas as pd
import streamlit as st

from diagnostics.errors import TorchScopeError
from diagnostics.registry import ANALYSES
from diagnostics.history import comparable_metrics, compare_runs, trend
from diagnostics.store import FINAL_STATUSES
from diagnostics.units import human_seconds
from ui import views
from ui.frame import require_app
from ui.jobs import get_store, run_analysis
from ui.views.history import show_comparison, show_trend
from ui.widgets import md_text, show_failure

require_app()

st.title("History")
store = get_store()
store.mark_interrupted()  # a row a killed CLI left 'running' gets its final status here too
runs = store.list(limit=500)
if not runs:
    st.info("No runs yet. Open a page (Model, Profiler, ...) to run a diagnostic; it lands here.")
    st.stop()


def label(r) -> str:
    return (f"{pd.Timestamp(r.started, unit='s'):%Y-%m-%d %H:%M:%S} · {r.analysis} · {r.model_label or '—'}"
            f" · {r.status} · {r.id[-8:]}")  # the id's tail: two runs started in one second differ


def runs_tab() -> None:
    table = pd.DataFrame([{
        "started": pd.Timestamp(r.started, unit="s").strftime("%Y-%m-%d %H:%M:%S"),
        "analysis": r.analysis, "model": r.model_label, "device": r.device, "status": r.status,
        "duration": human_seconds(r.duration_s), "source": r.source, "error": r.error or "",
        "damaged": r.damaged or "", "id": r.id,
    } for r in runs])
    c1, c2 = st.columns(2)
    analyses = c1.multiselect("Analysis", sorted(table["analysis"].unique()))
    statuses = c2.multiselect("Status", sorted(table["status"].unique()))
    mask = table["analysis"].isin(analyses or table["analysis"]) & table["status"].isin(statuses or table["status"])
    shown = table[mask].reset_index(drop=True)
    event = st.dataframe(shown, hide_index=True, width="stretch", on_select="rerun", selection_mode="single-row",
                         key="history_table")
    rows = event.selection.rows if event and event.selection else []
    by_id = {r.id: r for r in runs}
    ids = list(shown["id"])
    run_id = (shown.iloc[rows[0]]["id"] if rows
              else st.selectbox("Open run", ids, format_func=lambda i: label(by_id[i]), key="history_pick"))
    rec = store.get(run_id) if run_id else None
    if rec is None:
        st.warning("That run is no longer in the store.")
        return
    known = rec.analysis in ANALYSES and rec.status in (*FINAL_STATUSES, "running")  # else a row written by another
    st.subheader(f"{rec.analysis if known else md_text(rec.analysis)} · {md_text(rec.model_label)} · "
                 f"{rec.status if known else md_text(rec.status)}", anchor=False)
    if rec.damaged:  # what could be read is shown; the damaged columns read as empty
        st.warning(f"This run is damaged in the run store: {md_text(rec.damaged)}")
    if rec.status == "running":
        st.info("Still running: its result appears here once the job ends (reopen the run then).")
    elif rec.status != "ok":
        st.error(rec.error or rec.status)
        if rec.result:  # what was measured before it failed or was stopped (an attached script's run)
            views.show_stored(rec.analysis, rec.result, file_stem=rec.id)
    elif rec.result is None:  # damaged: its result could not be read (the warning above says why)
        st.info("Its result could not be read back from the run store.")
    else:
        views.show_stored(rec.analysis, rec.result, file_stem=rec.id)  # its downloads: the report and the JSON


def compare_tab() -> None:
    ok = [r for r in runs if r.status == "ok" and r.metrics]
    if len(ok) < 2:
        st.info("Two finished runs are needed: run an analysis twice (before and after a change) to compare them.")
        return
    by_id = {r.id: r for r in ok}
    c1, c2 = st.columns(2)
    b_id = c2.selectbox("Run B (after)", list(by_id), format_func=lambda i: label(by_id[i]), key="history_cmp_b",
                        help="the newer run, usually after a change")
    b = by_id[b_id]
    same = [r for r in ok if r.analysis == b.analysis and r.id != b.id]
    if not same:
        st.info(f"No other finished {b.analysis} run to compare with this one.")
        return
    # default A: the previous run of the same model, else the previous run of this analysis
    older = [r for r in same if r.started <= b.started]
    default = next((r for r in older if r.model_label == b.model_label), older[0] if older else same[0])
    choices = [r.id for r in same]
    a_id = c1.selectbox("Run A (before)", choices, index=choices.index(default.id),
                        format_func=lambda i: label(by_id[i]), key="history_cmp_a",
                        help=f"another {b.analysis} run; the previous one of the same model by default")
    try:
        comparison = compare_runs(store.get(a_id), store.get(b_id))  # full records: list() has no results
    except TorchScopeError as e:
        st.error(str(e))
        return
    show_comparison(comparison)
    if comparison.traces:
        from diagnostics.trace.cache import stamp as file_stamp

        st.markdown("**Trace diff** of the two runs' profiler traces (operators and kernels added, removed, "
                    "faster, slower)")
        key = (a_id, b_id)
        if st.button("Diff their traces", key="history_trace_diff", icon=":material/compare_arrows:"):
            st.session_state["history_diff_pair"] = key
        if st.session_state.get("history_diff_pair") == key:
            paths = comparison.traces
            try:
                options = {"before": paths.a, "after": paths.b, "stamps": [file_stamp(paths.a), file_stamp(paths.b)]}
            except TorchScopeError as e:
                st.error(str(e))
                return
            outcome = run_analysis("trace_diff", None, options, label="Comparing the runs' traces")
            if outcome.ok:
                views.show("trace_diff", outcome.result, file_stem=f"diff-{a_id}-{b_id}")
            else:
                show_failure(outcome)
    elif comparison.analysis == "profile":
        st.caption("No trace diff: one of the runs kept no trace file.")


def trend_tab() -> None:
    ok = [r for r in runs if r.status == "ok" and r.metrics]
    if not ok:
        st.info("No finished runs yet.")
        return
    c1, c2, c3 = st.columns(3)
    # (a run of an analysis since retired stays listed, and opens with the reason, but has no trend)
    analyses = sorted({r.analysis for r in ok if r.analysis in ANALYSES and comparable_metrics(r.analysis)})
    if not analyses:
        st.info("No finished run has metrics to follow.")
        return
    analysis = c1.selectbox("Analysis", analyses, key="history_trend_analysis",
                            index=analyses.index("profile") if "profile" in analyses else 0)
    models = sorted({r.model_label or "—" for r in ok if r.analysis == analysis})
    model = c2.selectbox("Model", models, key="history_trend_model")
    have = {k for r in ok if r.analysis == analysis for k, v in (r.metrics or {}).items() if v is not None}
    metrics = [m for m in comparable_metrics(analysis) if m.key in have]
    if not metrics:
        st.info(f"No {analysis} run has a metric to follow.")
        return
    metric = c3.selectbox("Metric", [m.key for m in metrics], key="history_trend_metric",
                          format_func={m.key: m.label for m in metrics}.get)
    show_trend(trend(runs, analysis, metric, None if model == "—" else model))


tab_runs, tab_compare, tab_trend = st.tabs(["Runs", "Compare two runs", "Trend"])
with tab_runs:
    runs_tab()
with tab_compare:
    compare_tab()
with tab_trend:
    trend_tab()
