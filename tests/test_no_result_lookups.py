"""Views, charts, texts and pages read typed results by attribute (``result.metrics.params_total``), never by
string (``result["metrics"]["params_total"]``, ``result.get("notes")``): a typo is then an AttributeError in
a test, not a silent None on a page.

The scan (ast) covers ui/, pages/, app.py and diagnostics/render/. It flags, in every module not on
NOT_CONVERTED:
* a string subscript or ``.get("...")`` on a result: a name in RESULT_NAMES, an attribute in RESULT_ATTRS
  (``outcome.result["x"]``, ``result.timeline["events"]``, ``result.facts.measured["profile"]``) or a
  ``["result"]`` item; the names cover History's comparisons and trends, the timelines (the profile's and the
  trace explorer's one ``Timeline``) and the checklist's facts and their sections;
* turning a result back into its plain dict to read it (``to_plain``, ``msgspec.to_builtins``,
  ``dataclasses.asdict``, ``vars``): the plain form is for the codec and the generic renderers
  (PLAIN_FORM_READERS), so renaming a dict does not get a view past this test.
NOT_CONVERTED lists the modules whose analyses still return plain dicts; whoever converts one removes its
modules here (an entry without lookups fails, so the list only shrinks). The end state is an empty list.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = [*sorted((ROOT / "ui").rglob("*.py")), *sorted((ROOT / "pages").glob("*.py")), ROOT / "app.py",
           *sorted((ROOT / "diagnostics" / "render").rglob("*.py"))]
#: Facts' sections (diagnostics.analyses.checklist.Facts): records, read by attribute like the rest.
FACTS_SECTIONS = {"static", "env", "forward", "measured", "dataloader"}
RESULT_NAMES = {"result", "res", "results", "comparison", "trend", "facts", "timeline", "tl"} | FACTS_SECTIONS
RESULT_ATTRS = {"result", "timeline", "facts"} | FACTS_SECTIONS
#: Generic code over any analysis' result, working from its declaration and its plain form.
PLAIN_FORM_READERS = {"diagnostics/render/html.py", "diagnostics/render/sections.py", "diagnostics/render/tables.py",
                      "ui/views/__init__.py"}
PLAIN_CALLS = {"to_plain", "to_builtins", "asdict", "vars"}

#: Modules that still read plain-dict results (their analyses are not converted yet). Remove yours when done.
NOT_CONVERTED: set[str] = set()  # every analysis returns its typed result


def _is_result(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id in RESULT_NAMES
    if isinstance(node, ast.Attribute):
        return node.attr in RESULT_ATTRS
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "result"
    return False


def _string(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def lookups(path: Path) -> list[str]:
    """'line: code' of each string lookup on a result (and each plain-form read) in the module."""
    tree = ast.parse(path.read_text(), str(path))
    rel = path.relative_to(ROOT).as_posix()
    found = []
    for node in ast.walk(tree):
        hit = False
        if isinstance(node, ast.Subscript) and _is_result(node.value) and _string(node.slice):
            hit = True
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and _is_result(node.func.value) and node.args and _string(node.args[0]):
            hit = True
        elif isinstance(node, ast.Call) and rel not in PLAIN_FORM_READERS:
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            hit = name in PLAIN_CALLS
        if hit:
            found.append(f"{node.lineno}: {ast.get_source_segment(path.read_text(), node)}")
    return found


def _all() -> dict[str, list[str]]:
    return {p.relative_to(ROOT).as_posix(): lookups(p) for p in SCANNED}


def test_converted_modules_read_results_by_attribute():
    bad = {m: hits for m, hits in _all().items() if hits and m not in NOT_CONVERTED}
    assert not bad, "string lookups on results (use the typed attributes):\n" + "\n".join(
        f"{m}:{h}" for m, hits in bad.items() for h in hits)


def test_the_list_of_modules_not_converted_only_shrinks():
    found = _all()
    stale = sorted(m for m in NOT_CONVERTED if not found.get(m))
    assert not stale, f"no lookups left in {stale}: remove them from NOT_CONVERTED"


def test_the_scan_sees_lookups_and_plain_reads():
    """The rules can fail: each planted form is found."""
    f = ROOT / "ui" / "views" / "_planted_for_scan.py"
    f.write_text("def show(result, outcome):\n"
                 "    a = result['metrics']['x']\n"
                 "    b = result.get('notes')\n"
                 "    c = outcome.result['timeline']\n"
                 "    d = to_plain(result)['rows']\n"
                 "    e = result.metrics.x\n"
                 "    g = result.timeline['events']\n"
                 "    h = timeline.get('lanes')\n"
                 "    i = result.facts.measured['profile']\n"
                 "    j = static['n_conv']\n"
                 "    k = result.timeline.events[0].name\n")
    try:
        assert sorted(h.split(":")[0] for h in lookups(f)) == ["10", "2", "3", "4", "5", "7", "8", "9"]
    finally:
        f.unlink()
