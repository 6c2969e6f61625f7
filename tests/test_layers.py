"""Who may import whom inside the engine (docs/ARCHITECTURE.md), read from the source with ast.

Bottom to top: the base (errors, units, significance, spec, declare, settings, store, uploads), the trace layer,
the measure layer, the analyses (each on the layers below, never on another analysis), and on top
the registry, runner, rendering and CLI. Imports inside functions count too: a late import is
still a dependency.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "diagnostics"


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}  # "from pkg import module"
    return out


MODULES = {_module(p): _imports(p) for p in sorted(ENGINE.rglob("*.py"))}


def unit(module: str) -> str:
    """The part of the engine a module belongs to: diagnostics.<layer>, or one analysis."""
    parts = module.split(".")
    if len(parts) >= 3 and parts[1] == "analyses":
        return ".".join(parts[:3])
    return ".".join(parts[:2])


def _engine_imports(module: str) -> set[str]:
    return {m for m in MODULES[module] if m == "diagnostics" or m.startswith("diagnostics.")}


def _units_imported(module: str) -> set[str]:
    return {unit(m) for m in _engine_imports(module) if unit(m) in {unit(k) for k in MODULES}} - {unit(module)}


def _violations(prefix: str, allowed: set[str]) -> list[str]:
    bad = []
    for module in MODULES:
        if module == prefix or module.startswith(prefix + "."):
            for u in sorted(_units_imported(module) - allowed):
                bad.append(f"{module} imports {u}")
    return bad


#: diagnostics.significance: how many rounds an interval needs (the comparisons' statistics, torch-free: a page says it)
BASE = {"diagnostics.errors", "diagnostics.units", "diagnostics.significance"}
#: diagnostics.inputs: how a model is called with its inputs (positional and keyword), beside intake;
#: diagnostics.devices: the machine's facts (cores, torch's threads), read once for every view;
#: diagnostics.results: Record, which the layer's typed facts (measure/records.py) derive from, as the trace's do
MEASURE_MAY_USE = BASE | {"diagnostics.trace", "diagnostics.inputs", "diagnostics.tensors", "diagnostics.devices",
                          "diagnostics.results"}
#: The model layer (a model, its inputs, what its tensors hold) stands below measuring and tracing.
MODEL_LAYER = ("diagnostics.inputs", "diagnostics.intake", "diagnostics.weights", "diagnostics.hf", "diagnostics.tensors")


def test_the_module_list_is_read():
    assert "diagnostics.trace.model" in MODULES and "diagnostics.measure.timer" in MODULES
    assert "diagnostics.analyses.profile.job" in MODULES and len(MODULES) > 60


#: The trace layer's records (diagnostics.trace.records) are typed results' parts: Record and the units of their
#: columns (layer 1, no torch). diagnostics.devices: the machine's cores, read in one place (the ranks' local pool
#: is bounded by them); diagnostics.settings: the one environment-number parser (the trace cache's size). Both are
#: layer 1 and torch-free at import (test_the_trace_layer_imports_no_torch).
TRACE_MAY_USE = BASE | {"diagnostics.results", "diagnostics.declare", "diagnostics.devices", "diagnostics.settings"}


def test_the_trace_layer_stands_on_the_base_only():
    assert _violations("diagnostics.trace", TRACE_MAY_USE) == []


def test_the_trace_layer_imports_no_torch():
    """"No torch: it reads files", also through the layer-1 modules it may read (devices, settings)."""
    import subprocess
    import sys

    code = ("import sys, pkgutil, importlib, diagnostics.trace as t\n"
            "for m in pkgutil.walk_packages(t.__path__, 'diagnostics.trace.'):\n"
            "    importlib.import_module(m.name)\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.stdout.split() == ["False"], out.stderr[-2000:]


def test_the_model_layer_never_reaches_up_to_measuring_tracing_or_the_analyses():
    above = ("diagnostics.measure", "diagnostics.trace", "diagnostics.analyses", "diagnostics.runner",
             "diagnostics.render", "diagnostics.cli")
    bad = [f"{m} imports {i}" for layer in MODEL_LAYER for m in MODULES if m == layer
           for i in _engine_imports(m) if i.startswith(above)]
    assert bad == []


def test_the_measure_layer_stands_on_the_trace_layer_and_the_base_only():
    assert _violations("diagnostics.measure", MEASURE_MAY_USE) == []


@pytest.mark.parametrize("analysis", sorted({unit(m) for m in MODULES if m.startswith("diagnostics.analyses.")}))
def test_an_analysis_never_imports_another_or_anything_above_it(analysis):
    # diagnostics.devices: layer 1 (device facts by NVML), which the plan reads for the local GPU's memory
    below = BASE | {"diagnostics.trace", "diagnostics.measure", "diagnostics.declare", "diagnostics.spec",
                    "diagnostics.findings",
                    "diagnostics.intake", "diagnostics.inputs", "diagnostics.tensors", "diagnostics.settings",
                    "diagnostics.uploads",
                    "diagnostics.devices", "diagnostics.results"}
    assert _violations(analysis, below) == []


def test_rendering_reads_results_and_declarations_never_the_jobs_or_the_measure_layer():
    bad = [f"{m} imports {i}" for m in MODULES if m.startswith("diagnostics.render")
           for i in _engine_imports(m)
           if i.endswith(".job") or ".job." in i or unit(i) in {"diagnostics.measure", "diagnostics.runner"}]
    assert bad == []


def test_the_engine_never_imports_streamlit():
    bad = [m for m, imps in MODULES.items() if any(i == "streamlit" or i.startswith("streamlit.") for i in imps)]
    assert bad == []


def test_no_import_cycles_between_the_engines_parts():
    graph: dict[str, set[str]] = defaultdict(set)
    for module in MODULES:
        graph[unit(module)] |= _units_imported(module)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    assert cycles == []


def test_the_checker_sees_a_cycle_and_a_forbidden_import():
    """The rules above can fail: a planted import from measure into an analysis is caught."""
    planted = dict(MODULES)
    planted["diagnostics.measure.timer"] = MODULES["diagnostics.measure.timer"] | {"diagnostics.analyses.profile.job"}
    globals()["MODULES"] = planted
    try:
        assert _violations("diagnostics.measure", MEASURE_MAY_USE) == [
            "diagnostics.measure.timer imports diagnostics.analyses.profile"]
        with pytest.raises(AssertionError):
            test_no_import_cycles_between_the_engines_parts()
    finally:
        globals()["MODULES"] = MODULES_ORIGINAL


MODULES_ORIGINAL = MODULES
