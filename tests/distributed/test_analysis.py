"""The per-rank breakdown, collective table and straggler test on a hand-made 2-rank trace pair.

tests/data/distributed/make_pair.py writes the pair. Worked by hand (microseconds):

rank 0, step 1 [1000, 2000): compute = addmm [1100,1300] + mm [1700,1900] = 400 (relu nests in
  addmm; copy_ runs inside the thread's own c10d::allreduce_, so it is not compute);
  comm = c10d [1400,1450] U gloo [1420,1800] = [1400,1800] = 400; overlap = [1700,1800] = 100;
  other = 1000 - (400 + 400 - 100) = 300; exposed comm = 300; busy = 1000 - 300 = 700.
rank 0, step 2 [2000, 3000): compute = addmm 100 + aten::broadcast_tensors 50 = 150;
  comm = [2300,2610] = 310; overlap 0; other = 1000 - 460 = 540; busy = 690.
rank 1, step 1 [11000, 12000): compute = 600 + 100 = 700; comm = [11695,11760] = 65;
  overlap = mm [11740,11840] n gloo [11705,11760] = 20; other = 1000 - 745 = 255; busy = 955.
rank 1, step 2 [12000, 13000): compute 800; comm [12910,12950] = 40; overlap 0; other 160; busy 960.
Median busy: rank 0 695, rank 1 957.5; over ranks 826.25. Stragglers are judged leave-one-out:
rank 1 against rank 0's 695 (threshold 695 + max(margin, floor)), rank 0 against rank 1's 957.5.
"""

import json
import shutil
from pathlib import Path

import pytest

from diagnostics.analyses.distributed import DISTRIBUTED_TRACES, STRAGGLER_MIN_EXCESS_MS
from diagnostics.analyses.distributed.result import DistributedResult
from diagnostics.analyses.distributed.job import analyze_folder_path, find_stragglers
from diagnostics.analyses.distributed.dist_job import DistributedError
from diagnostics.results import decode, to_json
from diagnostics.runner import Job, execute

PAIR = Path(__file__).resolve().parents[1] / "data" / "distributed" / "pair"


@pytest.fixture(scope="module")
def result():
    return analyze_folder_path(PAIR)


def _steps(result, rank):
    return [s for s in result["steps"] if s["rank"] == rank]


@pytest.mark.parametrize("rank,step,expected", [
    (0, 1, dict(compute_ms=0.400, comm_ms=0.400, overlap_ms=0.100, other_ms=0.300, exposed_comm_ms=0.300,
                busy_ms=0.700, step_ms=1.0)),
    (0, 2, dict(compute_ms=0.150, comm_ms=0.310, overlap_ms=0.0, other_ms=0.540, exposed_comm_ms=0.310,
                busy_ms=0.690, step_ms=1.0)),
    (1, 1, dict(compute_ms=0.700, comm_ms=0.065, overlap_ms=0.020, other_ms=0.255, exposed_comm_ms=0.045,
                busy_ms=0.955, step_ms=1.0)),
    (1, 2, dict(compute_ms=0.800, comm_ms=0.040, overlap_ms=0.0, other_ms=0.160, exposed_comm_ms=0.040,
                busy_ms=0.960, step_ms=1.0)),
])
def test_step_breakdown_matches_hand_computation(result, rank, step, expected):
    row = next(s for s in _steps(result, rank) if s["step"] == step)
    for key, value in expected.items():
        assert row[key] == pytest.approx(value, abs=1e-9), key
    # The parts add up to the step.
    assert row["compute_only_ms"] + row["exposed_comm_ms"] + row["overlap_ms"] + row["other_ms"] == \
        pytest.approx(row["step_ms"])


def test_rank_rows_and_overlap_ratio(result):
    r0, r1 = result["ranks"]
    assert (r0["rank"], r1["rank"]) == (0, 1)
    assert r0["busy_ms"] == pytest.approx(0.695) and r1["busy_ms"] == pytest.approx(0.9575)
    assert r0["overlap_ratio"] == pytest.approx(100 / 710)
    assert r1["overlap_ratio"] == pytest.approx(20 / 105)
    m = result["metrics"]
    assert m["overlap_ratio"] == pytest.approx(120 / 815)
    assert m["comm_fraction"] == pytest.approx(815 / 4000)
    assert (m["world_size"], m["ranks_loaded"], m["steps_per_rank"]) == (2, 2, 2)
    assert result["backend"] == "gloo" and result["device_kind"] == "CPU"
    assert result["distributed_info"]["1"] == {"backend": "gloo", "rank": 1, "world_size": 2}


def test_collective_table(result):
    table = {c["name"]: c for c in result["collectives"]}
    assert set(table) == {"gloo:all_reduce", "c10d::allreduce_", "record_param_comms"}  # broadcast: before step 1
    g = table["gloo:all_reduce"]
    assert (g["calls"], g["ranks"]) == (4, 2)
    assert g["total_ms"] == pytest.approx(0.770) and g["mean_ms"] == pytest.approx(0.1925)
    assert g["max_ms"] == pytest.approx(0.380)
    assert g["bytes"] == 4 * 1000 * 4 and g["mean_bytes"] == 4000
    c = table["c10d::allreduce_"]
    assert (c["calls"], c["total_ms"], c["bytes"]) == (4, pytest.approx(0.106), None)  # TensorList: size unknown
    p = table["record_param_comms"]
    assert (p["calls"], p["ranks"], p["bytes"]) == (2, 1, 8000)
    assert p["total_ms"] == pytest.approx(0.050)
    assert [c["name"] for c in result["collectives"]][0] == "gloo:all_reduce"  # by total time


def test_stragglers_and_thresholds(result):
    # Default floor (10 ms) is far above these sub-millisecond steps: nobody flagged.
    assert result["stragglers"] == []
    t = result["thresholds"]
    # The headline threshold is the busiest rank's (1), against the median of the others (rank 0).
    assert (t["compared_rank"], t["rule"]) == (1, "leave-one-out")
    assert t["median_ms"] == pytest.approx(0.695) and t["median_all_ms"] == pytest.approx(0.82625)
    assert t["threshold_ms"] == pytest.approx(0.695 + STRAGGLER_MIN_EXCESS_MS)
    assert result["metrics"]["median_busy_ms"] == pytest.approx(0.82625)
    tight = analyze_folder_path(PAIR, margin=0.10, min_excess_ms=0.1)
    assert tight["stragglers"] == [1]
    assert tight["thresholds"]["threshold_ms"] == pytest.approx(0.795)  # max(0.7645, 0.795)
    assert tight["thresholds"]["per_rank"] == {
        "0": {"others_median_ms": pytest.approx(0.9575), "threshold_ms": pytest.approx(1.0575)},
        "1": {"others_median_ms": pytest.approx(0.695), "threshold_ms": pytest.approx(0.795)}}
    r0, r1 = tight["ranks"]
    assert [r0["straggler"], r1["straggler"]] == [False, True]
    assert (r1["others_median_ms"], r1["threshold_ms"]) == (pytest.approx(0.695), pytest.approx(0.795))
    assert r1["busy_excess_pct"] == pytest.approx(100 * (0.9575 - 0.695) / 0.695)
    # 20 %: 0.695 x 1.2 = 0.834 < 0.9575, still a straggler; 40 %: 0.973 lets rank 1 through.
    assert analyze_folder_path(PAIR, margin=0.20, min_excess_ms=0.1)["stragglers"] == [1]
    assert analyze_folder_path(PAIR, margin=0.40, min_excess_ms=0.1)["stragglers"] == []


def test_two_ranks_a_clear_straggler_is_flagged():
    # The audit's case: with the straggler inside the median the threshold was 20.29 ms and
    # nobody was flagged; against the other rank alone it is 2.7 + 10 = 12.7 ms.
    stragglers, t = find_stragglers({0: 2.7, 1: 17.9})
    assert stragglers == [1]
    assert t["threshold_ms"] == pytest.approx(12.7) and t["median_ms"] == pytest.approx(2.7)
    assert t["per_rank"]["0"]["threshold_ms"] == pytest.approx(27.9)


def test_find_stragglers_rules():
    assert find_stragglers({0: 10.0, 1: 10.0, 2: 10.0, 3: 50.0}, 0.2, 5.0)[0] == [3]
    assert find_stragglers({0: 10.0}, 0.2, 0.0)[0] == []  # one rank: nothing to compare with
    # Two equally slow ranks of three: the others' upper median keeps them from flagging each other.
    assert find_stragglers({0: 100.0, 1: 100.0, 2: 2.0}, 0.2, 5.0)[0] == []
    assert find_stragglers({0: 2.0, 1: 2.0, 2: 100.0}, 0.2, 5.0)[0] == [2]
    with pytest.raises(DistributedError, match="margin"):
        find_stragglers({0: 1.0, 1: 2.0}, -0.1, 0.0)


def test_registered_folder_analysis_runs_without_model(tmp_path):
    out = execute(Job("distributed_traces", None, {"trace_dir": str(PAIR), "straggler_margin": 0.1,
                                                   "straggler_min_ms": 0.1}), tmp_path)
    assert isinstance(out, DistributedResult)
    assert out.source == "folder" and out.stragglers == (1,)
    assert decode(DISTRIBUTED_TRACES, json.loads(to_json(out))) == out  # the one serialisation, both ways


def test_bad_folders(tmp_path):
    with pytest.raises(DistributedError, match="not found"):
        analyze_folder_path(tmp_path / "nope")
    with pytest.raises(DistributedError, match="no trace files"):
        analyze_folder_path(tmp_path)
    shutil.copy(PAIR / "rank0.pt.trace.json", tmp_path / "a.json")
    shutil.copy(PAIR / "rank0.pt.trace.json", tmp_path / "b.json")
    with pytest.raises(DistributedError, match="two traces claim rank 0"):
        analyze_folder_path(tmp_path)


def test_missing_rank_is_noted(tmp_path):
    shutil.copy(PAIR / "rank1.pt.trace.json", tmp_path / "rank1.pt.trace.json")
    out = analyze_folder_path(tmp_path)
    assert any("loaded 1 of 2 ranks; missing: [0]" in n for n in out["notes"])
