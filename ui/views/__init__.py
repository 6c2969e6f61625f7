"""How each analysis' result is shown. Pages and History both call ``show(analysis, result)``.

The function is the one the analysis' declaration names as its ``view`` ("ui.views.<module>:<fn>",
taking the analysis' result type): it is resolved here, for every registered analysis, when this
package is imported, so a missing or broken view is a RegistrationError naming it (the dashboard does
not start; tests/ui/test_views_registry.py fails), never a page that quietly shows raw JSON.
"""

from __future__ import annotations

from typing import Callable

from diagnostics.declare import resolve

#: analysis name -> its resolved view (filled by check_views at import, and for analyses registered later)
_RESOLVED: dict[str, Callable] = {}


def view_of(analysis: str) -> Callable:
    """The function that shows ``analysis``' results (its declared ``view``); RegistrationError if it is
    missing, does not import or does not take the analysis' result type."""
    from diagnostics.registry import get_analysis

    decl = get_analysis(analysis)
    fn = _RESOLVED.get(analysis)
    if fn is None:
        fn = _RESOLVED[analysis] = resolve(decl.view, what=f"the view of {analysis}", takes=decl.result)
    return fn


def check_views() -> dict[str, Callable]:
    """Resolve every registered analysis' view (at import): the first that fails raises, naming itself."""
    from diagnostics.registry import ANALYSES

    return {name: view_of(name) for name in ANALYSES}


def show(analysis: str, result, *, file_stem: str | None = None) -> None:
    """The result's view, then its downloads (``file_stem``: the JSON file's name, default the analysis).
    ``result``: the typed result (a stored run's plain dict is decoded first: ``show_stored``)."""
    machine_banner(result)
    view_of(analysis)(result)
    downloads(analysis, result, file_stem=file_stem)


def show_stored(analysis: str, plain: dict, *, file_stem: str | None = None) -> None:
    """A stored run's result (the store's plain JSON), decoded into its analysis' type and shown. A run
    that no longer fits (stored by an older TorchScope, or an analysis since removed) says so, with the
    stored JSON under the message: nothing stored is lost, nothing is shown as if it were fine."""
    import streamlit as st

    from diagnostics.errors import TorchScopeError
    from diagnostics.registry import get_analysis
    from diagnostics.results import decode

    try:
        result = decode(get_analysis(analysis), plain)
    except TorchScopeError as e:
        st.error(f"This stored run cannot be shown: {e}")
        with st.expander("The stored result (JSON)"):
            st.json(plain, expanded=False)
        return
    show(analysis, result, file_stem=file_stem)


def machine_banner(result) -> None:
    """A timed job's word on the machine: a warning when it was busy (the figures behind it in the
    expander), a caption when it was quiet."""
    import streamlit as st

    from diagnostics.render.text import disturbance_line
    from diagnostics.results import disturbance_of, to_plain

    report = disturbance_of(result)
    line = disturbance_line(report)
    if not line:
        return
    if report.disturbed:
        st.warning(line, icon=":material/speed:")
        with st.expander("What the machine did during the run"):
            st.json({k: v for k, v in to_plain(report).items() if k != "reasons"}, expanded=True)
    else:
        st.caption(f"Machine: {line}")


def downloads(analysis: str, result, *, file_stem: str | None = None) -> None:
    """The result's two downloads, in one row, once per page: 'Download report (HTML)' (the CLI's
    self-contained report, built only when clicked) and 'Download result (JSON)'."""
    import hashlib

    import streamlit as st

    from diagnostics.render.html import build_report
    from diagnostics.results import model_of, to_json

    text = to_json(result)
    digest = hashlib.sha1(text.encode()).hexdigest()[:12]
    model = model_of(result)
    title = f"TorchScope {analysis}" + (f": {model}" if model else "")
    c1, c2, _ = st.columns([1, 1, 2])
    c1.download_button("Download report (HTML)", lambda: build_report(analysis, result, title).encode("utf-8"),
                       file_name=f"torchscope-{analysis}-{digest}.html", mime="text/html",
                       key=f"report-{analysis}-{digest}", on_click="ignore", icon=":material/download:",
                       help="One HTML file with the charts and tables; opens offline (plotly.js inlined)")
    c2.download_button("Download result (JSON)", to_json(result, indent=1).encode(),
                       file_name=f"{file_stem or analysis}.json", mime="application/json",
                       key=f"json-{analysis}-{digest}", on_click="ignore", icon=":material/data_object:",
                       help="The plain result, as stored in the run history")


check_views()  # every registered analysis' view, now: a broken one stops the import, naming itself
