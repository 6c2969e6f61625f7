"""AppTest: the Profiler page runs a small profile on a sample model on CPU, then History reopens it."""

import json
from pathlib import Path


def open_profiler(new_app):
    at = new_app().run()
    at.sidebar.selectbox(key="sb_sample").set_value("mlp").run()
    at.switch_page("pages/profiler.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_profiler_page_runs_on_demand_and_shows_the_views(new_app):
    at = open_profiler(new_app)
    assert at.title[0].value == "Profiler"
    assert any("No profile yet" in i.value for i in at.info)  # not auto-run
    at.radio(key="prof_mode").set_value("train")
    at.number_input(key="prof_wait").set_value(0)
    at.number_input(key="prof_active").set_value(2)
    at.number_input(key="prof_lat_warmup").set_value(1)
    at.number_input(key="prof_lat_iters").set_value(8)
    at.button(key="prof_run").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    labels = [m.label for m in at.metric]
    assert labels[:3] == ["Median latency", "p90", "p99"]
    assert [t.label for t in at.tabs] == ["Latency", "Steps", "Operators", "Modules", "GPU kernels", "Timeline",
                                          "Trace files"]
    ops = at.dataframe[1].value  # steps table, then operators
    assert "aten::addmm" in set(ops["name"])
    assert "input_shapes" not in ops
    at.toggle(key="prof_by_shape").set_value(True).run()
    ops = at.dataframe[1].value
    assert "input_shapes" in ops and any("32, 64" in s for s in ops["input_shapes"])
    at.text_input(key="prof_op_filter").set_value("addmm").run()
    names = set(at.dataframe[1].value["name"])
    assert "aten::addmm" in names and all("addmm" in n.lower() for n in names) and len(names) < len(ops)
    modules = at.dataframe[2].value
    assert {"(model)", "fc1", "fc2", "head"} <= set(modules["name"])
    assert (modules["backward_ms"] > 0).any()
    # the trace files are on disk and named in the result
    from ui.jobs import get_store
    run = get_store().get(get_store().list(analysis="profile")[0].id)
    trace = json.loads(Path(run.result["artifacts"]["trace_json"]).read_text())
    assert trace["distributedInfo"]["rank"] == 0
    assert {"trace.json", "trace.json.gz", "tb_trace.zip"} <= set(run.artifacts)

    # a rerun with the same settings shows the stored result without recomputing
    at2 = open_profiler(new_app)
    at2.radio(key="prof_mode").set_value("train")
    at2.number_input(key="prof_wait").set_value(0)
    at2.number_input(key="prof_active").set_value(2)
    at2.number_input(key="prof_lat_warmup").set_value(1)
    at2.number_input(key="prof_lat_iters").set_value(8).run()
    assert not any("No profile yet" in i.value for i in at2.info)
    assert at2.metric[0].label == "Median latency"

    at2.switch_page("pages/history.py").run()
    assert not at2.exception, [e.value for e in at2.exception]
    assert "profile" in at2.subheader[0].value
    assert [m.label for m in at2.metric][:1] == ["Median latency"]
