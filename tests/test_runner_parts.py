"""diagnostics/runner/: its parts import one way (job, logs, limits, channel <- worker <- spare_pool <- run), talk
through public names only (no part imports another's ``_private`` name), and the package's re-exports are the
objects its parts own. Also the worker's one walk of a failure's cause chain."""

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


def _private_imports(source: str) -> list[str]:
    """``module.name`` of every private name (leading underscore) that ``source`` imports from a runner part,
    by ``from diagnostics.runner.x import _y`` or read as an attribute of an imported part (``x._y``)."""
    found, parts = [], {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("diagnostics.runner"):
            for a in node.names:
                if node.module == "diagnostics.runner":  # ``from diagnostics.runner import run``: a part, by name
                    parts[a.asname or a.name] = a.name
                elif a.name.startswith("_"):
                    found.append(f"{node.module.split('.')[-1]}.{a.name}")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("diagnostics.runner.") and a.asname:
                    parts[a.asname] = a.name.split(".")[2]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in parts \
                and node.attr.startswith("_") and not node.attr.startswith("__"):
            found.append(f"{parts[node.value.id]}.{node.attr}")
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__") \
                and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name) \
                and node.value.func.id == "spares":  # the pool's own state, reached through its accessor
            found.append(f"spare_pool.SparePool.{node.attr}")
    return found


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


def test_no_part_imports_another_parts_private_names():
    found = {path.stem: _private_imports(path.read_text()) for path in PACKAGE.glob("*.py")}
    assert {part: names for part, names in found.items() if names} == {}


def test_the_private_name_check_sees_planted_imports():
    planted = ("from diagnostics.runner.limits import MemoryWatch, _kill\n"
               "from diagnostics.runner import spare_pool\n"
               "import diagnostics.runner.logs as logs\n"
               "spare_pool._POOL.take(); logs._open_log; spares()._torch_threads = 1; x.__class__\n")
    assert sorted(_private_imports(planted)) == ["limits._kill", "logs._open_log", "spare_pool.SparePool._torch_threads",
                                                 "spare_pool._POOL"]


def test_the_cause_chain_is_walked_once_for_every_kind_of_failure():
    import errno

    from diagnostics.runner import worker

    def chained(*excs):
        """excs[0] raised while handling excs[1], ... (each the next one's context); the first returned."""
        for inner, outer in zip(excs[1:], excs[:-1]):
            outer.__context__ = inner
        return excs[0]

    deep = chained(*[RuntimeError(f"wrapper {i}") for i in range(worker.CAUSE_CHAIN_DEPTH - 1)], MemoryError())
    assert worker._is_oom(deep)  # the last exception the walk reaches
    too_deep = chained(*[RuntimeError(f"wrapper {i}") for i in range(worker.CAUSE_CHAIN_DEPTH)], MemoryError())
    assert not worker._is_oom(too_deep)  # one past it
    assert len(list(worker._cause_chain(deep))) == worker.CAUSE_CHAIN_DEPTH
    looped = RuntimeError("a")
    looped.__context__ = RuntimeError("b", )
    looped.__context__.__context__ = looped  # a chain that loops ends at the depth
    assert [str(e) for e in worker._cause_chain(looped)] == ["a", "b"] * (worker.CAUSE_CHAIN_DEPTH // 2)
    # __cause__ wins over __context__: "raise X from Y" names what caused it
    caused = RuntimeError("wrapped")
    caused.__cause__, caused.__context__ = OSError(errno.EFBIG, "File too large"), MemoryError()
    assert worker._is_file_too_big(caused) and not worker._is_oom(caused)
    assert worker._is_gpu_oom(chained(ValueError("x"), RuntimeError("CUDA out of memory. Tried to allocate 2 GiB")))
    assert worker._is_oom(chained(ValueError("x"), RuntimeError("CUDA out of memory.")))
    assert not worker._is_gpu_oom(chained(ValueError("x"), MemoryError("cannot allocate memory")))
    assert worker._is_oom(chained(ValueError("x"), OSError("Cannot allocate memory")))
    assert not worker._is_file_too_big(OSError(errno.ENOSPC, "No space left on device"))


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


def test_a_native_crash_tail_keeps_faulthandlers_header_and_stack_not_the_module_list():
    """A segfault's report ends with ~70 extension module names (1,300 characters): the last 2,000 characters
    of the log had lost "Fatal Python error" and the crashing frame. The tail is the report from its header,
    the module list said in one line, after what the model printed just before."""
    from diagnostics.runner.logs import LOG_TAIL_CHARS, fatal_report

    names = ", ".join(f"torch._C._mod{i}" for i in range(70))
    log = ("sandbox: on\n" + "noise\n" * 500 + "about to crash\nFatal Python error: Segmentation fault\n\n"
           "Current thread 0x1 (most recent call first):\n  File \"/m/fault.py\", line 11 in forward\n\n"
           f"Extension modules: {names} (total: 70)\n")
    tail = fatal_report(log)
    assert tail.index("about to crash") < tail.index("Fatal Python error: Segmentation fault")
    assert 'File "/m/fault.py", line 11 in forward' in tail
    assert tail.rstrip().endswith("Extension modules: 70 (names left out)") and "_mod69" not in tail
    assert len(tail) <= LOG_TAIL_CHARS
    assert fatal_report("Traceback (most recent call last):\n  ValueError: x\n") == ""  # not a native crash
    long = "Fatal Python error: Aborted\n" + "  File \"x.py\", line 1 in f\n" * 500
    assert len(fatal_report(long)) <= LOG_TAIL_CHARS and fatal_report(long).startswith("Fatal Python error: Aborted")
