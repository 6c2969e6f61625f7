"""Distributed page: launch a profiled DDP run with torchrun, or load per-rank traces from a folder."""

import streamlit as st

from diagnostics.settings import safe_mode
from ui import state, views
from ui.jobs import cached_outcome, run_analysis
from ui.widgets import option_input, show_failure
from ui.frame import require_app

require_app()

st.title("Distributed")
spec = state.current_spec()
# A folder on the server is no place for remote users to browse: server-safe mode offers launches only.
sources = ["Launch with torchrun"] + ([] if safe_mode() else ["Load per-rank traces from a folder"])
mode = st.radio("Source", sources, horizontal=True, key="dist_mode", persist_state="session")
c1, c2 = st.columns(2)
thresholds = {
    "straggler_margin": option_input("distributed", "straggler_margin", c1, widget_key="dist_margin",
                                     label="Straggler margin (%)", scale=100.0, max_value=10.0, step=5.0),
    "straggler_min_ms": option_input("distributed", "straggler_min_ms", c2, widget_key="dist_min_ms",
                                     label="Minimum excess (ms)", step=1.0),
}
_pattern = option_input("distributed", "comm_kernels", widget_key="dist_comm_kernels",
                        label="Communication kernels (regular expression, for in-house collectives)")
if _pattern:
    thresholds["comm_kernels"] = _pattern

if mode == "Launch with torchrun":
    backend = "nccl" if spec.device.startswith("cuda") else "gloo"
    st.caption(f"DistributedDataParallel training of **{spec.label}** · backend **{backend}** "
               f"({'one GPU per process' if backend == 'nccl' else 'CPU processes over loopback'}) · "
               "every rank profiled with torch.profiler")
    c1, c2 = st.columns(2)
    nproc = option_input("distributed", "nproc", c1, widget_key="dist_nproc", label="Processes (--nproc_per_node)")
    steps = option_input("distributed", "steps", c2, widget_key="dist_steps", label="Profiled steps", max_value=100)
    options = {"nproc": nproc, "steps": steps, "backend": backend, **thresholds}
    with st.expander("Fault injection (for demos)"):
        if st.checkbox("Inject a straggler", key="dist_inject", persist_state="session"):
            c1, c2 = st.columns(2)
            options["straggler_rank"] = int(c1.number_input("Slow rank", min_value=0, max_value=int(nproc) - 1,
                                                            value=min(1, int(nproc) - 1), key="dist_slow_rank",
                                                            persist_state="session"))
            options["straggler_sleep_ms"] = float(c2.number_input("Sleep per step (ms)", min_value=1.0, value=150.0,
                                                                  key="dist_sleep", persist_state="session"))
        if st.checkbox("Make a rank die", key="dist_die", persist_state="session"):
            c1, c2 = st.columns(2)
            options["die_rank"] = int(c1.number_input("Dying rank", min_value=0, max_value=int(nproc) - 1,
                                                      value=int(nproc) - 1, key="dist_die_rank",
                                                      persist_state="session"))
            options["die_step"] = int(c2.number_input("At step", min_value=0, value=1, key="dist_die_step",
                                                      persist_state="session"))
    analysis, job_spec = "distributed", spec
    clicked = st.button("Run", type="primary", key="dist_run")
else:
    folder = st.text_input("Folder with one trace per rank (on the dashboard's machine)", key="dist_folder",
                           persist_state="session", placeholder="/path/to/traces",
                           help="*.json or *.json.gz, e.g. rank0.pt.trace.json; the rank comes from each trace's "
                           "distributedInfo")
    options = {"trace_dir": folder.strip(), **thresholds}
    analysis, job_spec = "distributed_traces", None
    clicked = st.button("Analyse", type="primary", key="dist_load", disabled=not folder.strip())

if clicked:
    outcome = run_analysis(analysis, job_spec, options, force=True)
else:
    outcome = cached_outcome(analysis, job_spec, options)
if outcome is None:
    st.info("Set the options and press the button: a run takes a few seconds per step on CPU.")
elif outcome.ok:
    views.show(analysis, outcome.result)
else:
    show_failure(outcome)
