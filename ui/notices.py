"""What the server tells each session once, at the top of the sidebar: jobs run without a sandbox
here (the kernel offers none, or it is turned off), or the run store was unreadable and set aside.
A rerun made by a finished background job (not by the user) shows the same notes again."""

from __future__ import annotations

import streamlit as st

from diagnostics.sandbox import startup_notice
from ui import state
from ui.jobs import get_store

_SEEN = "server_notices_seen"
_SHOWN = "server_notices_shown"  # what the last run showed


def show_notices() -> None:
    seen = st.session_state.setdefault(_SEEN, set())
    notices = [n for n in [startup_notice(), *get_store().notices] if n]
    # A rerun the page made by itself (a background job ended: ui.jobs) keeps what was on screen;
    # the user's next action clears it.
    shown = st.session_state.get(_SHOWN, []) if st.session_state.pop(state.JOB_RERUN, False) else []
    for note in notices:
        if note not in seen:
            seen.add(note)
            shown.append(note)
    for note in shown:
        st.sidebar.warning(note, icon=":material/warning:")
    st.session_state[_SHOWN] = shown
