"""Memory page: training and inference peaks, what holds them, per layer, over time; batch-size scan."""

import streamlit as st

from diagnostics.measure.training import OPTIMIZERS
from ui import state, views
from ui.jobs import cached_outcome, run_analysis
from ui.widgets import show_failure
from ui.frame import require_app

require_app()

st.title("Memory")
spec = state.current_spec()
with st.form("memory_form"):
    c1, c2, c3 = st.columns(3)
    optimizer = c1.selectbox("Optimizer", OPTIMIZERS, index=OPTIMIZERS.index("adamw"), key="mem_optimizer",
                             help="Its state counts towards the training peak (SGD momentum: 1 × params; "
                                  "AdamW: 2 ×)")
    lr = c2.number_input("Learning rate", min_value=1e-8, max_value=10.0, value=1e-3, format="%g", key="mem_lr")
    timeline = c3.checkbox("Memory timeline (slower: profiles with shapes and stacks)", value=True, key="mem_timeline")
    rerun = st.form_submit_button("Run again", help="Results are cached per model, inputs, device and options")
options = {"optimizer": optimizer, "lr": float(lr), "timeline": bool(timeline)}
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
    max_batch = c1.number_input("Largest batch to try", min_value=1, max_value=65536, value=64, step=1,
                                key="scan_max_batch")
    budget = c2.number_input("Memory budget (MiB, 0 = device default)", min_value=0.0, value=0.0, step=64.0,
                             key="scan_budget", help="Default: the GPU's total memory, or half the free RAM on the CPU")
    mode = c3.selectbox("Mode", ["train", "inference"], key="scan_mode")
    run_scan = st.form_submit_button("Run batch scan", type="primary")
scan_options = {"max_batch": int(max_batch), "memory_budget_mb": float(budget) or None, "mode": mode}
scan = (run_analysis("batch_scan", spec, scan_options, force=True) if run_scan
        else cached_outcome("batch_scan", spec, scan_options))
if scan is None:
    st.info("Set the limits and press **Run batch scan** (it runs one probe per batch size).")
elif scan.ok:
    views.show("batch_scan", scan.result)
else:
    show_failure(scan)
