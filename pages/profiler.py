"""Profiler page: configure a torch.profiler run, run it on demand, show the views and trace files."""

import streamlit as st

from ui import state, views
from ui.jobs import cached_outcome, run_analysis
from ui.widgets import show_failure
from ui.frame import require_app

require_app()

st.title("Profiler")
spec = state.current_spec()
cuda = spec.device.startswith("cuda")

# Plain widgets (no st.form): changing a setting shows the stored result for it at once, if any.
with st.container(border=True):
    c1, c2, c3 = st.columns(3)
    mode = c1.radio("Mode", ["inference", "train"], key="prof_mode", horizontal=True,
                    format_func={"inference": "Inference (eval + inference_mode)",
                                 "train": "Training step (forward, loss, backward, optimizer)"}.get)
    optimizer = c2.selectbox("Optimizer (training)", ["sgd", "adamw"], key="prof_optimizer",
                             format_func=str.upper)
    lr = c3.number_input("Learning rate (training)", min_value=1e-8, max_value=10.0, value=0.01, format="%g",
                         key="prof_lr")
    st.markdown("**Profiler schedule** (steps per cycle: wait, then warmup, then active; recorded: active)")
    s1, s2, s3, s4 = st.columns(4)
    wait = s1.number_input("Wait", 0, 50, 1, key="prof_wait", help="steps run without the profiler")
    warmup = s2.number_input("Warmup", 0, 50, 1, key="prof_warmup", help="profiled but discarded steps")
    active = s3.number_input("Active", 1, 50, 3, key="prof_active", help="recorded steps")
    repeat = s4.number_input("Repeat", 1, 10, 1, key="prof_repeat", help="cycles of wait + warmup + active")
    a1, a2, a3 = st.columns([2, 3, 3])
    activities = a1.multiselect("Activities", ["cpu", "cuda"] if cuda else ["cpu"],
                                default=["cpu", "cuda"] if cuda else ["cpu"], key="prof_activities",
                                help="CUDA is offered when the model runs on a CUDA device")
    with a2:
        record_shapes = st.checkbox("record_shapes", True, key="prof_record_shapes",
                                    help="input shapes per operator (enables grouping by shape)")
        profile_memory = st.checkbox("profile_memory", False, key="prof_profile_memory",
                                     help="memory allocated per operator")
    with a3:
        with_stack = st.checkbox("with_stack", False, key="prof_with_stack",
                                 help="Python stacks in the trace (slower, larger trace)")
        with_modules = st.checkbox("with_modules", True, key="prof_with_modules",
                                   help="a range per module's forward: per-module times and the module tree")
    l1, l2 = st.columns(2)
    latency_warmup = l1.number_input("Latency warmup iterations", 0, 1000, 5, key="prof_lat_warmup")
    latency_iters = l2.number_input("Latency timed iterations", 1, 10000, 30, key="prof_lat_iters",
                                    help="timed outside the profiler, after the warmup")
    submitted = st.button("Run profile", type="primary", icon=":material/play_arrow:", key="prof_run")

options = {
    "mode": mode, "optimizer": optimizer, "lr": float(lr), "wait": int(wait), "warmup": int(warmup),
    "active": int(active), "repeat": int(repeat), "activities": list(activities) or ["cpu"],
    "record_shapes": record_shapes, "profile_memory": profile_memory, "with_stack": with_stack,
    "with_modules": with_modules, "latency_warmup": int(latency_warmup), "latency_iters": int(latency_iters),
}
if submitted:
    outcome = run_analysis("profile", spec, options, force=True)
else:
    outcome = cached_outcome("profile", spec, options)
if outcome is None:
    st.info(f"No profile yet for {spec.label} with these settings. Profiling times the device, so it runs "
            "only when you press **Run profile**.")
elif outcome.ok:
    if outcome.from_cache and not submitted:
        st.caption("Showing the last profile for this model and these settings; press Run profile to measure again.")
    views.show("profile", outcome.result)
else:
    show_failure(outcome)
