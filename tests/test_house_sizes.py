"""The house's size limits (issue #44's goals), counted from the source with ast: modules over 600 lines, functions
over 80 lines in diagnostics/, ui/ and pages/, and results built from a dict at a job's end (``results.build``)
instead of made as records where their data is made. Raise a limit only with a reason in the commit.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [p for d in ("diagnostics", "ui", "pages") for p in sorted((ROOT / d).rglob("*.py"))]
MODULE_LINES, MODULES_OVER = 600, 3
FUNCTION_LINES, FUNCTIONS_OVER = 80, 8
BUILT_FROM_DICTS = 8


@functools.cache
def _tree(path: Path) -> ast.AST:
    return ast.parse(path.read_text(), str(path))


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def long_modules(sources=SOURCES) -> list[str]:
    return [f"{_name(p)} ({n})" for p in sources if (n := len(p.read_text().splitlines())) > MODULE_LINES]


def long_functions(sources=SOURCES) -> list[str]:
    return [f"{_name(p)}:{node.name} ({node.end_lineno - node.lineno + 1})"
            for p in sources for node in ast.walk(_tree(p))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > FUNCTION_LINES]


def built_from_dicts(sources=SOURCES) -> list[str]:
    """Calls of diagnostics.results.build (imported by that name) whose argument is a dict."""
    out = []
    for p in sources:
        tree = _tree(p)
        names = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                 and n.module == "diagnostics.results" for a in n.names if a.name == "build"}
        for n in ast.walk(tree):
            if isinstance(n, ast.Call) and len(n.args) >= 2 and (
                    (isinstance(n.func, ast.Name) and n.func.id in names)
                    or (isinstance(n.func, ast.Attribute) and n.func.attr == "build"
                        and isinstance(n.func.value, ast.Name) and n.func.value.id == "results")):
                out.append(f"{_name(p)}:{n.lineno}")
    return out


def test_few_modules_over_600_lines():
    found = long_modules()
    assert len(found) <= MODULES_OVER, found


def test_few_functions_over_80_lines():
    found = long_functions()
    assert len(found) <= FUNCTIONS_OVER, found


def test_few_results_built_from_dicts():
    found = built_from_dicts()
    assert len(found) <= BUILT_FROM_DICTS, found


def test_the_counts_see_what_they_count(tmp_path):
    """Each count finds a planted case (so a limit cannot pass by counting nothing)."""
    long = tmp_path / "long.py"
    long.write_text("from diagnostics.results import build as b\n\n\ndef f():\n" + "    x = 1\n" * 85
                    + "    return b(R, {'x': x})\n" + "\n" * 520)
    short = tmp_path / "short.py"
    short.write_text("def g():\n    return 1\n")
    assert [len(long_modules([p])) for p in (long, short)] == [1, 0]
    assert [len(long_functions([p])) for p in (long, short)] == [1, 0]
    assert [len(built_from_dicts([p])) for p in (long, short)] == [1, 0]
