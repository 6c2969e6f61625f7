"""Views, report layouts and CLI texts are registered by reference in the declarations and resolved when
their registry is imported (ui.views, diagnostics.render.layouts): every registered analysis has one that
takes its result type, and a missing or broken one fails by name, never falls back to raw JSON."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from diagnostics.declare import Analysis, RegistrationError, resolve
from diagnostics.registry import ANALYSES

REPO = Path(__file__).resolve().parents[2]


def test_every_registered_analysis_has_a_view_a_report_and_a_text_that_take_its_result():
    import ui.views
    from diagnostics.render import layouts

    views = ui.views.check_views()
    layouts.check_layouts()
    assert set(views) == set(ANALYSES)
    for name, decl in ANALYSES.items():
        assert views[name] is resolve(decl.view, what=name, takes=decl.result)
        assert callable(layouts.report_of(name))


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A module of views on sys.path: ``broken`` does not import, ``wrong`` takes a dict where the result is typed."""
    (tmp_path / "planted_broken_view.py").write_text("import no_such_module_here\n\ndef show(result):\n    pass\n")
    (tmp_path / "planted_views.py").write_text(textwrap.dedent('''
        from tests.test_results import DemoResult

        def show(result: DemoResult) -> None:
            pass

        def wrong(result: dict) -> None:
            pass
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))

    def plant(name: str, view: str, **kw) -> Analysis:
        from tests.test_results import DemoResult

        decl = Analysis(name, name.title(), "x:y", result=DemoResult, view=view, **kw)
        monkeypatch.setitem(ANALYSES, name, decl)
        return decl

    return plant


def test_a_planted_broken_view_fails_by_name(planted):
    import ui.views

    planted("planted", "planted_broken_view:show")
    expected = (r"the view of planted: planted_broken_view:show cannot be imported \(ModuleNotFoundError: "
                r"No module named 'no_such_module_here'\)")
    with pytest.raises(RegistrationError, match=expected):
        ui.views.check_views()
    with pytest.raises(RegistrationError, match=expected):  # and on a page: no raw-JSON fallback
        ui.views.show("planted", {"metrics": {}})


def test_a_view_that_is_missing_or_takes_another_type_fails_by_name(planted):
    import ui.views

    planted("nofn", "planted_views:nothing_here")
    with pytest.raises(RegistrationError, match=r"the view of nofn: planted_views has no function 'nothing_here'"):
        ui.views.view_of("nofn")
    planted("wrong", "planted_views:wrong")
    with pytest.raises(RegistrationError, match=r"the view of wrong: planted_views:wrong takes dict, not the "
                                                r"analysis' result type DemoResult"):
        ui.views.view_of("wrong")
    planted("fine", "planted_views:show")
    assert ui.views.view_of("fine").__name__ == "show"


def test_a_broken_report_layout_or_text_fails_by_name(planted):
    from diagnostics.render import layouts

    planted("rep", "planted_views:show", report="planted_broken_view:show")
    with pytest.raises(RegistrationError, match=r"the report of rep: planted_broken_view:show cannot be imported"):
        layouts.check_layouts()
    planted("txt", "planted_views:show", text="planted_views:wrong")
    with pytest.raises(RegistrationError, match=r"the CLI text of txt: planted_views:wrong takes dict"):
        layouts.text_of("txt")
    # the lines while a job runs are given its partial result, then the final one: it must take both
    from tests.test_results import DemoPartial

    planted("part", "planted_views:show", partial=DemoPartial, partial_text="planted_views:show")
    with pytest.raises(RegistrationError, match=r"the partial CLI text of part: planted_views:show takes DemoResult, "
                                                r"not the analysis' result type DemoPartial"):
        layouts.partial_text_of("part")


@pytest.mark.parametrize("registry", ["ui.views", "diagnostics.render.layouts"])
def test_importing_the_registry_with_a_planted_broken_view_fails(registry, tmp_path):
    """In a fresh interpreter, as the dashboard and the CLI start: the import itself raises, naming the view."""
    (tmp_path / "planted_broken_view.py").write_text("raise RuntimeError('this view is broken')\n")
    code = textwrap.dedent(f'''
        import sys
        sys.path[:0] = [{str(tmp_path)!r}, {str(REPO)!r}]
        from diagnostics.declare import Analysis
        from diagnostics.registry import ANALYSES
        ANALYSES["planted"] = Analysis("planted", "Planted", "x:y", view="planted_broken_view:show",
                                       report="planted_broken_view:sections")
        import {registry}
    ''')
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 1
    what = "view" if registry == "ui.views" else "report"
    assert (f"RegistrationError: the {what} of planted: planted_broken_view:" in p.stderr
            and "cannot be imported (RuntimeError: this view is broken)" in p.stderr), p.stderr
