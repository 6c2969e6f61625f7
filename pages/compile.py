"""torch.compile explorer: graph breaks with their source lines, recompiles, compile time, and what
compiling bought (eager vs compiled, interleaved)."""

import streamlit as st

from ui import state, views
from ui.views import compile as compile_view
from ui.frame import require_app
from ui.jobs import cached_outcome, run_analysis
from ui.widgets import option_input, show_failure

require_app()

st.title("torch.compile explorer")
spec = state.current_spec()
with st.form("compile_form"):
    c1, c2, c3, c4 = st.columns(4)
    options = {
        "backend": option_input("compile", "backend", c1, widget_key="cmp_backend"),
        "mode": option_input("compile", "mode", c2, widget_key="cmp_mode"),
        "dynamic": option_input("compile", "dynamic", c3, widget_key="cmp_dynamic"),
        "rounds": option_input("compile", "rounds", c4, widget_key="cmp_rounds", step=1),
    }
    c5, c6, c7 = st.columns(3)
    options["fullgraph"] = option_input("compile", "fullgraph", c5, widget_key="cmp_fullgraph")
    options["recompile_probe"] = option_input("compile", "recompile_probe", c6, widget_key="cmp_recompile")
    options["train"] = option_input("compile", "train", c7, widget_key="cmp_train")
    run = st.form_submit_button("Compile and measure", type="primary", key="cmp_run",
                                help="Compiling takes seconds to minutes; progress is shown below")
if spec.source == "torchscript":
    st.info("A TorchScript model is already a graph: torch.compile takes the Python model or an exported program.")
# Dynamo's graphs, breaks and recompiles are drawn as soon as the job has them (compile_view.show_partial)
outcome = (run_analysis("compile", spec, options, force=True, partial=compile_view.show_partial) if run
           else cached_outcome("compile", spec, options, partial=compile_view.show_partial))
if outcome is None:
    st.info(f"Not compiled yet: press **Compile and measure** to compile {spec.label} in a worker and see its "
            "graph breaks, recompiles and what compiling buys. The sample graph_break_mlp shows breaks.")
elif outcome.ok:
    views.show("compile", outcome.result)
else:
    show_failure(outcome)
