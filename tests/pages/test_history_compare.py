"""AppTest: History compares two runs (metrics with their change) and draws a metric's trend."""

from __future__ import annotations

from pathlib import Path

import pytest

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"

METRICS_A = {"latency_median_ms": 10.0, "latency_std_ms": 0.05, "throughput_samples_per_s": 800.0,
             "batch_size": 8}
METRICS_B = {"latency_median_ms": 5.0, "latency_std_ms": 0.05, "throughput_samples_per_s": 1600.0,
             "batch_size": 8}


@pytest.fixture
def two_profiles():
    """Two finished profile runs of a model no other test uses (removed afterwards), each with a trace."""
    from ui.jobs import get_store

    store = get_store()
    ids = []
    for metrics, trace in ((METRICS_A, "diff_before.json"), (METRICS_B, "diff_after.json")):
        run_id = store.create_run("profile", spec={"source": "sample", "name": "zz"}, options={"latency_iters": 30},
                                  cache_key=None, model_label="zz-history-test", device="cpu")
        store.finish_run(run_id, "ok", result={"metrics": metrics}, artifacts={"trace.json": str(TRACES / trace)})
        ids.append(run_id)
    with store._connect() as db:  # older than the page's own runs, so the Runs tab opens a real one
        db.execute("UPDATE runs SET started = started - 86400 WHERE model_label = 'zz-history-test'")
    yield ids
    for run_id in ids:
        store.delete(run_id)


def _compare_tab(at):
    return next(t for t in at.tabs if t.label == "Compare two runs")


def test_history_compares_the_newest_run_with_the_previous_one_of_its_model(new_app, two_profiles):
    a_id, b_id = two_profiles
    at = new_app().run()
    at.switch_page("pages/history.py").run()
    assert not at.exception, [e.value for e in at.exception]
    _compare_tab(at).selectbox(key="history_cmp_b").set_value(b_id).run()
    assert not at.exception, [e.value for e in at.exception]
    tab = _compare_tab(at)
    assert tab.selectbox(key="history_cmp_a").value == a_id  # the previous run of the same model
    metrics = {m.label: m.value for m in tab.metric}
    assert metrics["Better"] == "2" and metrics["Worse"] == "0"  # latency halved, throughput doubled
    table = tab.dataframe[0].value
    lat = table[table["metric"] == "Latency (median)"].iloc[0]
    assert lat["verdict"] == "▲ better" and "(-50.0 %)" in lat["change"] and lat["ratio B/A"] == "x0.5"
    assert any("not interleaved" in c.value for c in tab.caption)

    # one click: the two runs' traces diffed (the trace_diff job, as the Trace explorer runs it)
    tab.button(key="history_trace_diff").click().run()
    assert not at.exception, [e.value for e in at.exception]
    tab = _compare_tab(at)
    counts = {m.label: m.value for m in tab.metric}
    from diagnostics.trace import diff_traces, load_trace

    expected = diff_traces(load_trace(str(TRACES / "diff_before.json")), load_trace(str(TRACES / "diff_after.json")))
    assert counts["Slower"] == str(expected.counts.slower) and counts["Added"] == str(expected.counts.added)


def test_history_trend_draws_the_models_runs(new_app, two_profiles):
    at = new_app().run()
    at.switch_page("pages/history.py").run()
    tab = next(t for t in at.tabs if t.label == "Trend")
    tab.selectbox(key="history_trend_analysis").set_value("profile").run()
    tab = next(t for t in at.tabs if t.label == "Trend")
    tab.selectbox(key="history_trend_model").set_value("zz-history-test").run()
    assert not at.exception, [e.value for e in at.exception]
    tab = next(t for t in at.tabs if t.label == "Trend")
    import json

    fig = json.loads(tab.get("plotly_chart")[0].proto.spec)
    assert fig["data"][0]["y"] == [10.0, 5.0]
    assert fig["layout"]["yaxis"]["title"]["text"] == "Latency (median) (ms)"


@pytest.fixture
def damaged_row():
    """A profile run whose row another program wrote wrong: its time and its result JSON."""
    from ui.jobs import get_store

    store = get_store()
    run_id = store.create_run("profile", spec=None, options={}, cache_key=None,
                              model_label="zz-damaged ![x](http://evil.example/a.png)", device="cpu")
    store.finish_run(run_id, "ok", result={"metrics": METRICS_A})
    with store._connect() as db:
        db.execute("UPDATE runs SET started='yesterday', result_json='{\"metrics\": [' WHERE id=?", (run_id,))
    yield run_id
    store.delete(run_id)


def test_history_lists_and_opens_a_damaged_row_with_what_is_wrong(new_app, two_profiles, damaged_row):
    at = new_app().run()
    at.switch_page("pages/history.py").run()
    assert not at.exception, [e.value for e in at.exception]
    table = at.dataframe[0].value
    row = table[table["id"] == damaged_row].iloc[0]
    assert "started 'yesterday' is not a time" in row["damaged"]
    assert set(two_profiles) <= set(table["id"])  # the other runs are listed as before
    at.selectbox(key="history_pick").set_value(damaged_row).run()
    assert not at.exception, [e.value for e in at.exception]
    warning = next(w.value for w in at.warning if "damaged in the run store" in w.value)
    assert "result\\_json is not valid JSON" in warning and "started 'yesterday' is not a time" in warning
    assert "\\!\\[x\\]\\(http\\://evil\\.example" in at.subheader[0].value  # the label shown as written
    _compare_tab(at).selectbox(key="history_cmp_b").set_value(two_profiles[1]).run()
    assert not at.exception, [e.value for e in at.exception]
