"""Gradient-flow page: per-layer gradient statistics over a few training steps, and their health."""

import streamlit as st

from diagnostics.analyses.gradients.job import DEFAULTS, MAX_STEPS
from diagnostics.measure.training import OPTIMIZERS
from ui import state, views
from ui.jobs import run_analysis
from ui.widgets import show_failure
from ui.frame import require_app

require_app()

st.title("Gradient flow")
spec = state.current_spec()
with st.form("grad_form"):
    c1, c2, c3 = st.columns(3)
    steps = c1.number_input("Training steps", min_value=1, max_value=MAX_STEPS, value=DEFAULTS["steps"], step=1,
                            key="grad_steps")
    optimizer = c2.selectbox("Optimizer", OPTIMIZERS, index=OPTIMIZERS.index(DEFAULTS["optimizer"]),
                             key="grad_optimizer")
    lr = c3.number_input("Learning rate", min_value=1e-8, max_value=10.0, value=DEFAULTS["lr"], format="%g",
                         key="grad_lr")
    rerun = st.form_submit_button("Run again", help="Results are cached per model, inputs, device and options")
options = {"steps": int(steps), "optimizer": optimizer, "lr": float(lr)}
outcome = run_analysis("gradients", spec, options, force=rerun)
if outcome.ok:
    views.show("gradients", outcome.result)
else:
    show_failure(outcome)
