"""timeline_data: lanes, depths, range filter and downsampling that keeps the longest events."""

import json
from pathlib import Path

from diagnostics.traces import load_trace, timeline_data

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"


def test_full_range_keeps_every_event():
    t = load_trace(DATA / "gpu_small.json")
    r = timeline_data(t)
    json.dumps(r)
    assert [lane["lane"] for lane in r["lanes"]] == ["100/100", "GPU 0 stream 20", "GPU 0 stream 7"]
    assert r["lanes"][0]["name"] == "thread 100 (python)"
    assert r["in_range"] == r["shown"] == 24 and r["bucket_us"] == 0.0
    mm = [e for e in r["events"] if e["name"] == "aten::mm"]
    assert [(e["depth"], e["start_us"], e["dur_us"]) for e in mm] == [
        (1, 10.0, 20.0), (1, 110.0, 15.0), (1, 130.0, 15.0)]
    launch = [e for e in r["events"] if e["name"] == "cudaLaunchKernel"][0]
    assert launch["depth"] == 2


def test_range_filter_clips_to_the_window():
    t = load_trace(DATA / "gpu_small.json")
    r = timeline_data(t, 100.0, 120.0)
    names = {e["name"] for e in r["events"]}
    assert names == {"ProfilerStep#1", "ProfilerStep#2", "aten::mm", "cudaLaunchKernel",
                     "ampere_sgemm_128x64_nn", "cudaDeviceSynchronize"}
    step1 = next(e for e in r["events"] if e["name"] == "ProfilerStep#1")
    assert (step1["start_us"], step1["dur_us"]) == (100.0, 5.0)


def test_downsampling_keeps_longest_per_bucket_and_counts(tmp_path):
    # 10,000 events of 1 µs on one thread, and one long event among them.
    evs = [{"ph": "X", "cat": "cpu_op", "name": "tiny", "pid": 1, "tid": 1, "ts": i * 2.0,
            "dur": 1.0} for i in range(10000)]
    evs.append({"ph": "X", "cat": "cpu_op", "name": "long", "pid": 1, "tid": 2, "ts": 5000.0,
                "dur": 3000.0})
    p = tmp_path / "many.json"
    p.write_text(json.dumps({"traceEvents": evs}))
    r = timeline_data(load_trace(p), max_events=1000)
    assert r["in_range"] == 10001
    assert r["shown"] <= 1000 and r["bucket_us"] > 0
    assert sum(e["count"] for e in r["events"]) == 10001
    assert any(e["name"] == "long" and e["dur_us"] == 3000.0 for e in r["events"])
