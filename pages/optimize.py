"""Optimize page: pick fixes (and their parameters), run them as trials next to the baseline."""

import streamlit as st

from diagnostics.analyses.optimize.catalog import FIXES
from ui import state, views
from ui.jobs import cached_outcome, run_analysis
from ui.frame import require_app
from ui.widgets import option_input, show_failure

require_app()

st.title("Optimize")
spec = state.current_spec()
st.caption("Each fix runs on a copy of the model (yours never changes), in the same job as the baseline, with the "
           "same inputs: latency, throughput, peak memory, size on disk and how far the outputs moved.")
titles = {f.id: f.title for f in FIXES}
preselect = st.session_state.pop(state.OPTIMIZE_PRESELECT, None)
if preselect:
    st.session_state["opt_fixes"] = [f for f in preselect if f in titles]
    st.info(f"From the checklist: {', '.join(titles.get(f, f) for f in preselect)}. Add others to compare, then run.")

with st.container(border=True):
    st.session_state.setdefault("opt_fixes", ["inference_mode", "torchscript"])
    chosen = st.multiselect("Fixes", list(titles), key="opt_fixes", persist_state="session", format_func=titles.get)
    params = {}
    with_params = [f for f in FIXES if f.id in chosen and f.params]
    if with_params:
        cols = st.columns(len(with_params))
        for col, fix in zip(cols, with_params):
            for p in fix.params:  # each fix's parameters are declared options (catalog.py)
                label = f"{fix.title}: {p.key}"
                if p.kind == "choice":
                    v = col.selectbox(label, p.choices, index=p.choices.index(p.default), key=f"opt_{fix.id}_{p.key}",
                                      persist_state="session", help=p.help or None)
                else:
                    v = col.slider(label, float(p.lo), float(p.hi), float(p.default), 0.05,
                                   key=f"opt_{fix.id}_{p.key}", persist_state="session", help=p.help or None)
                if v != p.default:
                    params.setdefault(fix.id, {})[p.key] = v
    c1, c2 = st.columns(2)
    iters = option_input("optimize", "iters", c1, widget_key="opt_iters", label="Timed calls per trial")
    warmup = option_input("optimize", "warmup", c2, widget_key="opt_warmup", label="Warm-up calls")
    run = st.button("Run trials", type="primary", icon=":material/play_arrow:", key="opt_run", disabled=not chosen)

options = {"fixes": list(chosen), "params": params, "iters": iters, "warmup": warmup}
outcome = run_analysis("optimize", spec, options, force=True) if run else cached_outcome("optimize", spec, options)
if outcome is None:
    st.info(f"No trials yet for {spec.label} with these fixes: press **Run trials**.")
elif outcome.ok:
    views.show("optimize", outcome.result)
else:
    show_failure(outcome)
