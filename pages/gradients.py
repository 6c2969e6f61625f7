"""Gradient-flow page: per-layer gradient statistics over a few training steps, and their health."""

import streamlit as st

from ui import state, views
from ui.jobs import run_analysis
from ui.widgets import option_input, show_failure
from ui.frame import require_app

require_app()

st.title("Gradient flow")
spec = state.current_spec()
with st.form("grad_form"):
    c1, c2, c3 = st.columns(3)
    options = {
        "steps": option_input("gradients", "steps", c1, widget_key="grad_steps", label="Training steps", step=1),
        "optimizer": option_input("gradients", "optimizer", c2, widget_key="grad_optimizer", format_func=str.upper),
        "lr": option_input("gradients", "lr", c3, widget_key="grad_lr", max_value=10.0),
    }
    rerun = st.form_submit_button("Run again", help="Results are cached per model, inputs, device and options")
outcome = run_analysis("gradients", spec, options, force=rerun)
if outcome.ok:
    views.show("gradients", outcome.result)
else:
    show_failure(outcome)
