"""Invariants that hold on every trace: our samples, the public corpus (tests/data/traces/public) and the
generated ones. One step time across views (each figure labelled with what it spans), every long wait
on a critical path explained, no negative time anywhere in the communication split (issue #31)."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnostics.trace import load_trace, temporal_breakdown
from diagnostics.trace.comm import rank_breakdown
from diagnostics.trace.critical_path import EXPLAIN_SHARE, critical_path
from diagnostics.trace.errors import TraceError
from diagnostics.trace.breakdowns import steps

DATA = Path(__file__).resolve().parents[1] / "data"
TRACES = sorted(str(p.relative_to(DATA)) for p in (DATA / "traces").rglob("*")
                if p.name.endswith((".json", ".json.gz")) and p.name != "hta_reference.json") \
    + sorted(str(p.relative_to(DATA)) for p in (DATA / "distributed" / "pair").glob("*.json"))


def _cp(trace):
    try:
        return critical_path(trace)
    except TraceError as e:
        assert "no profiler step ranges" in str(e)
        return None


@pytest.mark.parametrize("rel", TRACES)
def test_one_step_time_across_views(rel):
    """The critical path's CPU step is the Steps table's, its GPU window is the per-step GPU figures',
    its length is its step time (to the end of the last GPU work), and when that is longer than the CPU
    step a note says what each spans, with both figures."""
    trace = load_trace(DATA / rel)
    cp = _cp(trace)
    if cp is None:
        return
    table = steps(trace).set_index("step")["dur_us"]
    assert cp["host_span_us"] == pytest.approx(float(table[cp["step"]]), abs=1e-6)
    windows = {r["step"]: r["window_us"] for r in temporal_breakdown(trace)["gpu"]}
    assert cp["gpu_window_us"] == (pytest.approx(windows[cp["step"]]) if cp["step"] in windows else None)
    assert cp["length_us"] == pytest.approx(cp["step_us"], rel=1e-9, abs=1e-6)
    assert sum(r["us"] for r in cp["by_kind"]) == pytest.approx(cp["step_us"], rel=1e-9, abs=1e-6)
    assert all(r["us"] >= 0 for r in cp["by_kind"])
    if cp["step_us"] > cp["host_span_us"] * 1.01 + 1.0:
        said = " ".join(cp["notes"])
        assert f"{cp['step_us'] / 1e3:,.3f} ms" in said and f"{cp['host_span_us'] / 1e3:,.3f} ms" in said, cp["notes"]
        assert "CPU step" in said


@pytest.mark.parametrize("rel", TRACES)
def test_every_long_wait_on_a_critical_path_is_explained(rel):
    """A wait on the path (the GPU busy with earlier steps, a stream idle, a thread starting late) longer
    than EXPLAIN_SHARE of the step has a note saying what it waited for; and no idle-wait is as long as
    the step's CPU time (the reported 90.7 ms "idle-wait" of a 95.7 ms step)."""
    trace = load_trace(DATA / rel)
    cp = _cp(trace)
    if cp is None:
        return
    kinds = {r["kind"]: r["us"] for r in cp["by_kind"]}
    waits = [r for r in cp["path"] if r["wait_before_us"] > EXPLAIN_SHARE * cp["step_us"]
             and ("before the step" in r["waited_on"] or " gap)" in r["waited_on"]
                  or "first call" in r["waited_on"])]
    explained = [n for n in cp["notes"] if "% of the step)" in n]
    assert len(explained) >= len(waits), (waits, cp["notes"])
    assert kinds["idle-wait"] < 0.9 * cp["host_span_us"] or any("idle" in n for n in explained), cp["notes"]


def test_the_reported_step_reads_its_cpu_step_and_why_the_path_is_longer():
    """HTA's ns_resolution capture, step 103: the Steps table's 95.7 ms, the path's 185.2 ms, of which
    89.6 ms is the GPU finishing step 102's work (labelled, not "idle-wait")."""
    cp = critical_path(load_trace(DATA / "traces" / "public" / "hta" / "ns_resolution_rank0.json.gz"))
    kinds = {r["kind"]: r["us"] for r in cp["by_kind"]}
    assert cp["step"] == 103
    assert cp["host_span_us"] == pytest.approx(95697.341) and cp["step_us"] == pytest.approx(185191.573)
    assert cp["gpu_window_us"] == pytest.approx(95570.75)
    assert kinds["earlier-steps"] == pytest.approx(89621.75) and kinds["idle-wait"] < 1200
    assert any("busy with earlier steps, not idle" in n for n in cp["notes"])
    assert any("0.9 steps behind the CPU" in n for n in cp["notes"])


@pytest.mark.parametrize("rel", TRACES)
def test_the_communication_split_is_never_negative(rel):
    """Per step: computation, communication, their overlap, exposed communication, other and busy time
    are all >= 0 and the overlap is at most each side (the Distributed view's columns, its "Hidden" share
    = overlap / communication in [0, 1])."""
    b = rank_breakdown(load_trace(DATA / rel))
    for s in b["steps"]:
        for key, v in s.items():
            if key.endswith("_ms"):
                assert v >= 0.0, (s["step"], key, v)
        assert s["overlap_ms"] <= min(s["comm_ms"], s["compute_ms"]) + 1e-9
        assert s["exposed_comm_ms"] + s["overlap_ms"] == pytest.approx(s["comm_ms"], abs=1e-9)
        if s["comm_ms"]:
            assert 0.0 <= s["overlap_ms"] / s["comm_ms"] <= 1.0
    assert all(c["dur_ms"] >= 0 for c in b["calls"])


def test_the_distributed_analysis_of_two_public_ranks_has_no_negative_figure(tmp_path):
    from diagnostics.analyses.distributed.job import analyze_folder_path

    result = analyze_folder_path(DATA / "traces" / "public" / "hta" / "multi_rank")
    for row in result["ranks"] + result["steps"]:
        for key, v in row.items():
            if key.endswith(("_ms", "_ratio")) and v is not None:
                assert v >= 0.0, (row.get("rank"), key, v)
    assert 0.0 <= result["metrics"]["overlap_ratio"] <= 1.0
    assert {c["family"] for c in result["collectives"] if c["where"] == "GPU"} == {"NCCL"}
