"""How each analysis' result is shown. Pages and History both call ``show(analysis, result)``.

Adding a view is one module plus one entry in ``VIEWS``.
"""

from __future__ import annotations

from typing import Callable

from ui.views import summary, validate
from ui.views import profiler as profiler_view
from ui.views import distributed as distributed_view

VIEWS: dict[str, Callable[[dict], None]] = {
    "summary": summary.show,
    "validate": validate.show,
    "profile": profiler_view.show,
    "distributed": distributed_view.show, "distributed_traces": distributed_view.show,
}


def show(analysis: str, result: dict) -> None:
    import streamlit as st

    view = VIEWS.get(analysis)
    if view is None:
        st.json(result, expanded=False)
    else:
        view(result)
