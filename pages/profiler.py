"""Profiler page: configure a torch.profiler run, run it on demand, show the views and trace files."""

import streamlit as st

from ui import state, views
from ui.jobs import cached_outcome, run_analysis
from ui.widgets import option_input, show_failure
from ui.frame import require_app

require_app()

st.title("Profiler")
spec = state.current_spec()
cuda = spec.device.startswith("cuda")

# Plain widgets (no st.form): changing a setting shows the stored result for it at once, if any.
# Defaults, bounds and help come from the profile analysis' declaration.
P = "profile"
with st.container(border=True):
    c1, c2, c3 = st.columns(3)
    options = {
        "mode": option_input(P, "mode", c1, widget_key="prof_mode", radio=True,
                             format_func={"inference": "Inference (eval + inference_mode)",
                                          "train": "Training step (forward, loss, backward, optimizer)"}.get),
        "optimizer": option_input(P, "optimizer", c2, widget_key="prof_optimizer", label="Optimizer (training)",
                                  format_func=str.upper),
        "lr": option_input(P, "lr", c3, widget_key="prof_lr", label="Learning rate (training)", max_value=10.0),
    }
    st.markdown("**Profiler schedule** (steps per cycle: wait, then warmup, then active; recorded: active)")
    s1, s2, s3, s4 = st.columns(4)
    for col, key in zip((s1, s2, s3, s4), ("wait", "warmup", "active", "repeat")):
        options[key] = option_input(P, key, col, widget_key=f"prof_{key}", max_value=50 if key != "repeat" else 10)
    a1, a2, a3 = st.columns([2, 3, 3])
    offered = ["cpu", "cuda"] if cuda else ["cpu"]
    options["activities"] = option_input(P, "activities", a1, widget_key="prof_activities", choices=offered,
                                         default=offered) or ["cpu"]
    with a2:
        for key in ("record_shapes", "profile_memory"):
            options[key] = option_input(P, key, widget_key=f"prof_{key}", label=key)
    with a3:
        for key in ("with_stack", "with_modules"):
            options[key] = option_input(P, key, widget_key=f"prof_{key}", label=key)
    l1, l2 = st.columns(2)
    options["latency_warmup"] = option_input(P, "latency_warmup", l1, widget_key="prof_lat_warmup",
                                             label="Latency warmup iterations", max_value=1000)
    options["latency_iters"] = option_input(P, "latency_iters", l2, widget_key="prof_lat_iters",
                                            label="Latency timed iterations")
    submitted = st.button("Run profile", type="primary", icon=":material/play_arrow:", key="prof_run")

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
