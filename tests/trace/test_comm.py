"""One rank's computation / communication split, its collective calls and their message sizes,
on the hand-made pair in tests/data/distributed (worked by hand in tests/distributed/test_analysis.py)."""

import json
from pathlib import Path

import pytest

from diagnostics.trace import load_trace
from diagnostics.trace.comm import collective_bytes, event_bytes, rank_breakdown
from diagnostics.trace.comm_args import named_events

PAIR = Path(__file__).resolve().parents[1] / "data" / "distributed" / "pair"


def test_event_bytes():
    assert event_bytes({"In msg nelems": 10, "Out msg nelems": 20, "dtype": "BFloat16"}) == 40
    assert event_bytes({"In msg nelems": 10, "dtype": "complex32"}) is None  # unknown element size
    assert event_bytes({"Input Dims": [[4, 8]], "Input type": ["double"]}) == 256
    assert event_bytes({"Input Dims": [[]], "Input type": ["float"]}) == 4  # a scalar
    assert event_bytes({"Input Dims": [[[4]]], "Input type": ["TensorList"]}) is None
    assert event_bytes({}) is None


def test_collective_bytes_are_keyed_by_the_kth_event_of_a_name():
    path = PAIR / "rank1.pt.trace.json"
    want = {("gloo:all_reduce", 0): 4000, ("gloo:all_reduce", 1): 4000,
            ("record_param_comms", 0): 4000, ("record_param_comms", 1): 4000}
    assert collective_bytes(path) == (want, None)  # the file loaded first (the ingest), then its args pass
    assert collective_bytes(path, load_trace(path)) == (want, None)  # with the trace already loaded


def test_collective_bytes_of_a_file_that_is_no_trace_say_so(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("not a trace")
    found, note = collective_bytes(bad)
    assert found == {} and note.startswith("bad.json: collective bytes not read (")


def test_the_args_pass_decodes_each_named_event_whole(tmp_path):
    events = [
        # braces inside the name and inside an arg's string, nested objects after the name
        {"ph": "X", "name": "a}b", "ts": 1, "dur": 2, "args": {"s": "}}", "n": {"x": [1, {"y": 2}]}}},
        # an object before the name (its brace is not the event's)
        {"args": {"Seq": 3}, "ph": "X", "name": "nccl:all_reduce", "ts": 5, "dur": 1},
        # an integer past 64 bits: orjson refuses it, the window decode reads it
        {"ph": "X", "name": "nccl:all_reduce", "ts": 7, "dur": 1, "args": {"Seq": 2**70}},
        {"ph": "i", "name": "nccl:all_reduce", "ts": 9},  # not a complete event: left out
        {"ph": "X", "name": "other", "ts": 9, "dur": 1},  # not asked for
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert named_events(path, ["a}b", "nccl:all_reduce"]) == (events[:3], 0)


def test_rank_breakdown_lists_the_calls_inside_steps_with_their_bytes():
    path = PAIR / "rank1.pt.trace.json"
    b = rank_breakdown(load_trace(path), collective_bytes(path)[0])
    assert not b["on_gpu"] and [s["step"] for s in b["steps"]] == [1, 2]
    s1 = b["steps"][0]
    assert (s1["compute_ms"], s1["comm_ms"], s1["overlap_ms"]) == pytest.approx((0.7, 0.065, 0.02))
    calls = [(c["name"], c["where"], c["bytes"]) for c in b["calls"]]
    assert calls.count(("record_param_comms", "CPU", 4000)) == 2
    assert calls.count(("gloo:all_reduce", "CPU", 4000)) == 2
    assert {c["name"] for c in b["calls"]} == {"gloo:all_reduce", "c10d::allreduce_", "record_param_comms"}
