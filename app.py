"""TorchScope: router and frame. Page config, the shared sidebar, one navigation list."""

import streamlit as st

from ui.access import gate

st.set_page_config(page_title="TorchScope", page_icon="🔬", layout="wide")
gate()  # first: served beyond this machine, the access token (or server-safe mode) before anything else

from ui.background import start_spares  # noqa: E402

start_spares()  # before the sidebar's imports (torch): the first job's worker starts meanwhile

from ui.sidebar import render_sidebar  # noqa: E402

from ui.jobs import store_problem  # noqa: E402

if problem := store_problem():  # a read-only or full data folder: its one message, not a traceback per page
    st.error(problem, icon=":material/error:")
    st.stop()

PAGES = [
    st.Page("pages/model.py", title="Model", icon=":material/view_in_ar:", default=True),
    st.Page("pages/profiler.py", title="Profiler", icon=":material/timer:"),
    st.Page("pages/memory.py", title="Memory", icon=":material/memory:"),
    st.Page("pages/gradients.py", title="Gradient flow", icon=":material/trending_down:"),
    st.Page("pages/checklist.py", title="Checklist", icon=":material/checklist:"),
    st.Page("pages/optimize.py", title="Optimize", icon=":material/rocket_launch:"),
    st.Page("pages/compile.py", title="Compile", icon=":material/bolt:"),
    st.Page("pages/traces.py", title="Trace explorer", icon=":material/timeline:"),
    st.Page("pages/distributed.py", title="Distributed", icon=":material/hub:"),
    st.Page("pages/run_script.py", title="Run a script", icon=":material/terminal:"),
    st.Page("pages/history.py", title="History", icon=":material/history:"),
]

nav = st.navigation(PAGES)
render_sidebar()
nav.run()
