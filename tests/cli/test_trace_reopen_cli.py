"""``trace analyze`` a second time (issue #42, item 5): the stored result answered in the CLI's own process,
no worker started, the same result as the first open, the run recorded like any other."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from diagnostics.store import Store

TRACE = Path(__file__).resolve().parents[1] / "data" / "traces" / "gpu_small.json"
#: What a reopen reports of itself, not of the trace: how the open went and where its files are.
OWN = ("trace_cache",)


def _analyze(capsys, trace: Path, store: Path, *extra: str) -> dict:
    from diagnostics.cli.main import main

    assert main(["trace", "analyze", str(trace), "--json", "--no-report", "-q", "--data-dir", str(store),
                 *extra]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def opened(tmp_path, monkeypatch, capsys):
    """A trace opened once through the worker: (trace, store folder, first result)."""
    monkeypatch.setenv("TORCHSCOPE_DATA_DIR", str(tmp_path / "store"))
    trace = tmp_path / "gpu_small.json"
    shutil.copyfile(TRACE, trace)
    first = _analyze(capsys, trace, tmp_path / "store")
    assert first["trace_cache"]["hit"] is False and "result" not in first["trace_cache"]
    return trace, tmp_path / "store", first


def _no_worker(monkeypatch) -> list:
    import diagnostics.runner

    started = []
    monkeypatch.setattr(diagnostics.runner, "run_job", lambda *a, **k: started.append(a) or pytest.fail("a worker"))
    return started


def test_a_reopen_starts_no_worker_and_returns_the_first_result(opened, monkeypatch, capsys):
    trace, store, first = opened
    started = _no_worker(monkeypatch)
    second = _analyze(capsys, trace, store)
    assert started == []
    assert second["trace_cache"]["hit"] is True and second["trace_cache"]["result"] is True
    assert 0 <= second["trace_cache"]["open_s"] < 5
    # the critical path's trace is the first run's file, linked into the second run's own folder
    a, b = first["critical_path"].pop("trace_file"), second["critical_path"].pop("trace_file")
    assert Path(a).parent != Path(b).parent and Path(b).read_bytes() == Path(a).read_bytes()
    assert {k: v for k, v in second.items() if k not in OWN} == {k: v for k, v in first.items() if k not in OWN}
    # recorded like the first: two runs of the CLI, the second's stored result the one shown
    runs = Store(store).list(analysis="trace")
    assert [(r.source, r.status) for r in runs] == [("cli", "ok")] * 2
    assert runs[0].model_label == runs[1].model_label == f"{trace.parent.name[:24]}/gpu_small.json"
    kept = Store(store).get(runs[0].id)
    assert kept.result["summary"] == first["summary"] and kept.result["trace_cache"]["result"] is True
    assert Path(b).name in kept.artifacts


def test_other_options_or_a_touched_file_run_the_job(opened, monkeypatch, capsys):
    """No stored answer: nothing recorded by the in-process look-up, the job runs in a worker."""
    from diagnostics.cli.trace import stored_outcome

    trace, store, first = opened
    s = Store(store)
    path = str(trace.resolve())
    stamp = {"path": path, "size": trace.stat().st_size, "mtime_ns": trace.stat().st_mtime_ns}
    assert stored_outcome("trace", {"path": path, "stamp": stamp}, s).ok
    n = len(s.list())
    assert stored_outcome("trace", {"path": path, "stamp": stamp, "top": 30}, s) is None
    assert stored_outcome("trace_diff", {"before": path, "after": path}, s) is None
    assert stored_outcome("trace", {"path": path, "stamp": stamp, "top": "many"}, s) is None  # the runner says why
    st = os.stat(trace)
    os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns + 1000))
    assert stored_outcome("trace", {"path": path, "stamp": stamp}, s) is None
    assert len(s.list()) == n
    assert _analyze(capsys, trace, store)["trace_cache"].get("result") is None   # the worker ran it again
