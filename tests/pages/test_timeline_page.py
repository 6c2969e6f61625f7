"""AppTest: the Trace explorer's timeline search highlights the matching events and lists them."""

import json
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"


def test_timeline_search_lists_the_matching_events(new_app):
    from diagnostics.trace import load_trace, timeline_data

    at = new_app().run()
    at.switch_page("pages/traces.py").run()
    at.radio(key="trace_src_a").set_value("Local path").run()
    at.text_input(key="trace_path_a").set_value(str(DATA / "gpu_small.json")).run()
    assert not at.exception, [e.value for e in at.exception]
    at.text_input(key="trace_tl_search").set_value('"aten::mm"').run()
    assert not at.exception, [e.value for e in at.exception]
    expected = [e for e in timeline_data(load_trace(DATA / "gpu_small.json")).events if e.name == "aten::mm"]
    hits = next(d.value for d in at.dataframe if "bar stands for" in d.value.columns)
    assert set(hits["name"]) == {"aten::mm"} and len(hits) == len(expected) == 3
    assert sorted(hits["duration (µs)"], reverse=True) == list(hits["duration (µs)"])  # longest first
    assert sorted(hits["duration (µs)"]) == sorted(e.dur_us for e in expected)
    assert set(hits["lane"]) == {"thread 100 (python)"}  # the lane as the user reads it, not "100/100"
    figs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    timeline = next(f for f in figs if f["layout"]["title"]["text"].startswith("Timeline"))
    assert "3 match '\"aten::mm\"'" in timeline["layout"]["title"]["text"]


def test_a_time_range_is_redrawn_from_the_kept_columns_not_by_the_whole_trace_job(new_app):
    """The timeline's range slider: a trace_timeline run on the columns the trace run kept (the bars of that
    range only), the trace job (every part) is not run again."""
    from ui.jobs import get_store

    def runs(analysis):
        return len(get_store().list(limit=10_000, analysis=analysis))

    at = new_app().run()
    at.switch_page("pages/traces.py").run()
    at.radio(key="trace_src_a").set_value("Local path").run()
    path = (DATA / "gpu_small.json").resolve()
    at.text_input(key="trace_path_a").set_value(str(path)).run()
    assert not at.exception, [e.value for e in at.exception]
    traces, ranges = runs("trace"), runs("trace_timeline")
    slider = at.slider(key=f"trace-range-{path}")
    lo, hi = slider.value
    at.slider(key=f"trace-range-{path}").set_value((lo, (lo + hi) / 2)).run()
    assert not at.exception, [e.value for e in at.exception]
    assert (runs("trace"), runs("trace_timeline")) == (traces, ranges + 1)
    from diagnostics.trace import load_trace, timeline_data

    half = timeline_data(load_trace(path), lo * 1e3, (lo + hi) / 2 * 1e3)   # the slider is in ms
    whole = timeline_data(load_trace(path))
    assert half.in_range < whole.in_range
    caption = next(c.value for c in at.caption if "bars drawn for" in c.value)
    assert caption.startswith(f"{half.shown:,} bars drawn for {half.in_range:,} events in range"), caption
