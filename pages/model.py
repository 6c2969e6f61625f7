"""Model page: parameters, shapes and FLOPs, in total and per layer."""

import streamlit as st

from ui import state, views
from ui.jobs import run_analysis
from ui.widgets import show_failure
from ui.frame import require_app

require_app()

st.title("Model")
spec = state.current_spec()
rerun = st.button("Recompute", help="Results are cached per model, inputs and device; this runs again")
outcome = run_analysis("summary", spec, force=rerun)
if outcome.ok:
    views.show("summary", outcome.result)
else:
    show_failure(outcome)
