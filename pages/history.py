"""History: every run from the dashboard and the CLI; reopen one without recomputing."""

import pandas as pd
import streamlit as st

from diagnostics.units import human_seconds
from ui import views
from ui.jobs import get_store
from ui.frame import require_app

require_app()

st.title("History")
store = get_store()
runs = store.list(limit=500)
if not runs:
    st.info("No runs yet. Open a page (Model, Profiler, ...) to run a diagnostic; it lands here.")
    st.stop()

table = pd.DataFrame([{
    "started": pd.Timestamp(r.started, unit="s").strftime("%Y-%m-%d %H:%M:%S"),
    "analysis": r.analysis, "model": r.model_label, "device": r.device, "status": r.status,
    "duration": human_seconds(r.duration_s), "source": r.source, "error": r.error or "", "id": r.id,
} for r in runs])
c1, c2 = st.columns(2)
analyses = c1.multiselect("Analysis", sorted(table["analysis"].unique()))
statuses = c2.multiselect("Status", sorted(table["status"].unique()))
mask = table["analysis"].isin(analyses or table["analysis"]) & table["status"].isin(statuses or table["status"])
shown = table[mask].reset_index(drop=True)
event = st.dataframe(shown, hide_index=True, width="stretch", on_select="rerun", selection_mode="single-row",
                     key="history_table")
rows = event.selection.rows if event and event.selection else []
labels = {r["id"]: f"{r['started']} · {r['analysis']} · {r['model'] or '—'} · {r['status']}"
          for r in shown.to_dict("records")}
run_id = (shown.iloc[rows[0]]["id"] if rows
          else st.selectbox("Open run", list(labels), format_func=labels.get, key="history_pick"))
rec = store.get(run_id)
if rec is None:
    st.warning("That run is no longer in the store.")
    st.stop()
st.subheader(f"{rec.analysis} · {rec.model_label} · {rec.status}")
if rec.status == "running":
    st.info("Still running: its result appears here once the job ends (reopen the run then).")
elif rec.status != "ok":
    st.error(rec.error or rec.status)
else:
    views.show(rec.analysis, rec.result, file_stem=rec.id)  # its downloads: the report and the JSON
