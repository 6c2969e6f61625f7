"""Memory page: training and inference peaks, what holds them, per layer, over time; batch-size scan; and the
Plan tab: will it fit, predicted on fake tensors for batches, dtypes, optimizers and devices."""

import streamlit as st

from ui import state, views
from ui.jobs import cached_outcome, run_analysis
from ui.widgets import option_input, show_failure
from ui.frame import require_app
from diagnostics.registry import ANALYSES

require_app()

st.title("Memory")
spec = state.current_spec()
tab_measured, tab_plan = st.tabs(["Measured", "Plan"])
with tab_measured:
    with st.form("memory_form"):
        c1, c2, c3 = st.columns(3)
        options = {
            "optimizer": option_input("memory", "optimizer", c1, widget_key="mem_optimizer", format_func=str.upper),
            "lr": option_input("memory", "lr", c2, widget_key="mem_lr", max_value=10.0),
            "timeline": option_input("memory", "timeline", c3, widget_key="mem_timeline",
                                     label="Memory timeline", help="Slower: profiles with shapes and stacks to "
                                                                   "draw memory over time"),
        }
        options["checkpoint_modules"] = option_input("memory", "checkpoint_modules", c1, widget_key="mem_ck_modules",
                                                     placeholder="e.g. the Plan tab's 'Fit in' answer")
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

with tab_plan:
    st.caption("Will it fit? One training step (or inference with a KV cache) run on fake tensors: shapes without "
               "data, so sizes this machine could never hold are planned without allocating them.")
    from diagnostics.analyses.plan.targets import DECLARED

    with st.form("plan_form"):
        c1, c2, c3, c4 = st.columns(4)
        plan_options = {
            "batch": option_input("plan", "batch", c1, widget_key="plan_batch", placeholder="e.g. 1,2,4,8"),
            "seq": option_input("plan", "seq", c2, widget_key="plan_seq", placeholder="e.g. 2048,4096 or decoder_input_ids=16,32"),
            "device": c3.selectbox("Device", ["auto", "local", "cpu", *DECLARED], key="plan_device",
                                   help=ANALYSES["plan"].option("device").help),
            "mode": option_input("plan", "mode", c4, widget_key="plan_mode"),
            "dtype": option_input("plan", "dtype", c1, widget_key="plan_dtype"),
            "optimizer": option_input("plan", "optimizer", c2, widget_key="plan_optimizer"),
            "checkpointing": option_input("plan", "checkpointing", c3, widget_key="plan_checkpointing"),
            "shard": option_input("plan", "shard", c4, widget_key="plan_shard"),
        }
        c1, c2, c3, c4 = st.columns(4)
        plan_options["ranks"] = c1.number_input("Ranks", min_value=1, max_value=65536, value=None, key="plan_ranks",
                                                help=ANALYSES["plan"].option("ranks").help) or None
        plan_options["checkpoint_modules"] = option_input("plan", "checkpoint_modules", c2, widget_key="plan_ck_modules")
        plan_options["kv_dtype"] = option_input("plan", "kv_dtype", c3, widget_key="plan_kv_dtype")
        plan_options["offload"] = option_input("plan", "offload", c4, widget_key="plan_offload",
                                               label="Optimizer state on the CPU")
        plan_options["budget"] = option_input("plan", "budget", c1, widget_key="plan_budget",
                                              placeholder="e.g. 6GiB: what to checkpoint to fit")
        run_plan = st.form_submit_button("Plan", type="primary")
    plan = (run_analysis("plan", spec, plan_options, force=True) if run_plan
            else cached_outcome("plan", spec, plan_options))
    if plan is None:
        st.info("Choose the configurations and the device, then press **Plan** (it traces on fake tensors, "
                "nothing of the model's size is allocated).")
    elif plan.ok:
        views.show("plan", plan.result)
    else:
        show_failure(plan)
