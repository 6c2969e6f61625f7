"""How each analysis' result is shown. Pages and History both call ``show(analysis, result)``.

Adding a view is one module plus one entry in ``VIEWS``.
"""

from __future__ import annotations

from typing import Callable

from ui.views import summary, validate
from ui.views import traces as traces_view
from ui.views import profiler as profiler_view
from ui.views import distributed as distributed_view
from ui.views import memory as memory_view, gradients as gradients_view
from ui.views import checklist as checklist_view, optimize as optimize_view

VIEWS: dict[str, Callable[[dict], None]] = {
    "summary": summary.show,
    "trace": traces_view.show, "trace_diff": traces_view.show_diff,
    "validate": validate.show,
    "profile": profiler_view.show,
    "memory": memory_view.show, "batch_scan": memory_view.show_scan, "gradients": gradients_view.show,
    "distributed": distributed_view.show, "distributed_traces": distributed_view.show,
    "checklist": checklist_view.show, "optimize": optimize_view.show,
}


def show(analysis: str, result: dict) -> None:
    import streamlit as st

    view = VIEWS.get(analysis)
    if view is None:
        st.json(result, expanded=False)
    else:
        view(result)
    report_download(analysis, result)


def report_download(analysis: str, result: dict) -> None:
    """'Download report (HTML)': the CLI's self-contained report, built only when clicked."""
    import hashlib
    import json

    import streamlit as st

    from diagnostics.render.html import build_report

    digest = hashlib.sha1(json.dumps(result, sort_keys=True, default=str).encode()).hexdigest()[:12]
    model = result.get("model") if isinstance(result, dict) else None
    title = f"TorchScope {analysis}" + (f": {model}" if model else "")
    st.download_button("Download report (HTML)", lambda: build_report(analysis, result, title).encode("utf-8"),
                       file_name=f"torchscope-{analysis}-{digest}.html", mime="text/html",
                       key=f"report-{analysis}-{digest}", on_click="ignore", icon=":material/download:",
                       help="One HTML file with the charts and tables; opens offline (plotly.js inlined)")
