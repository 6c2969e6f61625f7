"""Make sure every page runs inside app.py's frame (page config, sidebar, navigation).

With a pages/ folder, a fresh Streamlit server whose first request goes straight to a page URL
(e.g. /traces) falls back to the old v1 multipage mode and runs that page alone, without app.py.
``require_app()`` at the top of each page notices that, switches the process to st.navigation
mode (what app.py's first run would have done) and reruns, which goes through app.py.
"""

from __future__ import annotations

import streamlit as st
from streamlit.runtime.pages_manager import PagesManager


def require_app() -> None:
    if PagesManager.uses_pages_directory:
        PagesManager.uses_pages_directory = False
        st.rerun()
