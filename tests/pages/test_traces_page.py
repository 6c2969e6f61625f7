"""AppTest: the trace explorer opens a trace by local path and diffs two."""

from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"


def test_open_by_local_path_shows_summary_and_charts(new_app):
    at = new_app().run()
    at.switch_page("pages/traces.py").run()
    assert not at.exception
    at.radio(key="trace_src_a").set_value("Local path").run()
    at.text_input(key="trace_path_a").set_value(str(DATA / "gpu_small.json")).run()
    assert not at.exception, [e.value for e in at.exception]
    labels = [m.label for m in at.metric]
    assert "Events" in labels and "GPU streams" in labels
    assert at.metric[labels.index("Steps")].value != "0"


def test_missing_path_is_a_clear_error(new_app):
    at = new_app().run()
    at.switch_page("pages/traces.py").run()
    at.radio(key="trace_src_a").set_value("Local path").run()
    at.text_input(key="trace_path_a").set_value("/no/such/trace.json").run()
    assert not at.exception
    assert any("trace file not found: /no/such/trace.json" in e.value for e in at.error)


def test_diff_two_traces(new_app):
    at = new_app().run()
    at.switch_page("pages/traces.py").run()
    for slot, name in (("before", "diff_before.json"), ("after", "diff_after.json")):
        at.radio(key=f"trace_src_{slot}").set_value("Local path").run()
        at.text_input(key=f"trace_path_{slot}").set_value(str(DATA / name)).run()
    at.button(key="trace_compare").click().run()
    assert not at.exception, [e.value for e in at.exception]
    labels = [m.label for m in at.metric]
    assert "Faster" in labels and "Slower" in labels


def test_notes_on_left_out_work_and_graph_launches_are_shown(new_app, tmp_path):
    from tests.trace.test_gpu_steps import queued_graph_trace

    path = queued_graph_trace(tmp_path)
    at = new_app().run()
    at.switch_page("pages/traces.py").run()
    at.radio(key="trace_src_a").set_value("Local path").run()
    at.text_input(key="trace_path_a").set_value(str(path)).run()
    assert not at.exception, [e.value for e in at.exception]
    infos = [i.value for i in at.info]
    assert any("launched before profiling began: left out of step figures" in i for i in infos)
    assert any("CUDA graph launches" in m.value for m in at.markdown)


def test_ranks_tab_from_a_folder_shows_table_chart_problems_and_merged_timeline(new_app, tmp_path):
    from tests.trace.rank_traces import BASE_NS, write_rank

    for r, steps in {0: [1000, 1200, 1100], 1: [2000, 1000, 3000], 2: [1500, 1500, 1600]}.items():
        write_rank(tmp_path / "job", f"rank{r}.json", r, 3, steps, base_ns=BASE_NS + (3600 * 10**9 if r == 2 else 0))
    at = new_app().run()
    at.switch_page("pages/traces.py").run()
    at.radio(key="trace_ranks_src").set_value("Local paths").run()
    at.text_area(key="trace_ranks_paths").set_value(str(tmp_path / "job")).run(timeout=300)
    assert not at.exception, [e.value for e in at.exception]
    warnings = [w.value for w in at.warning]
    assert any(w.startswith("Not one run? (start time) traces start 3,600 s apart") for w in warnings), warnings
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Slowest rank"] == "1" and metrics["Step-time spread"] == "1.82x"
    table = next(df.value for df in at.dataframe if "step (ms)" in df.value.columns)
    assert list(table["rank"]) == [0, 1, 2] and list(table["step (ms)"]) == [1.1, 2.0, 1.5]
    assert any("first profiler step" in c.value for c in at.caption)  # the merged timeline says its alignment
    assert at.text_input(key="trace_ranks_tl_search") is not None  # the merged timeline's search box
    # the cross-rank views: collectives matched by order (rank 2's clock, an hour off, aligned on their ends)
    coll = next(df.value for df in at.dataframe if "arrival skew (µs, median)" in df.value.columns)
    assert list(coll["count"]) == [3]
    assert any("one offset per host" in c.value for c in at.caption)
    assert at.text_input(key="trace_ranks_dask") is not None  # local processes unless a scheduler is given
    picker = at.multiselect(key="trace_ranks_timeline")
    assert picker.value == [0, 1]  # the slowest rank (1) and the one that waits most
    assert any("bars drawn for 36 events" in c.value for c in at.caption)  # 2 ranks x 3 steps x 6 events
    picker.set_value([2]).run(timeout=300)  # picking another rank re-runs the job: rank 2 alone on the timeline
    assert not at.exception, [e.value for e in at.exception]
    assert any("bars drawn for 18 events" in c.value for c in at.caption), [c.value for c in at.caption]


def test_ranks_tab_missing_path_is_a_clear_error(new_app):
    at = new_app().run()
    at.switch_page("pages/traces.py").run()
    at.radio(key="trace_ranks_src").set_value("Local paths").run()
    at.text_area(key="trace_ranks_paths").set_value("/no/such/job/").run()
    assert not at.exception
    assert any("/no/such/job: no such file or folder" in e.value for e in at.error)


def test_the_page_says_whether_the_trace_came_from_the_trace_cache(new_app, tmp_path):
    from diagnostics.settings import trace_cache_dir
    from diagnostics.trace.cache import cached_load

    first, second = tmp_path / "first.json", tmp_path / "second.json"
    for p in (first, second):
        p.write_bytes((DATA / "gpu_small.json").read_bytes())
    assert cached_load(second, trace_cache_dir())[1] is False  # second.json parsed (and kept) before
    at = new_app().run()
    at.switch_page("pages/traces.py").run()
    at.radio(key="trace_src_a").set_value("Local path").run()
    for path, said in ((first, "Parsed from the file in"), (second, "Reopened from the trace cache in")):
        at.text_input(key="trace_path_a").set_value(str(path)).run()
        assert not at.exception, [e.value for e in at.exception]
        assert any(c.value.startswith(said) for c in at.caption), [c.value for c in at.caption]


def test_in_house_communication_gets_a_note_and_the_page_field_counts_it(new_app, tmp_path):
    """Issue #31: kernels that look like communication but match no family are named, never a silent 0;
    the 'Communication kernels' field (the comm_kernels option) makes them communication."""
    from tests.trace.test_classify import _two_stream_trace

    _two_stream_trace(tmp_path, "acme_ring_send_recv_kernel<bf16>")
    path = tmp_path / "two_streams.json"
    at = new_app().run()
    at.switch_page("pages/traces.py").run()
    at.radio(key="trace_src_a").set_value("Local path").run()
    at.text_input(key="trace_path_a").set_value(str(path)).run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("suggest communication but match no known family" in w.value for w in at.warning)
    at.text_input(key="trace_comm_kernels").set_value("^acme_ring_").run()
    assert not at.exception, [e.value for e in at.exception]
    assert not any("suggest communication" in w.value for w in at.warning)
    fams = next(df.value for df in at.dataframe if "Family" in df.value.columns or "family" in df.value.columns)
    assert "your pattern" in set(fams.iloc[:, 0])
    assert any("Your pattern for communication kernels" in c.value for c in at.caption)


def _show_stored(plain):  # an AppTest script: History's way of showing a stored run
    from ui import views

    views.show_stored("trace", plain)


def test_a_trace_result_stored_before_its_later_parts_still_opens():
    """A trace run stored by older code, before communication families, the HTA-parity parts, the critical path
    and the trace cache: it decodes (those parts UNSET) and the view says what it predates, not an error."""
    import json

    from streamlit.testing.v1 import AppTest

    from diagnostics.registry import ANALYSES
    from diagnostics.results import UNSET, decode

    stored = Path(__file__).resolve().parents[1] / "data" / "stored" / "runs-fc36ebc-trace.json"
    plain = json.loads(next(r for r in json.loads(stored.read_text()) if r["analysis"] == "trace")["result_json"])
    later = ("communication", "kernel_sequences", "queue_length", "memcpy_bandwidth", "annotations", "launch_delay",
             "comm_overlap", "critical_path", "trace_cache", "columns_dir")
    old = {k: v for k, v in plain.items() if k not in later}
    typed = decode(ANALYSES["trace"], old)
    assert all(getattr(typed, k) is UNSET for k in later)
    at = AppTest.from_function(_show_stored, args=(old,), default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    infos = [i.value for i in at.info]
    assert "This result predates these analyses: open the trace again to compute them." in infos
    assert "This result predates communication families: open the trace again." in infos
    assert any(i.startswith("This result has no critical path") for i in infos)
    assert "Parsed from the file (this run did not record the trace cache)" in [c.value for c in at.caption]


def test_a_serving_trace_opens_on_its_serving_tab(new_app):
    """Issue #42: a vLLM trace (TraceLens' prefill + decode with piecewise HIP graphs) shows its iterations:
    phase, batch, tokens, the split and the graph replays; a training trace has no such tab."""
    at = new_app().run()
    at.switch_page("pages/traces.py").run()
    at.radio(key="trace_src_a").set_value("Local path").run()
    at.text_input(key="trace_path_a").set_value(str(DATA / "with_stack" / "vllm_prefilldecode_piecewise.json.gz")).run()
    assert not at.exception, [e.value for e in at.exception]
    labels = [t.label for t in at.tabs]
    assert labels[labels.index("Serving") + 1] == "Summary"
    md = [m.value for m in at.markdown]
    assert any("Inference server trace (vLLM): 1 iteration(s)" in m for m in md)
    assert any("25 launch(es) replayed 361 kernels" in m for m in md)
    # the iteration's figures first, its long annotation last (it pushed them off a 1280 px page)
    it = next(d.value for d in at.dataframe if "annotation" in d.value.columns)
    assert list(it.columns[:8]) == ["iteration", "phase", "batch_size", "tokens", "time_us", "gpu_busy_us", "queued_us",
                                   "host_us"]
    assert it.columns[-1] == "annotation" and it["batch_size"].tolist() == [46] and it["tokens"].tolist() == [8192]
    assert it["time_us"].tolist() == [pytest.approx(307.7, abs=0.05)]  # shown in ms, the table's one scale
    # the GPU tab's idle (the gaps in the GPU's own window) says what its window leaves out of the iteration
    assert any("The widest window is 156.5 ms of the trace's 307.7 ms" in c.value for c in at.caption)
    at.text_input(key="trace_path_a").set_value(str(DATA / "gpu_small.json")).run()
    assert not at.exception and "Serving" not in [t.label for t in at.tabs]


def _show_partial(plain):  # an AppTest script: the panel's drawing of the trace job's partial result
    from diagnostics.registry import ANALYSES
    from diagnostics.results import decode_partial
    from ui.views.traces import show_partial

    show_partial(decode_partial(ANALYSES["trace"], plain))


def test_the_summary_is_drawn_from_the_jobs_partial_result():
    """Issue #42's first answer: while the other views are computed, the page draws the Summary the job sent
    (tiles, categories, threads, steps, streams), from the partial result alone, and says the rest is coming."""
    from streamlit.testing.v1 import AppTest

    from diagnostics.analyses.trace.result import TracePartial
    from diagnostics.results import to_plain
    from diagnostics.trace import load_trace, summary

    s = summary(load_trace(DATA / "gpu_small.json"))
    plain = to_plain(TracePartial(path=str(DATA / "gpu_small.json"), name="gpu_small.json", summary=s))
    at = AppTest.from_function(_show_partial, args=(plain,), default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    values = {m.label: m.value for m in at.metric}
    assert "Events" in values and values["Steps"] == str(s.n_steps) and s.n_steps > 0
    assert values["GPU streams"] == str(len(s.streams)) and values["Threads"] == str(len(s.threads))
    assert any("the other views are being computed" in c.value for c in at.caption)
    assert len(at.get("plotly_chart")) == 1   # the categories' figure; no other view yet
    assert [t.value for t in at.markdown if t.value.startswith("**")][:3] == ["**Summary**", "**Threads**", "**Steps**"]
