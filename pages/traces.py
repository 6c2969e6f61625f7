"""Trace explorer: open any torch.profiler trace (a profiling run, an upload, or a local path) and diff two."""

import streamlit as st

from diagnostics.trace.cache import stamp as file_stamp
from diagnostics.analyses.trace.result import TraceResult
from diagnostics.errors import TorchScopeError
from diagnostics.settings import safe_mode
from diagnostics.uploads import save_upload
from ui import views
from ui.views import trace_hta
from ui.views import traces as traces_view
from ui.jobs import get_store, run_analysis
from ui.widgets import show_failure
from ui.frame import require_app

require_app()

st.title("Trace explorer")
st.caption("Chrome / Kineto traces from torch.profiler (.json, .json.gz, *.pt.trace.json.gz), CPU-only or with GPU "
           "kernels, gigabytes included. Parsing runs in a worker process.")

SOURCES = ["A profiling run", "Upload", "Local path"]


def pick_trace(slot: str) -> tuple[str | None, str | None]:
    """(path, display name) of a trace chosen from the store, an upload or (outside server-safe mode)
    a local path. The display name is an upload's own file name (it is stored under one we choose)."""
    sources = SOURCES if not safe_mode() else SOURCES[:2]
    source = st.radio("Open from", sources, horizontal=True, key=f"trace_src_{slot}")
    if source == "A profiling run":
        # Profiler runs, and the traces of scripts run attached ("Run a script"; one per rank): run id/file.
        choices = {}
        for r in get_store().list(limit=200):
            if r.analysis == "profile" and r.status == "ok" and "trace.json.gz" in r.artifacts:
                choices[f"{r.id}/trace.json.gz"] = (f"{r.model_label} · {r.id}", r.artifacts["trace.json.gz"])
            elif r.analysis == "attach":
                for name, file in sorted(r.artifacts.items()):
                    if name.endswith(".json.gz") and "trace" in name:
                        choices[f"{r.id}/{name}"] = (f"script {r.model_label} · {name} · {r.id}", file)
        if not choices:
            st.info("No profiling run yet: run one on the Profiler page, or upload a trace.")
            return None, None
        key = st.selectbox("Profiling run", list(choices), format_func=lambda k: choices[k][0],
                           key=f"trace_run_{slot}")
        return choices[key][1], None
    if source == "Upload":
        up = st.file_uploader("Trace file (.json or .json.gz)", type=["json", "gz"], key=f"trace_up_{slot}")
        if up is None:
            return None, None
        try:
            path, _ = save_upload(up.getvalue(), "trace", get_store().data_dir, up.name)
        except TorchScopeError as e:
            st.error(str(e))
            return None, None
        return str(path), up.name
    text = st.text_input("Path on the dashboard's machine (for files too large to upload)",
                         key=f"trace_path_{slot}", placeholder="/data/traces/worker0.pt.trace.json.gz")
    return text.strip() or None, None


tab_open, tab_diff, tab_ranks = st.tabs(["Open a trace", "Compare two traces", "Ranks"])
with tab_open:
    path, display_name = pick_trace("a")
    if path:
        try:
            stamp = file_stamp(path)
        except TorchScopeError as e:
            st.error(str(e))
        else:
            options = {"path": stamp["path"], "stamp": stamp, **trace_hta.option_inputs()}
            if display_name:
                options["display_name"] = display_name
            # the Summary is drawn as soon as the job has it, the other views with the result (issue #42)
            outcome = run_analysis("trace", None, options, label="Opening the trace",
                                   partial=traces_view.show_partial)
            if outcome.ok:
                views.show("trace", outcome.result)
            else:
                show_failure(outcome)
with tab_diff:
    c1, c2 = st.columns(2)
    with c1:
        st.markdown("**Before**")
        before, _ = pick_trace("before")
    with c2:
        st.markdown("**After**")
        after, _ = pick_trace("after")
    if before and after:
        try:
            options = {"before": file_stamp(before)["path"], "after": file_stamp(after)["path"],
                       "stamps": [file_stamp(before), file_stamp(after)]}
        except TorchScopeError as e:
            st.error(str(e))
        else:
            if st.button("Compare", type="primary", key="trace_compare"):
                st.session_state["trace_diff_options"] = options
            if st.session_state.get("trace_diff_options") == options:
                outcome = run_analysis("trace_diff", None, options, label="Comparing traces")
                if outcome.ok:
                    views.show("trace_diff", outcome.result)
                else:
                    show_failure(outcome)
with tab_ranks:  # several ranks' traces of one job: ui.views.trace_ranks
    from ui.views.trace_ranks import execution_options, pick_ranks, show_ranks

    st.caption("Several ranks of one distributed job: each rank is summarised on its own (local processes, or a "
               "Dask cluster), one at a time per worker; the summaries are compared (collectives' arrival skew, "
               "stragglers, who waits for whom, step times) and checked for coming from one run, and the ranks you "
               "pick are drawn on one timeline. The first file is also analysed in full: its report (below) and "
               "History show every view of it.")
    rank_paths, rank_names = pick_ranks(safe_mode())
    run_on = execution_options(safe_mode())
    if rank_paths:
        from diagnostics.trace.ranks import rank_paths as expand_ranks

        try:
            files = expand_ranks(rank_paths)
            stamps = [file_stamp(str(f)) for f in files]
        except TorchScopeError as e:
            st.error(str(e))
        else:
            options = {"path": stamps[0]["path"], "stamp": stamps[0], "ranks": rank_paths, "ranks_stamps": stamps,
                       **run_on}
            if rank_names:
                options["ranks_names"] = rank_names
                options["display_name"] = rank_names.get(rank_paths[0])
            outcome = run_analysis("trace", None, options, label="Analysing the ranks")
            if outcome.ok:  # the ranks' view only: "Open a trace" may show another trace's full view on this page
                result: TraceResult = outcome.result
                views.machine_banner(result)
                show_ranks(result.ranks)
                views.downloads("trace", result, file_stem="trace-ranks")
            else:
                show_failure(outcome)
