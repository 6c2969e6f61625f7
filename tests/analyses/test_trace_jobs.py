"""Trace explorer jobs through the runner: open, recompute a part (a range, another step's critical path)
from the kept columns, diff; errors by message."""

import gzip
import json
from pathlib import Path

import pytest

from diagnostics.analyses.trace.result import TraceCriticalPathResult, TraceResult
from diagnostics.results import to_plain
from diagnostics.runner import Job, run_job
from diagnostics.store import Store
from diagnostics.trace import load_trace, summary, top_operators

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"


@pytest.fixture(scope="module")
def opened(tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("data"))
    out = run_job(Job("trace", None, {"path": str(DATA / "gpu_small.json")}), store=store)
    assert out.ok, out.error
    return store, out


def test_open_matches_the_engine_run_in_process(opened):
    _store, out = opened
    trace = load_trace(DATA / "gpu_small.json")
    assert isinstance(out.result, TraceResult)
    assert out.result.summary.events == summary(trace).events
    assert to_plain(out.result.top_operators.kernels) == to_plain(top_operators(trace, n=20).kernels)
    assert out.result.summary.has_gpu is True
    assert out.result.metrics.events == len(trace.events)


def test_timeline_range_requery_reads_kept_columns(opened):
    _store, out = opened
    full = out.result.timeline
    mid = (full.t0 + full.t1) / 2
    part = run_job(Job("trace_timeline", None, {"columns_dir": out.result.columns_dir, "t0": full.t0, "t1": mid}))
    assert part.ok, part.error
    tl = part.result.timeline
    assert tl.t1 == pytest.approx(mid)
    assert tl.in_range <= full.in_range
    assert all(e.start_us <= mid for e in tl.events)


def test_another_steps_critical_path_is_recomputed_from_the_kept_columns(tmp_path):
    """The part job reads the columns a trace run kept: the same path as the whole trace job computes for
    that step, without the trace file (moved away here) and without a second trace run in the store."""
    from tests.trace.test_critical_path import CPU_STEP, GPU_STEP, write

    store = Store(tmp_path / "data")
    path = write(tmp_path, CPU_STEP + GPU_STEP)
    first = run_job(Job("trace", None, {"path": str(path)}), store=store)
    assert first.ok, first.error
    assert first.result.critical_path.step == 1   # the longest step by default
    whole = run_job(Job("trace", None, {"path": str(path), "critical_path_step": 0}), store=Store(tmp_path / "other"))
    assert whole.ok, whole.error
    path.rename(tmp_path / "moved.json")   # the part never reads the file
    part = run_job(Job("trace_critical_path", None, {"columns_dir": first.result.columns_dir,
                                                    "critical_path_step": 0}), store=store)
    assert part.ok, part.error
    assert isinstance(part.result, TraceCriticalPathResult)
    cp, expected = part.result.critical_path, whole.result.critical_path
    assert cp.step == 0 and cp.length_us == pytest.approx(300.0)
    assert [(e.name, e.on_path_us) for e in cp.path] == [(e.name, e.on_path_us) for e in expected.path]
    assert to_plain(cp.by_kind) == to_plain(expected.by_kind) and to_plain(cp.what_if) == to_plain(expected.what_if)
    assert Path(cp.trace_file).parent == Path(part.artifact_dir)   # its own exported step trace
    assert [r.analysis for r in store.list()] == ["trace_critical_path", "trace"]
    bad = run_job(Job("trace_critical_path", None, {"columns_dir": first.result.columns_dir,
                                                   "critical_path_step": 7}), store=store)
    assert bad.status == "error" and bad.error.startswith("option critical_path_step: ")
    gone = run_job(Job("trace_critical_path", None, {"columns_dir": str(tmp_path), "critical_path_step": 0}))
    assert gone.status == "error" and "no parsed trace kept in" in gone.error


def test_diff_of_two_traces():
    out = run_job(Job("trace_diff", None, {"before": str(DATA / "diff_before.json"),
                                           "after": str(DATA / "diff_after.json")}))
    assert out.ok, out.error
    counts = to_plain(out.result.diff.counts)
    assert sum(counts.values()) == len(out.result.diff.rows)
    assert to_plain(out.result.metrics) == counts


def test_missing_and_broken_traces_are_named(tmp_path):
    out = run_job(Job("trace", None, {"path": str(tmp_path / "nope.json")}))
    assert out.status == "error" and "trace file not found" in out.error
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(b"this is not gzip")
    out = run_job(Job("trace", None, {"path": str(bad)}))
    assert out.status == "error" and "gzip" in out.error.lower()
    cut = tmp_path / "cut.json"
    cut.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2, "pid": 1, "tid": 1}] * 50})[:300])
    out = run_job(Job("trace", None, {"path": str(cut)}))
    assert out.status == "error" and "truncated" in out.error.lower()


def test_a_bad_row_count_is_refused_before_the_trace_is_read(tmp_path):
    from diagnostics.runner import execute

    path = tmp_path / "never_read.json"
    path.write_text("not JSON")  # reading it would fail with another message
    with pytest.raises(Exception, match=r"^option top: must be an integer from 1 to 100000, got 0$"):
        execute(Job("trace", None, {"path": str(path), "top": 0}), tmp_path)


def test_a_second_open_of_an_unchanged_trace_reads_the_trace_cache(tmp_path, monkeypatch):
    from diagnostics.settings import trace_cache_dir

    monkeypatch.setenv("TORCHSCOPE_DATA_DIR", str(tmp_path / "data"))  # the worker inherits it
    path = tmp_path / "gpu.json"
    path.write_bytes((DATA / "gpu_small.json").read_bytes())
    first = run_job(Job("trace", None, {"path": str(path), "top": 5}))
    second = run_job(Job("trace", None, {"path": str(path), "top": 6}))  # another job, the same file
    assert first.ok and second.ok, (first.error, second.error)
    assert first.result.trace_cache.hit is False and second.result.trace_cache.hit is True
    assert second.result.summary == first.result.summary
    assert second.result.temporal_breakdown == first.result.temporal_breakdown
    [entry] = list(trace_cache_dir().iterdir())  # written by the (sandboxed) worker
    # The columns kept beside each run are the cache entry's file, linked, not written again ...
    for out in (first, second):
        kept = Path(out.result.columns_dir) / "events.feather"
        assert kept.stat().st_ino == (entry / "events.feather").stat().st_ino
    # ... and a timeline re-draw reads them.
    tl = run_job(Job("trace_timeline", None, {"columns_dir": second.result.columns_dir}))
    assert tl.ok, tl.error
    assert tl.result.timeline == first.result.timeline
    diff = run_job(Job("trace_diff", None, {"before": str(path), "after": str(DATA / "diff_after.json")}))
    assert diff.ok, diff.error
    assert diff.result.trace_cache.before.hit is True


#: The trace job's parts as job.py calls them: the file's read, and each part's function (module, name).
_JOB = "diagnostics.analyses.trace.job"
_HTA = "diagnostics.trace.gpu_activity"
PARTS = [(_JOB, "_open"), (_JOB, "communication"), (_JOB, "summary"), (_JOB, "temporal_breakdown"),
         (_JOB, "top_operators"), (_JOB, "idle_time"), (_JOB, "launch_stats"), (_HTA, "kernel_sequences"),
         (_HTA, "queue_length"), (_HTA, "memcpy_bandwidth"), (_HTA, "annotations"), (_HTA, "launch_delay"),
         (_HTA, "comm_overlap"), (_JOB, "critical_path_result"), (_JOB, "timeline_data"), (_JOB, "load_columns")]


def _count_parts(monkeypatch) -> dict:
    """Wrap each of PARTS to count its calls (in this process: runner.execute runs the job here)."""
    import importlib
    from collections import Counter

    calls: Counter = Counter()

    def counting(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    for module, name in PARTS:
        mod = importlib.import_module(module)
        monkeypatch.setattr(mod, name, counting(name, getattr(mod, name)))
    return calls


def test_a_recomputed_part_runs_that_part_alone_and_equals_a_full_run_with_its_option(tmp_path, monkeypatch):
    """Issue #32: the page recomputes one part of the trace analysis (another step's critical path, another
    timeline window) from the columns the trace run kept. Counted: the part job calls that part's function
    once and none of the other parts, nor reads the file; what it returns is what the whole trace job gives
    with that option. On HTA's public rank-0 trace (tests/data/traces/public/README.md)."""
    import msgspec

    from diagnostics.results import UNSET
    from diagnostics.runner import execute

    monkeypatch.setenv("TORCHSCOPE_DATA_DIR", str(tmp_path / "data"))   # no stored result of an earlier test
    path = str(DATA / "public" / "hta" / "multi_rank" / "rank-0.json.gz")
    calls = _count_parts(monkeypatch)
    first = execute(Job("trace", None, {"path": path}), tmp_path / "first")
    # the counters see every part of a whole run (each once; nothing read back from kept columns)
    assert dict(calls) == {name: 1 for _, name in PARTS if name != "load_columns"}
    assert [s.step for s in first.summary.steps] == [551, 552] and first.critical_path.step == 552

    calls.clear()
    part = execute(Job("trace_critical_path", None, {"columns_dir": first.columns_dir, "critical_path_step": 551}),
                   tmp_path / "part")
    assert dict(calls) == {"load_columns": 1, "critical_path_result": 1}
    calls.clear()
    whole = execute(Job("trace", None, {"path": path, "critical_path_step": 551}), tmp_path / "whole")
    assert calls["critical_path_result"] == 1 and calls["summary"] == 1   # computed again, not a stored result
    cp, expected = part.critical_path, whole.critical_path
    assert cp.step == 551 and cp.available and cp.length_us > 0 and cp.path
    assert msgspec.structs.replace(cp, trace_file=UNSET) == msgspec.structs.replace(expected, trace_file=UNSET)
    assert Path(cp.trace_file).parent == tmp_path / "part"   # its own exported step, the same as the whole job's
    assert json.loads(Path(cp.trace_file).read_text()) == json.loads(Path(expected.trace_file).read_text())

    t0, t1 = first.timeline.t0, (first.timeline.t0 + first.timeline.t1) / 2
    calls.clear()
    window = execute(Job("trace_timeline", None, {"columns_dir": first.columns_dir, "t0": t0, "t1": t1}),
                     tmp_path / "window")
    assert dict(calls) == {"load_columns": 1, "timeline_data": 1}
    whole = execute(Job("trace", None, {"path": path, "t0": t0, "t1": t1}), tmp_path / "whole-window")
    assert window.timeline == whole.timeline
    assert 0 < window.timeline.in_range < first.timeline.in_range and window.timeline.t1 == pytest.approx(t1)


def test_the_summary_is_sent_as_a_partial_result_before_the_other_views(tmp_path, monkeypatch):
    """Issue #42's first answer: the trace job reports the Summary (its declared partial type) as soon as it is
    computed, before the critical path and the timeline; it equals the final result's and the engine's own."""
    from diagnostics.analyses.trace.result import TracePartial
    from diagnostics.runner import execute

    monkeypatch.setenv("TORCHSCOPE_DATA_DIR", str(tmp_path / "data"))   # a trace cache of its own: no reopen
    log = []
    path = DATA / "gpu_small.json"
    result = execute(Job("trace", None, {"path": str(path)}), tmp_path / "art",
                     progress=lambda f, m: log.append(("progress", m)), partial=lambda p: log.append(("partial", p)))
    sent = [p for kind, p in log if kind == "partial"]
    assert len(sent) == 1 and isinstance(sent[0], TracePartial)
    assert sent[0].path == str(path) and sent[0].name == "gpu_small.json"
    assert to_plain(sent[0].summary) == to_plain(result.summary) == to_plain(summary(load_trace(path)))
    order = [p if kind == "progress" else "<partial>" for kind, p in log]
    assert order.index("<partial>") < order.index("critical path") < order.index("timeline")


def test_a_worker_sends_the_summary_partial_through_its_pipe(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHSCOPE_DATA_DIR", str(tmp_path / "data"))   # a trace cache of its own: no reopen
    got = []
    out = run_job(Job("trace", None, {"path": str(DATA / "gpu_small.json")}), store=Store(tmp_path / "data"),
                  on_partial=got.append)
    assert out.ok, out.error
    assert len(got) == 1 and to_plain(got[0].summary) == to_plain(out.result.summary)
