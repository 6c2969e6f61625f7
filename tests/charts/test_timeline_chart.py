"""The one timeline figure (render/charts/timeline.py) on the Timeline record: lanes, bars, names, shapes, search."""

from __future__ import annotations

import msgspec
import pytest

from diagnostics.trace.records.timeline import Timeline, TimelineEvent, TimelineLane
from diagnostics.render.charts.timeline import DIMMED, build_timeline_figure, find_events, matches, normalize

TRACE_PLAIN = {  # the trace layer's timeline_data (µs), typed as the trace analyses' results hold it: TRACE_TL
    "t0": 0.0, "t1": 100.0, "in_range": 4, "shown": 4, "bucket_us": 0.0, "deeper": 0,
    "lanes": [{"lane": "1/1", "kind": "cpu", "name": "main", "label": "main"},
              {"lane": "GPU 0 stream 7", "kind": "gpu", "name": "", "label": "GPU 0 · stream 7"}],
    "events": [
        {"lane": "1/1", "depth": 0, "name": "ProfilerStep#1", "cat": "user_annotation", "start_us": 0.0,
         "dur_us": 100.0, "count": 1},
        {"lane": "1/1", "depth": 1, "name": "aten::mm", "cat": "cpu_op", "start_us": 10.0, "dur_us": 30.0, "count": 1},
        {"lane": "1/1", "depth": 1, "name": "aten::mm_out", "cat": "cpu_op", "start_us": 50.0, "dur_us": 5.0,
         "count": 3},
        {"lane": "GPU 0 stream 7", "depth": 0, "name": "sgemm", "cat": "kernel", "start_us": 20.0, "dur_us": 40.0,
         "count": 1},
    ],
}
TRACE_TL = msgspec.convert(TRACE_PLAIN, Timeline)
#: a profile's timeline: the same record, with the input shapes the profile recorded on its operators
PROFILE_TL = Timeline(
    t0=100.0, t1=1000.0, in_range=2, shown=2, bucket_us=0.0, deeper=0,
    lanes=(TimelineLane(lane="7/7", kind="cpu", name="main thread", label="main thread"),),
    events=(TimelineEvent(lane="7/7", depth=0, name="aten::linear", cat="cpu_op", start_us=100.0, dur_us=500.0,
                          count=1, shapes="[[8,64]]"),
            TimelineEvent(lane="7/7", depth=1, name="aten::addmm", cat="cpu_op", start_us=200.0, dur_us=300.0,
                          count=1)))


def test_the_record_normalises_to_labelled_lanes_in_ms():
    n = normalize(TRACE_TL)
    assert [(l["label"], l["kind"], l["depths"]) for l in n.lanes] == [("main", "cpu", 2),
                                                                         ("GPU 0 · stream 7", "gpu", 1)]
    mm = next(e for e in n.events if e["name"] == "aten::mm")
    assert (mm["lane"], mm["start_ms"], mm["dur_ms"]) == ("main", 0.01, 0.03)
    p = normalize(PROFILE_TL)
    assert p.lanes == [{"label": "main thread", "kind": "cpu", "depths": 2}]
    assert [e["shapes"] for e in p.events] == ["[[8,64]]", ""]  # no shapes recorded: none shown


def test_one_row_per_lane_depth_drawn_inside_the_band_names_on_bars():
    fig = build_timeline_figure(TRACE_TL)
    ys = set().union(*(set(t.y) for t in fig.data))
    assert ys == {"main", "GPU 0 · stream 7"}  # no "1/1 · 1" rows per depth
    cpu = next(t for t in fig.data if t.name == "cpu_op")
    assert list(cpu.text) == ["aten::mm", "aten::mm_out"] and cpu.textposition == "inside"
    assert fig.layout.uniformtext.mode == "hide"  # names appear once zoomed in far enough to fit
    # depth 1 of a lane with 2 depths: the lower half of the band (depth 0, the parent, on top)
    assert list(cpu.width) == [pytest.approx(0.42)] * 2 and list(cpu.offset) == [pytest.approx(-0.42)] * 2
    step = next(t for t in fig.data if t.name == "user_annotation")
    assert list(step.offset) == [pytest.approx(0.0)]
    assert list(fig.layout.yaxis.categoryarray) == ["GPU 0 · stream 7", "main"]  # host lane on top
    assert fig.layout.xaxis.title.text == "time since the first event (ms)"
    p = build_timeline_figure(PROFILE_TL)
    assert "shapes [[8,64]]" in p.data[0].customdata[0][4]


def test_search_dims_the_rest_and_finds_the_events():
    fig = build_timeline_figure(TRACE_TL, search="ATEN")
    cpu = next(t for t in fig.data if t.name == "cpu_op")
    kernel = next(t for t in fig.data if t.name == "kernel")
    assert list(cpu.marker.opacity) == [1.0, 1.0] and list(kernel.marker.opacity) == [DIMMED]
    assert "2 match 'ATEN'" in fig.layout.title.text
    exact = build_timeline_figure(TRACE_TL, search='"aten::mm"')
    assert list(next(t for t in exact.data if t.name == "cpu_op").marker.opacity) == [1.0, DIMMED]
    assert matches("aten::mm", '"aten::mm"') and not matches("aten::mm_out", '"aten::mm"')
    hits = find_events(TRACE_TL, "aten::")
    assert [h["name"] for h in hits] == ["aten::mm", "aten::mm_out"]  # longest first
    assert find_events(TRACE_TL, "  ") == []


def test_an_empty_range_says_so():
    fig = build_timeline_figure(msgspec.structs.replace(TRACE_TL, events=(), in_range=0, shown=0))
    assert fig.layout.annotations[0].text == "No events in this range"
