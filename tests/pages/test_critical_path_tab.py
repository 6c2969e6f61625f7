"""AppTest: the Trace explorer's "Critical path" tab (issue #18) on a trace written in the test."""

import pytest


@pytest.fixture
def cp_trace(tmp_path):
    from tests.trace.test_critical_path import CPU_STEP, GPU_STEP, write

    return write(tmp_path, CPU_STEP + GPU_STEP)


def _open(new_app, path):
    at = new_app().run()
    at.switch_page("pages/traces.py").run()
    at.radio(key="trace_src_a").set_value("Local path").run()
    at.text_input(key="trace_path_a").set_value(str(path)).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _metric(at, label):
    return next(m.value for m in at.metric if m.label == label)


def test_critical_path_tab_shows_the_path_breakdown_and_what_ifs(new_app, cp_trace):
    at = _open(new_app, cp_trace)
    assert "Critical path" in [t.label for t in at.tabs]
    # the longest step by default: step 1, 430 µs, all of it on the path
    assert _metric(at, "Step") == "1"
    assert _metric(at, "To last GPU work") == "430.0 µs"   # the path's length, beside the CPU step
    assert _metric(at, "CPU step") != "n/a" and _metric(at, "GPU window") != "n/a"
    assert any("Step 1 (the longest complete step): 0.430 ms on the critical path" in c.value and "kernel" in c.value
               for c in at.caption)
    frames = [df.value for df in at.dataframe]
    what_if = next(f for f in frames if "saving_us" in f.columns)   # shown in ms, labelled "... (ms)"
    saved = dict(zip(what_if["event"], what_if["saving_us"]))
    assert saved["add_c"] == pytest.approx(0.1) and saved["gemm_a"] == pytest.approx(0.05)
    # what each what-if cuts on the path, the nested calls' time with the name's own (ms)
    nested = dict(zip(what_if["event"], what_if["sped_up_us"]))
    own = dict(zip(what_if["event"], what_if["on_path_us"]))
    assert all(nested[e] >= own[e] and saved[e] <= nested[e] / 2 + 1e-9 for e in saved)
    path = next(f for f in frames if "waited on" in f.columns)
    assert {"gemm_a", "relu_b", "add_c", "cudaDeviceSynchronize"} <= set(path["event"])
    labels = [b.proto.label for b in at.get("download_button")]
    assert "Download the step's trace with the critical path (JSON)" in labels


def _runs(analysis: str) -> int:
    from ui.jobs import get_store

    return len(get_store().list(limit=10_000, analysis=analysis))


def test_picking_another_step_shows_its_path(new_app, cp_trace):
    """Another step is the critical-path part alone, recomputed from the opened trace's kept columns: a
    trace_critical_path run, not the whole trace job (~14 parts) again."""
    at = _open(new_app, cp_trace)
    traces, parts = _runs("trace"), _runs("trace_critical_path")
    at.selectbox(key=f"cp-step-{cp_trace}").set_value(0).run()
    assert not at.exception, [e.value for e in at.exception]
    assert _metric(at, "Step") == "0" and _metric(at, "To last GPU work") == "300.0 µs"
    path = next(df.value for df in at.dataframe if "waited on" in df.value.columns)
    assert "aten::linear" in set(path["event"]) and "k_linear" not in set(path["event"])
    assert (_runs("trace"), _runs("trace_critical_path")) == (traces, parts + 1)
    # the other tabs still show the opened trace: its timeline is drawn with step 1's path over it
    assert any(m.label == "Steps" and m.value == "2" for m in at.metric)


def test_every_engine_microsecond_column_is_shown_in_ms():
    from ui.views.critical_path import _WHAT_IF_COLS, _PATH_COLS, is_us

    for cols in (_WHAT_IF_COLS, _PATH_COLS):
        for key, label in cols.items():
            assert is_us(key) == label.endswith("(ms)") or "ms from" in label, (key, label)
    assert is_us("step_us_after") and is_us("saving_us") and not is_us("calls")


def _show_stored(analysis, plain):  # an AppTest script: History's way of showing a stored run
    from ui import views

    views.show_stored(analysis, plain)


def test_a_stored_critical_path_part_opens_in_history_and_reports_its_path(cp_trace, tmp_path):
    """A trace_critical_path run (another step, from the kept columns) read back as History reads it: its
    view shows that step's path, and its HTML report has the critical path section with the path's events."""
    import json

    from streamlit.testing.v1 import AppTest

    from diagnostics.registry import ANALYSES
    from diagnostics.render.html import build_report, sections_for
    from diagnostics.results import decode, to_json
    from diagnostics.runner import Job, execute

    first = execute(Job("trace", None, {"path": str(cp_trace)}), tmp_path / "first")
    part = execute(Job("trace_critical_path", None, {"columns_dir": first.columns_dir, "critical_path_step": 0}),
                   tmp_path / "part")
    plain = json.loads(to_json(part))   # as the store keeps it
    at = AppTest.from_function(_show_stored, args=("trace_critical_path", plain), default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    assert _metric(at, "Step") == "0" and _metric(at, "To last GPU work") == "300.0 µs"
    path = next(df.value for df in at.dataframe if "waited on" in df.value.columns)
    assert list(path["event"]) == [e.name for e in part.critical_path.path]
    stored = decode(ANALYSES["trace_critical_path"], plain)
    sections, problem = sections_for("trace_critical_path", stored)
    assert problem is None and [s.title for s in sections] == ["Critical path"]   # its own layout, not the generic
    page = build_report("trace_critical_path", stored)
    assert ">Critical path<" in page and "aten::linear" in page and "aten::relu" in page
