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
    assert [t.label for t in at.tabs] == ["Latency", "Steps", "Operators", "Roofline", "Modules", "GPU kernels",
                                          "Timeline", "Trace files"]
    assert "MFU" in labels and "Above the roofs" in labels
    ops = at.dataframe[1].value  # steps table, then operators
    assert "aten::addmm" in set(ops["name"])
    assert "input_shapes" not in ops
    at.toggle(key="prof_by_shape").set_value(True).run()
    ops = at.dataframe[1].value
    assert "input_shapes" in ops and any("32, 64" in s for s in ops["input_shapes"])
    at.text_input(key="prof_op_filter").set_value("addmm").run()
    names = set(at.dataframe[1].value["name"])
    assert "aten::addmm" in names and all("addmm" in n.lower() for n in names) and len(names) < len(ops)
    roof = at.dataframe[2].value  # the roofline table
    assert "aten::addmm" in set(roof["op"]) and set(roof["bound"]) <= {"compute", "memory"}
    modules = at.dataframe[3].value
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


def _show_result(result):
    from ui.views.profiler import show

    show(result)


def test_view_shows_gpu_kernels_and_device_split_when_cuda_ran(tmp_path):
    """The CUDA-only parts of the view, fed a CPU result with recorded kernels added."""
    from streamlit.testing.v1 import AppTest

    from diagnostics.runner import Job, execute
    from diagnostics.spec import ModelSpec

    result = execute(Job("profile", ModelSpec(name="mlp", batch_size=4),
                         {"wait": 0, "warmup": 1, "active": 1, "latency_warmup": 0, "latency_iters": 3}), tmp_path)
    from msgspec.structs import replace

    from diagnostics.analyses.profile import KernelRow

    common = dict(registers_per_thread=None, occupancy_pct=None)
    result = replace(result, cuda_ran=True, kernels=(
        KernelRow(name="sm80_xmma_gemm_f16f16", calls=3, total_us=30.0, mean_us=10.0, max_us=12.0, min_us=8.0,
                  grid="4×1×1", block="128×1×1", tensor_cores=True, pct_of_kernel_time=75.0, **common),
        KernelRow(name="elementwise_kernel", calls=2, total_us=10.0, mean_us=5.0, max_us=6.0, min_us=4.0, grid=None,
                  block=None, tensor_cores=False, pct_of_kernel_time=25.0, **common)),
        metrics=replace(result.metrics, kernel_time_ms=0.04, tensor_core_kernel_pct=75.0))
    at = AppTest.from_function(_show_result, args=(result,), default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("75.0% of kernel time on Tensor Cores" in c.value for c in at.caption)
    kernels = next(d.value for d in at.dataframe if "tensor_cores" in d.value)
    assert list(kernels["name"]) == ["sm80_xmma_gemm_f16f16", "elementwise_kernel"]
    ops = next(d.value for d in at.dataframe if "self_cpu_ms" in d.value)
    assert "self_device_ms" in ops  # device columns appear when CUDA ran
