"""timeline_data: lanes, depths, range filter and downsampling that keeps the longest events."""

import json
from pathlib import Path

import pytest

from diagnostics.results import UNSET, to_plain
from diagnostics.trace import load_trace, timeline_data
from diagnostics.trace.records.timeline import from_legacy, is_legacy

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"


def test_full_range_keeps_every_event():
    t = load_trace(DATA / "gpu_small.json")
    r = to_plain(timeline_data(t))
    json.dumps(r)
    # natural order: stream 7 before stream 20 (a string sort put "20" first)
    assert [lane["lane"] for lane in r["lanes"]] == ["100/100", "GPU 0 stream 7", "GPU 0 stream 20"]
    assert r["lanes"][0]["name"] == "thread 100 (python)"
    assert [lane["label"] for lane in r["lanes"]] == ["thread 100 (python)", "GPU 0 · stream 7", "GPU 0 · stream 20"]
    assert r["in_range"] == r["shown"] == 24 and r["bucket_us"] == 0.0
    mm = [e for e in r["events"] if e["name"] == "aten::mm"]
    assert [(e["depth"], e["start_us"], e["dur_us"]) for e in mm] == [
        (1, 10.0, 20.0), (1, 110.0, 15.0), (1, 130.0, 15.0)]
    launch = [e for e in r["events"] if e["name"] == "cudaLaunchKernel"][0]
    assert launch["depth"] == 2


def test_range_filter_clips_to_the_window():
    t = load_trace(DATA / "gpu_small.json")
    r = to_plain(timeline_data(t, 100.0, 120.0))
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
    r = to_plain(timeline_data(load_trace(p), max_events=1000))
    assert r["in_range"] == 10001
    assert r["shown"] <= 1000 and r["bucket_us"] > 0
    assert sum(e["count"] for e in r["events"]) == 10001
    assert any(e["name"] == "long" and e["dur_us"] == 3000.0 for e in r["events"])


def _write(tmp_path, evs, name="t.json"):
    p = tmp_path / name
    p.write_text(json.dumps({"traceEvents": evs}))
    return load_trace(p)


def test_deep_module_trees_are_drawn_and_what_is_deeper_is_counted(tmp_path):
    from diagnostics.trace.timeline import MAX_DEPTH

    n = MAX_DEPTH + 6  # one chain of nested calls, each 1 µs inside its parent
    evs = [{"ph": "X", "cat": "cpu_op", "name": f"level{i}", "pid": 1, "tid": 1, "ts": float(i),
            "dur": float(2 * n - 2 * i)} for i in range(n)]
    r = to_plain(timeline_data(_write(tmp_path, evs)))
    assert r["in_range"] == n and r["shown"] == MAX_DEPTH + 1 and r["deeper"] == n - MAX_DEPTH - 1
    assert max(e["depth"] for e in r["events"]) == MAX_DEPTH


def test_python_frames_get_their_own_lane_and_leave_operator_depths_alone(tmp_path):
    ops = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0.0, "dur": 100.0},
           {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 40.0, "dur": 10.0}]
    frames = [{"ph": "X", "cat": "python_function", "name": f"frame{i}", "pid": 1, "tid": 1, "ts": 1.0 + i,
               "dur": 90.0 - 2 * i} for i in range(10)]
    r = to_plain(timeline_data(_write(tmp_path, ops + frames)))
    assert [lane["lane"] for lane in r["lanes"]] == ["1/1", "1/1 · Python"]
    mm = next(e for e in r["events"] if e["name"] == "aten::mm")
    assert (mm["lane"], mm["depth"]) == ("1/1", 1)  # under the step, not under ten frames
    assert sorted(e["depth"] for e in r["events"] if e["lane"] == "1/1 · Python") == list(range(10))


def test_downsampling_never_drops_a_lane(tmp_path):
    """Three host threads with 7 nested levels each, and one stream of 20,000 short kernels."""
    evs = []
    for tid in (1, 2, 3):
        for k in range(50):
            evs += [{"ph": "X", "cat": "cpu_op", "name": f"op{d}", "pid": 1, "tid": tid, "ts": k * 200.0 + d,
                     "dur": 150.0 - 2 * d} for d in range(7)]
    evs += [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": i * 0.5, "dur": 0.2,
             "args": {"device": 0, "stream": 7}} for i in range(20000)]
    r = to_plain(timeline_data(_write(tmp_path, evs), max_events=1000))
    assert r["shown"] <= 1000
    assert "GPU 0 stream 7" in [lane["lane"] for lane in r["lanes"]]
    assert any(e["lane"] == "GPU 0 stream 7" for e in r["events"])
    assert {e["lane"] for e in r["events"]} == {"1/1", "1/2", "1/3", "GPU 0 stream 7"}


def test_a_thread_without_an_os_id_is_named_by_what_it_runs():
    """HTA's ns_resolution capture has a thread "-247463936" (a pthread handle cut to int32, not an OS
    thread id, and no thread_name): the lane said "thread -247463936" (issue #31). It is named by what
    runs on it; threads the trace names keep their names, an OS id stays as it is."""
    from diagnostics.trace import load_trace

    t = load_trace(DATA / "public" / "hta" / "ns_resolution_rank0.json.gz")
    labels = {lane["lane"]: lane["label"] for lane in to_plain(timeline_data(t))["lanes"]}
    assert labels["1102/-247463936"] == "unnamed thread (cudaEventQuery)"
    assert labels["1102/1102"] == "thread 1102 (pt_main_thread)"
    assert labels["1102/1262"] == "thread 1262 (pt_autograd_0)"
    assert not any("-247463936" in label for label in labels.values())
    from diagnostics.trace.timeline import thread_label

    assert thread_label({}, "9", "4242") == "thread 4242"
    assert thread_label({"9/5": "main thread"}, "9", "5") == "main thread"
    assert thread_label({}, "9", "-5", top_call="cudaEventQuery") == "unnamed thread (cudaEventQuery)"
    assert thread_label({}, "9", "-5") == "unnamed thread"


LEGACY = {  # a profile's timeline as runs stored before it was typed hold it: ms, lanes as labels
    "lanes": ["main thread", "GPU 0 · stream 7"], "total_events": 5, "shown_events": 3, "deeper": 1,
    "span_ms": 2.5, "builder": "diagnostics.trace.timeline_data",
    "events": [{"lane": "main thread", "name": "aten::mm", "cat": "cpu_op", "start_ms": 0.1, "dur_ms": 0.5, "depth": 1,
                "count": 2, "shapes": "[[8,64],[64,32]]"},
               {"lane": "GPU 0 · stream 7", "name": "sgemm", "cat": "kernel", "start_ms": 0.3, "dur_ms": 0.4,
                "depth": 0, "count": 1, "shapes": ""},
               {"lane": "thread 9", "name": "x", "cat": "", "start_ms": 1.0, "dur_ms": 1.0, "depth": 0, "count": 1,
                "shapes": ""}],
}


def test_a_legacy_profile_timeline_reads_as_the_record():
    assert is_legacy(LEGACY) and not is_legacy(to_plain(from_legacy(LEGACY))) and not is_legacy(None)
    tl = from_legacy(LEGACY)
    # each label a lane of its own, in order; a lane only an event names (older results) appended
    assert [(l.lane, l.kind, l.label) for l in tl.lanes] == [
        ("main thread", "cpu", "main thread"), ("GPU 0 · stream 7", "gpu", "GPU 0 · stream 7"),
        ("thread 9", "cpu", "thread 9")]
    mm, k, x = tl.events
    assert (mm.lane, mm.depth, mm.count, mm.shapes) == ("main thread", 1, 2, "[[8,64],[64,32]]")
    assert (mm.start_us, mm.dur_us) == (pytest.approx(100.0), pytest.approx(500.0))
    assert k.shapes is UNSET and x.shapes is UNSET  # "" was "no shapes recorded"
    assert (tl.t0, tl.t1, tl.in_range, tl.shown, tl.deeper, tl.bucket_us) == (pytest.approx(100.0), 2500.0, 5, 3,
                                                                              1, 0.0)
    # without span_ms (the oldest runs): the range ends with the last bar
    assert from_legacy({k: v for k, v in LEGACY.items() if k != "span_ms"}).t1 == pytest.approx(2000.0)
