"""Optimize page: pick fixes (and their parameters), run them as trials next to the baseline."""

import streamlit as st

from diagnostics.analyses.optimize.catalog import FIXES, TRAIN_FIXES
from ui import state, views
from ui.views import optimize as optimize_view
from ui.jobs import cached_outcome, run_analysis
from ui.frame import require_app
from ui.widgets import option_input, show_failure

require_app()

st.title("Optimize")
spec = state.current_spec()
st.caption("Each fix runs on a copy of the model (yours never changes), in the same job as the baseline, with the "
           "same inputs: time, throughput, peak memory, size on disk and how far the outputs (or, for a training "
           "step, the losses and gradients) moved.")
preselect = st.session_state.pop(state.OPTIMIZE_PRESELECT, None)
if isinstance(preselect, list):  # an older hand-off: inference fix ids
    preselect = {"mode": "inference", "fixes": preselect}
if preselect:
    st.session_state["opt_mode"] = "Training step" if preselect["mode"] == "train" else "Inference"
st.session_state.setdefault("opt_mode", "Inference")
mode_label = st.segmented_control("Trial", ["Inference", "Training step"], key="opt_mode", persist_state="session",
                                  help="Inference: the model called under no_grad. Training step: forward, loss, "
                                       "backward and optimizer step, each fix training a copy from the same start.")
mode = "train" if mode_label == "Training step" else "inference"
fixes = TRAIN_FIXES if mode == "train" else FIXES
titles = {f.id: f.title for f in fixes}
fixes_key = f"opt_fixes_{mode}"
if preselect:
    st.session_state[fixes_key] = [f for f in preselect["fixes"] if f in titles]
    st.info(f"From the checklist: {', '.join(titles.get(f, f) for f in preselect['fixes'])}. Add others to "
            "compare, then run.")

with st.container(border=True):
    st.session_state.setdefault(fixes_key, ["inference_mode", "torchscript"] if mode == "inference"
                                else ["activation_checkpointing", "fused_optimizer"])
    chosen = st.multiselect("Fixes", list(titles), key=fixes_key, persist_state="session", format_func=titles.get)
    params = {}
    with_params = [f for f in fixes if f.id in chosen and f.params]
    if with_params:
        cols = st.columns(len(with_params))
        for col, fix in zip(cols, with_params):
            for p in fix.params:  # each fix's parameters are declared options (catalog.py)
                label = f"{fix.title}: {p.key}"
                wkey = f"opt_{mode}_{fix.id}_{p.key}"
                if p.kind == "choice":
                    v = col.selectbox(label, p.choices, index=p.choices.index(p.default), key=wkey,
                                      persist_state="session", help=p.help or None)
                elif p.kind == "int":
                    v = col.number_input(label, int(p.lo), int(p.hi), int(p.default), 1, key=wkey,
                                         persist_state="session", help=p.help or None)
                else:
                    v = col.slider(label, float(p.lo), float(p.hi), float(p.default), 0.05, key=wkey,
                                   persist_state="session", help=p.help or None)
                if v != p.default:
                    params.setdefault(fix.id, {})[p.key] = v
    if mode == "train":
        t1, t2, t3 = st.columns(3)
        optimizer = option_input("optimize", "optimizer", t1, widget_key="opt_optimizer", label="Optimizer")
        lr = option_input("optimize", "lr", t2, widget_key="opt_lr", label="Learning rate")
        steps = option_input("optimize", "train_steps", t3, widget_key="opt_steps", label="Fidelity steps")
    c1, c2, c3, c4 = st.columns(4)
    iters = option_input("optimize", "iters", c1, widget_key="opt_iters", label="Timed rounds")
    warmup = option_input("optimize", "warmup", c2, widget_key="opt_warmup",
                          label="Warm-up steps" if mode == "train" else "Warm-up calls")
    early_stop = option_input("optimize", "early_stop", c3, widget_key="opt_early_stop",
                              label="Stop when decided")
    budget = option_input("optimize", "time_budget_s", c4, widget_key="opt_budget", label="Time budget (s, 0: none)",
                          step=5.0)
    with st.expander("Fidelity thresholds (flag fixes that move the results too far)"):
        f1, f2 = st.columns(2)
        min_cosine = option_input("optimize", "min_cosine", f1, widget_key="opt_min_cosine", label="Minimum cosine")
        min_top1 = option_input("optimize", "min_top1", f2, widget_key="opt_min_top1",
                                label="Minimum top-1 agreement")
    run = st.button("Run trials", type="primary", icon=":material/play_arrow:", key="opt_run", disabled=not chosen)

options = {"fixes": list(chosen), "params": params, "iters": iters, "warmup": warmup, "early_stop": early_stop,
           "time_budget_s": budget}
if mode == "train":
    options.update(mode="train", optimizer=optimizer, lr=lr, train_steps=steps)
# the rows measured so far are drawn while the trials run (optimize_view.show_partial)
outcome = (run_analysis("optimize", spec, options, force=True, partial=optimize_view.show_partial) if run
           else cached_outcome("optimize", spec, options, partial=optimize_view.show_partial))
if outcome is None:
    st.info(f"No trials yet for {spec.label} with these fixes: press **Run trials**.")
elif outcome.ok:
    # the thresholds only re-read the measured rows: changing them never re-runs the trials
    views.show("optimize", optimize_view.with_thresholds(outcome.result, min_cosine, min_top1))
else:
    show_failure(outcome)
