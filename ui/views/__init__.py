"""How each analysis' result is shown. Pages and History both call ``show(analysis, result)``.

Adding a view is one module plus one entry in ``VIEWS``.
"""

from __future__ import annotations

from typing import Callable

from ui.views import summary, validate

VIEWS: dict[str, Callable[[dict], None]] = {
    "summary": summary.show,
    "validate": validate.show,
}


def show(analysis: str, result: dict) -> None:
    import streamlit as st

    view = VIEWS.get(analysis)
    if view is None:
        st.json(result, expanded=False)
    else:
        view(result)
