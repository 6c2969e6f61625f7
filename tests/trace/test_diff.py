"""diff_traces on two hand-written traces with a known change (one step each)."""

import json
from pathlib import Path

import pytest

from diagnostics.results import to_plain
from diagnostics.trace import diff_traces, load_trace
from diagnostics.trace.diff import CHANGE_RATIO, NOISE_FLOOR_US

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"


@pytest.fixture(scope="module")
def result():
    return to_plain(diff_traces(load_trace(DATA / "diff_before.json"), load_trace(DATA / "diff_after.json")))


def test_known_changes(result):
    json.dumps(result)
    rows = {r["name"]: r for r in result["rows"]}
    assert {n: r["status"] for n, r in rows.items()} == {
        "aten::mm": "faster", "aten::copy_": "slower", "aten::add": "removed",
        "aten::relu": "added", "aten::view": "unchanged"}
    mm = rows["aten::mm"]
    assert (mm["calls_before"], mm["time_us_before"], mm["time_us_after"]) == (2, 40.0, 20.0)
    assert mm["delta_us"] == -20.0 and mm["ratio"] == 0.5
    assert rows["aten::copy_"]["ratio"] == 3.0
    assert rows["aten::relu"]["ratio"] is None and rows["aten::relu"]["time_us_after"] == 5.0
    assert result["counts"] == {"added": 1, "removed": 1, "faster": 1, "slower": 1,
                                "unchanged": 1}
    assert (result["time_us_before"], result["time_us_after"]) == (61.0, 56.0)
    assert result["unit"] == "per step"
    # largest change first
    assert [r["name"] for r in result["rows"]][:2] == ["aten::copy_", "aten::mm"]


def test_thresholds_are_named():
    assert CHANGE_RATIO == 0.10 and NOISE_FLOOR_US == 1.0


def test_gpu_trace_against_itself_is_unchanged():
    t = load_trace(DATA / "gpu_small.json")
    r = diff_traces(t, t)
    assert r.counts.unchanged == len(r.rows) == 9   # 4 operators + 5 GPU kinds
    kinds = {row.kind for row in r.rows}
    assert kinds == {"cpu_op", "gpu"}


def test_per_step_gpu_time_leaves_out_work_queued_before_profiling_as_analyze_does():
    """Issue #42: `trace diff`'s per-step GPU time counted 13.7 ms queued before profiling that `analyze`
    leaves out. TraceLens' MI300 trace has such work (HTA keeps it): the diff's GPU time per step is the
    GPU time of the events the step figures attribute to a step, the rest reported as left out."""
    from diagnostics.trace import temporal_breakdown

    t = load_trace(DATA / "public" / "tracelens" / "mi300_resnet_rccl_no_pyfn.json.gz")
    r = to_plain(diff_traces(t, t))
    att = to_plain(temporal_breakdown(t))["attribution"]
    assert att["before_profiling_us"] > 0 and r["unit"] == "per step"
    assert r["left_out_before"] == {"before_profiling_us": pytest.approx(att["before_profiling_us"]),
                                    "outside_steps_us": pytest.approx(att["outside_steps_us"])}
    ev = t.events
    gpu = t.cat_mask(frozenset({"kernel", "gpu_memcpy", "gpu_memset"})) & t.complete_mask()
    all_gpu_us = float(ev["dur"].to_numpy()[gpu].sum())
    gpu_rows = [row for row in r["rows"] if row["kind"] == "gpu"]
    n = r["steps_before"]
    assert sum(row["time_us_before"] for row in gpu_rows) == pytest.approx(
        (all_gpu_us - att["before_profiling_us"] - att["outside_steps_us"]) / n)
