"""AppTest: the Distributed page loads hand-made per-rank traces from a folder and launches a run."""

from pathlib import Path

import pytest

PAIR = str(Path(__file__).resolve().parents[1] / "data" / "distributed" / "pair")


def _open(new_app):
    at = new_app().run()
    at.switch_page("pages/distributed.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_page_loads_a_trace_folder_and_flags_the_straggler(new_app):
    at = _open(new_app)
    assert at.title[0].value == "Distributed"
    at.radio(key="dist_mode").set_value("Load per-rank traces from a folder").run()
    at.number_input(key="dist_margin").set_value(10.0)
    at.number_input(key="dist_min_ms").set_value(0.1)
    at.text_input(key="dist_folder").set_value(PAIR).run()
    at.button(key="dist_load").click().run()
    assert not at.exception, [e.value for e in at.exception]
    labels = [m.label for m in at.metric]
    assert labels[:3] == ["Median step", "Slowest step", "Communication"]
    assert at.metric[labels.index("Stragglers")].value == "rank 1"
    assert at.metric[labels.index("Overlap")].value == "14.7 %"  # 120 / 815
    assert any("Straggler: rank 1" in w.value and "0.79 ms" in w.value for w in at.warning)
    ranks = at.dataframe[0].value
    assert list(ranks["rank"]) == [0, 1] and list(ranks["straggler"]) == [False, True]
    coll = at.dataframe[1].value
    assert coll.iloc[0]["name"] == "gloo:all_reduce" and coll.iloc[0]["calls"] == 4


def test_page_reports_a_missing_folder(new_app):
    at = _open(new_app)
    at.radio(key="dist_mode").set_value("Load per-rank traces from a folder").run()
    at.text_input(key="dist_folder").set_value("/nonexistent/traces").run()
    at.button(key="dist_load").click().run()
    assert not at.exception
    assert any("trace folder not found: /nonexistent/traces" in e.value for e in at.error)


@pytest.mark.slow
def test_page_launches_a_two_process_run(new_app):
    at = _open(new_app)
    at.sidebar.selectbox(key="sb_sample").set_value("mlp").run()
    assert "backend **gloo**" in at.caption[0].value
    at.number_input(key="dist_steps").set_value(3).run()
    at.button(key="dist_run").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.metric[0].label == "Median step"
    # A clean run flags nobody: the 10 ms floor over the median busy time absorbs scheduler noise.
    labels = [m.label for m in at.metric]
    assert at.metric[labels.index("Stragglers")].value == "none"
    assert any("No straggler" in s.value for s in at.success)
    ranks = at.dataframe[0].value
    assert list(ranks["rank"]) == [0, 1]
    assert (ranks["comm_ms"] > 0).all() and (ranks["compute_ms"] > 0).all()
    assert (ranks["busy_ms"] <= ranks["step_ms"]).all()
