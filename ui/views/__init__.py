"""How each analysis' result is shown. Pages and History both call ``show(analysis, result)``.

The module is the one the analysis' declaration names as its ``view`` (ui.views.<view>); its
``VIEWS`` maps the analysis to a ``fn(result)``. Adding an analysis' page view is that module.
"""

from __future__ import annotations

import importlib
from typing import Callable


def view_of(analysis: str) -> Callable[[dict], None] | None:
    """The function that shows ``analysis``' results, or None (then the raw result is shown)."""
    from diagnostics.registry import ANALYSES

    decl = ANALYSES.get(analysis)
    if decl is None:
        return None
    try:
        module = importlib.import_module(f"ui.views.{decl.view}")
    except ModuleNotFoundError:
        return None
    return getattr(module, "VIEWS", {}).get(analysis)


def show(analysis: str, result: dict, *, file_stem: str | None = None) -> None:
    """The result's view, then its downloads (``file_stem``: the JSON file's name, default the analysis)."""
    import streamlit as st

    machine_banner(result)
    view = view_of(analysis)
    if view is None:
        st.json(result, expanded=False)
    else:
        view(result)
    downloads(analysis, result, file_stem=file_stem)


def machine_banner(result: dict) -> None:
    """A timed job's word on the machine: a warning when it was busy (the figures behind it in the
    expander), a caption when it was quiet."""
    import streamlit as st

    from diagnostics.render.text import disturbance_line

    report = result.get("disturbance") if isinstance(result, dict) else None
    line = disturbance_line(report)
    if not line:
        return
    if report.get("disturbed"):
        st.warning(line, icon=":material/speed:")
        with st.expander("What the machine did during the run"):
            st.json({k: v for k, v in report.items() if k not in ("reasons",)}, expanded=True)
    else:
        st.caption(f"Machine: {line}")


def downloads(analysis: str, result: dict, *, file_stem: str | None = None) -> None:
    """The result's two downloads, in one row, once per page: 'Download report (HTML)' (the CLI's
    self-contained report, built only when clicked) and 'Download result (JSON)'."""
    import hashlib
    import json

    import streamlit as st

    from diagnostics.render.html import build_report

    text = json.dumps(result, sort_keys=True, default=str)
    digest = hashlib.sha1(text.encode()).hexdigest()[:12]
    model = result.get("model") if isinstance(result, dict) else None
    title = f"TorchScope {analysis}" + (f": {model}" if model else "")
    c1, c2, _ = st.columns([1, 1, 2])
    c1.download_button("Download report (HTML)", lambda: build_report(analysis, result, title).encode("utf-8"),
                       file_name=f"torchscope-{analysis}-{digest}.html", mime="text/html",
                       key=f"report-{analysis}-{digest}", on_click="ignore", icon=":material/download:",
                       help="One HTML file with the charts and tables; opens offline (plotly.js inlined)")
    c2.download_button("Download result (JSON)", json.dumps(result, indent=1, default=str).encode(),
                       file_name=f"{file_stem or analysis}.json", mime="application/json",
                       key=f"json-{analysis}-{digest}", on_click="ignore", icon=":material/data_object:",
                       help="The plain result, as stored in the run history")
