"""diagnostics/runner/: its parts import one way (job, logs, limits, channel <- worker <- spare_pool <- run), and
the package's re-exports are the objects its parts own."""

from __future__ import annotations

import ast
from pathlib import Path

import diagnostics.runner as runner

PACKAGE = Path(__file__).resolve().parents[1] / "diagnostics" / "runner"


def _graph() -> dict[str, set[str]]:
    graph = {}
    for path in PACKAGE.glob("*.py"):
        if path.stem == "__init__":
            continue
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            deps |= {n.split(".")[2] for n in names if n.startswith("diagnostics.runner.")}
        graph[path.stem] = deps - {path.stem}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle among the parts (its modules in order), or []."""
    state: dict[str, int] = {}  # 1: on the path now, 2: done

    def visit(v: str, path: list[str]) -> list[str]:
        state[v] = 1
        for w in sorted(graph.get(v, ())):
            if state.get(w) == 1:
                return path[path.index(w):] + [w]
            if w not in state:
                found = visit(w, path + [w])
                if found:
                    return found
        state[v] = 2
        return []

    for v in sorted(graph):
        if v not in state:
            found = visit(v, [v])
            if found:
                return found
    return []


def test_the_runners_parts_import_one_way():
    graph = _graph()
    assert set(graph) == {"job", "logs", "limits", "channel", "worker", "spare_pool", "device_lock", "run"}
    assert _cycle(graph) == []
    assert graph["job"] == graph["logs"] == graph["limits"] == graph["channel"] == set()  # the bottom: nothing of the runner's


def test_the_cycle_check_sees_a_planted_cycle():
    graph = _graph()
    graph["job"] = {"run"}
    assert _cycle(graph)[0] == _cycle(graph)[-1] and "run" in _cycle(graph)


def test_the_package_names_are_its_parts_objects():
    from diagnostics.runner import job, run, spare_pool

    assert runner.run_job is run.run_job and runner.Job is job.Job and runner.execute is job.execute
    assert runner.keep_spares is spare_pool.keep_spares and runner.spares() is spare_pool._POOL
    for name in runner.__all__:
        assert getattr(runner, name) is not None, name
