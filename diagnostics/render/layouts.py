"""What each analysis' report and CLI text are: the functions its declaration names, resolved here.

``report`` ("module:function" taking the analysis' result, returning a list of sections.Section; by
default the generic layout, sections.generic_sections) and ``text`` (the CLI's text of a result;
none: the headline metrics and notes) are resolved for every registered analysis when this module is
imported: a missing or broken one raises RegistrationError naming it, so the CLI's report and the
dashboard's download fail loudly instead of falling back to raw JSON (tests/cli/test_report.py).
"""

from __future__ import annotations

from typing import Callable

from diagnostics.declare import resolve
from diagnostics.registry import ANALYSES, get_analysis

_REPORTS: dict[str, Callable] = {}
_TEXTS: dict[str, Callable | None] = {}


def report_of(analysis: str) -> Callable:
    """``fn(result) -> list[Section]``: the report layout ``analysis`` declares."""
    fn = _REPORTS.get(analysis)
    if fn is None:
        decl = get_analysis(analysis)
        fn = _REPORTS[analysis] = resolve(decl.report, what=f"the report of {analysis}", takes=decl.result)
    return fn


def text_of(analysis: str) -> Callable | None:
    """``fn(result) -> str``: the CLI text ``analysis`` declares, or None (the headline metrics)."""
    if analysis not in _TEXTS:
        decl = get_analysis(analysis)
        _TEXTS[analysis] = (resolve(decl.text, what=f"the CLI text of {analysis}", takes=decl.result)
                            if decl.text else None)
    return _TEXTS[analysis]


def check_layouts() -> None:
    """Resolve every registered analysis' report and text: the first that fails raises, naming itself."""
    for name in ANALYSES:
        report_of(name)
        text_of(name)


check_layouts()
