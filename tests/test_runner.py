"""The runner executes analyses in a worker process and turns failures into messages."""

import textwrap

from diagnostics import ModelSpec
from diagnostics.registry import get_analysis
from diagnostics.results import decode, to_plain
from diagnostics.runner import Job, run_job
from diagnostics.store import Store


def test_summary_runs_in_a_worker_and_is_stored(tmp_path):
    store = Store(tmp_path)
    seen = []
    out = run_job(Job("summary", ModelSpec(name="mlp")), store=store, on_progress=lambda f, m: seen.append(m))
    assert out.ok, out.error
    assert out.result.metrics.params_total == 64 * 128 + 128 + 128 * 128 + 128 + 128 * 10 + 10
    assert "loading model" in seen
    rec = store.get(out.run_id)
    # the store keeps the plain form of the typed result, which decodes back to it
    assert rec.status == "ok" and rec.result == to_plain(out.result)
    assert decode(get_analysis("summary"), rec.result) == out.result
    assert "worker.log" in rec.artifacts


def test_model_error_is_reported(tmp_path):
    out = run_job(Job("summary", ModelSpec(name="mlp", inputs=(__import__("diagnostics").InputSpec((2, 3)),))),
                  artifact_dir=tmp_path)
    assert out.status == "error"
    assert "the model rejected its inputs" in out.error and "mat1 and mat2" in out.error


def test_hanging_model_times_out(tmp_path):
    py = tmp_path / "hang.py"
    py.write_text(textwrap.dedent("""
        import time, torch
        from torch import nn
        class Hang(nn.Module):
            def forward(self, x):
                time.sleep(600)
        def build_model(): return Hang()
        def example_inputs(): return (torch.zeros(1),)
    """))
    store = Store(tmp_path / "data")
    out = run_job(Job("summary", ModelSpec(source="python", name="hang.py", path=str(py))), timeout_s=8, store=store)
    assert out.status == "timeout" and out.error.startswith("timed out after 8 s")
    assert store.get(out.run_id).status == "timeout"


def test_a_job_may_start_processes_of_its_own(tmp_path):
    """DataLoader workers and torchrun are child processes: the job's worker must not be a daemon."""
    py = tmp_path / "kids.py"
    py.write_text(textwrap.dedent("""
        import multiprocessing as mp, torch
        from torch import nn
        def build_model():
            p = mp.get_context("fork").Process(target=int)
            p.start(); p.join()
            assert p.exitcode == 0
            return nn.Linear(2, 2)
        def example_inputs(): return (torch.zeros(1, 2),)
    """))
    out = run_job(Job("validate", ModelSpec(source="python", name="kids.py", path=str(py))), artifact_dir=tmp_path / "a")
    assert out.ok, out.error


def test_jobs_without_a_model_are_labelled_by_the_files_they_read():
    assert Job("summary", ModelSpec(name="mlp")).label() == "mlp (sample)"
    assert Job("trace", None, {"path": "/data/runs/abc/trace.json.gz"}).label() == "abc/trace.json.gz"
    assert Job("trace_diff", None, {"before": "/t/a.json", "after": "/t/b.json"}).label() == "t/a.json vs t/b.json"
    assert Job("distributed_traces", None, {"trace_dir": "/shared/run1/"}).label() == \
        "shared/run1/ (per-rank traces)"
    assert Job("trace", None, {}).label() is None


def test_a_worker_does_not_rerun_the_callers_main_script(tmp_path, monkeypatch):
    """Under Streamlit __main__ is the page script (no __spec__, a __file__); spawn would run it
    in every worker before the job. A marker file shows whether it ran."""
    import sys
    import types

    marker = tmp_path / "ran"
    script = tmp_path / "page.py"
    script.write_text(f"open({str(marker)!r}, 'w').write('the page ran in the worker')\n")
    fake = types.ModuleType("__main__")
    fake.__file__ = str(script)
    monkeypatch.setitem(sys.modules, "__main__", fake)
    out = run_job(Job("validate", ModelSpec(name="mlp")), artifact_dir=tmp_path / "job")
    assert out.ok, out.error
    assert not marker.exists()
    assert fake.__file__ == str(script)  # put back once the worker has started


def test_the_worker_freezes_what_it_loaded_before_the_job(tmp_path):
    """torch's objects are out of the collector's reach (gc.freeze) before the user's code runs,
    so a full collection inside a timed step scans the job's objects only."""
    py = tmp_path / "frozen.py"
    py.write_text(textwrap.dedent("""
        import gc, torch
        from torch import nn
        FROZEN = gc.get_freeze_count()
        def build_model():
            return nn.Linear(FROZEN, 1)  # the count, read back as the layer's width
        def example_inputs(): return (torch.zeros(1, FROZEN),)
    """))
    out = run_job(Job("summary", ModelSpec(source="python", name="frozen.py", path=str(py))), artifact_dir=tmp_path / "a")
    assert out.ok, out.error
    frozen = out.result.metrics.params_total - 1  # weight FROZEN x 1, bias 1
    assert frozen > 100_000, frozen  # importing torch alone makes ~170k tracked objects
