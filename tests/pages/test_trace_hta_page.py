"""AppTest: the Trace explorer's HTA-parity tabs (issue #18) show labelled charts and the figures of the
trace, say what was not counted, and the definitions widget re-runs the trace with HTA's rules."""

import json

from tests.trace.test_gpu_activity import A, B, events, write


def _open(new_app, path):
    at = new_app().run()
    at.switch_page("pages/traces.py").run()
    at.radio(key="trace_src_a").set_value("Local path").run()
    at.text_input(key="trace_path_a").set_value(str(path)).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _charts(at) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def test_hta_tabs_show_labelled_charts_and_the_trace_s_numbers(new_app, tmp_path):
    at = _open(new_app, write(tmp_path, events()))
    labels = [t.label for t in at.tabs]
    # Issue #31: eleven tabs overflowed the page at 1280 px; the HTA parts now sit in the "GPU" tab's own
    # tabs, the fusion candidates beside the kernels.
    from ui.views.traces import GPU_TABS, TABS

    assert [x for x in labels if x in TABS] == list(TABS)
    assert [x for x in labels if x in GPU_TABS] == list(GPU_TABS)
    assert any(m.value == "**Kernel sequences (fusion candidates)**" for m in at.markdown)
    layouts = {c["layout"]["title"]["text"].split(" (")[0].split(":")[0]: c["layout"] for c in _charts(at)}
    axes = {k: (v.get("xaxis", {}).get("title", {}).get("text"), v.get("yaxis", {}).get("title", {}).get("text"))
            for k, v in layouts.items()}
    assert axes["Frequent kernel sequences"] == ("GPU time, all occurrences (µs)", "kernel sequence")
    assert axes["Launch queue length per stream"] == ("time (ms from trace start)", "launches queued (count)")
    assert axes["Memcpy / memset bandwidth"] == ("direction", "bandwidth (GB/s)")
    assert axes["GPU user annotations"] == ("time (ms)", "annotation")
    assert axes["Launch delay"] == ("launch delay (µs)", "launches (count)")
    frames = [d.value for d in at.dataframe]
    seq = next(f for f in frames if "sequence" in f.columns)
    assert seq.iloc[0]["sequence"] == f"{A} → {B}" and seq.iloc[0]["occurrences"] == 3
    assert seq.iloc[0]["GPU time (µs)"] == 45.0
    bw = next(f for f in frames if "direction" in f.columns).set_index("direction")
    assert abs(bw.loc["HtoD", "bandwidth (GB/s)"] - 4e6 / 30e-6 / 1e9) < 1e-9   # 4 MB in 30 µs
    ann = next(f for f in frames if "GPU busy inside (µs)" in f.columns).set_index("name")
    assert ann.loc["forward", "total (µs)"] == 52.0 and ann.loc["forward", "GPU busy inside (µs)"] == 46.0
    assert any("not counted" in i.value and "bytes" in i.value for i in at.info)   # the DtoH without bytes


def test_the_trace_explorer_s_tabs_fit_a_1280_px_page():
    """The tab bar of the Trace explorer fits the page's content width at 1280 px (about 820 px beside
    the sidebar), Ranks included: about 8 px a character plus 32 px of padding a tab (the widths read on
    the 1280 px screenshots). Eleven tabs needed 1,190 px."""
    from ui.views.traces import GPU_TABS, TABS

    def width(labels):
        return sum(8 * len(x) + 32 for x in labels)

    assert width(("Ranks",) + TABS) <= 820 and width(GPU_TABS) <= 820
    assert width(("Ranks", "Serving") + TABS) <= 820   # a server's trace of several ranks (#42)
    old = ("Ranks", "Summary", "Breakdown", "Top operators & kernels", "GPU idle & launches", "Timeline",
           "Critical path", "Kernel sequences", "Launch queue", "Memcpy bandwidth", "GPU annotations", "Launch delay")
    assert width(old) > 820


def test_an_old_trace_says_not_counted_and_hta_definitions_rerun(new_app, tmp_path):
    at = _open(new_app, write(tmp_path, events(annotations=[], with_bytes=False)))
    infos = [i.value for i in at.info]
    assert any(i.startswith("not counted: no gpu_user_annotation events") for i in infos)
    assert any("their bytes and bandwidth are not counted" in i for i in infos)
    assert any("overlap over all GPU work" in c.value for c in at.caption)
    at.radio(key="trace_definitions").set_value("hta").run()
    assert not at.exception, [e.value for e in at.exception]
    captions = " ".join(c.value for c in at.caption)
    assert "idle kernel wait up to 30 µs (hta rules)" in captions and "overlap over compute kernels" in captions
    assert "launch delay from the launch call's end" in captions
    assert "until its GPU work starts" in " ".join(c["layout"]["title"]["text"] for c in _charts(at))
