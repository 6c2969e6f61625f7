"""What the server tells each session once, at the top of the sidebar: jobs run without a sandbox
here (the kernel offers none, or it is turned off), or the run store was unreadable and set aside."""

from __future__ import annotations

import streamlit as st

from diagnostics.sandbox import startup_notice
from ui.jobs import get_store

_SEEN = "server_notices_seen"


def show_notices() -> None:
    seen = st.session_state.setdefault(_SEEN, set())
    notices = [n for n in [startup_notice(), *get_store().notices] if n]
    for note in notices:
        if note not in seen:
            seen.add(note)
            st.sidebar.warning(note, icon=":material/warning:")
