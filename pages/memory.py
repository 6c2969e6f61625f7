"""Memory page: training and inference peaks, what holds them, per layer, over time; batch-size scan."""

import streamlit as st

from ui import state, views
from ui.jobs import cached_outcome, run_analysis
from ui.widgets import option_input, show_failure
from ui.frame import require_app

require_app()

st.title("Memory")
spec = state.current_spec()
with st.form("memory_form"):
    c1, c2, c3 = st.columns(3)
    options = {
        "optimizer": option_input("memory", "optimizer", c1, widget_key="mem_optimizer", format_func=str.upper),
        "lr": option_input("memory", "lr", c2, widget_key="mem_lr", max_value=10.0),
        "timeline": option_input("memory", "timeline", c3, widget_key="mem_timeline",
                                 label="Memory timeline", help="Slower: profiles with shapes and stacks to "
                                                               "draw memory over time"),
    }
    rerun = st.form_submit_button("Run again", help="Results are cached per model, inputs, device and options")
outcome = run_analysis("memory", spec, options, force=rerun)
if outcome.ok:
    views.show("memory", outcome.result)
else:
    show_failure(outcome)

st.divider()
st.header("Batch-size scan")
st.caption("Latency, throughput and peak memory at batch 1, 2, 4, ... up to the limit; then the largest batch "
           "under the memory budget, by binary search. A probe over the budget or out of memory ends the "
           "doubling and is reported.")
with st.form("scan_form"):
    c1, c2, c3 = st.columns(3)
    max_batch = option_input("batch_scan", "max_batch", c1, widget_key="scan_max_batch", label="Largest batch to try",
                             max_value=65536, step=1)
    budget = option_input("batch_scan", "memory_budget_mb", c2, widget_key="scan_budget", min_value=0.0, value=0.0,
                          step=64.0, label="Memory budget (MiB, 0 = device default)")
    mode = option_input("batch_scan", "mode", c3, widget_key="scan_mode")
    run_scan = st.form_submit_button("Run batch scan", type="primary")
scan_options = {"max_batch": max_batch, "memory_budget_mb": budget or None, "mode": mode}
scan = (run_analysis("batch_scan", spec, scan_options, force=True) if run_scan
        else cached_outcome("batch_scan", spec, scan_options))
if scan is None:
    st.info("Set the limits and press **Run batch scan** (it runs one probe per batch size).")
elif scan.ok:
    views.show("batch_scan", scan.result)
else:
    show_failure(scan)
