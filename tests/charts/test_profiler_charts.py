"""Profiler figures: built from a real (small) profile result; data and labelled axes checked."""

import pytest
import torch
from torch import nn

from msgspec.structs import replace

from diagnostics.analyses.profile import KernelRow
from diagnostics.analyses.profile import job as profiler
from diagnostics.render.charts import profiler as charts
from diagnostics.render.charts.style import MAX_NAME_CHARS, short_names
from diagnostics.intake import LoadedModel
from diagnostics.runner import AnalysisContext, Job
from diagnostics.spec import InputSpec, ModelSpec


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Sequential(nn.Linear(32, 32), nn.ReLU()), nn.Linear(32, 4))
    spec = ModelSpec(name="handmade")
    opts = {"mode": "train", "wait": 0, "warmup": 1, "active": 2, "latency_warmup": 1, "latency_iters": 12}
    ctx = AnalysisContext(Job("profile", spec, opts), tmp_path_factory.mktemp("charts"))
    x = torch.randn(4, 16)
    ctx._loaded = LoadedModel(spec, model, (InputSpec((4, 16)),), (x,), lambda o: o.pow(2).mean(), "mse")
    return profiler.analyze(ctx, opts)


def test_latency_histogram(result):
    fig = charts.build_latency_histogram_figure(result)
    assert list(fig.data[0].x) == list(result.latency.samples_ms)
    assert fig.layout.xaxis.title.text == "latency per iteration (ms)"
    assert "(count)" in fig.layout.yaxis.title.text
    marks = [s.x0 for s in fig.layout.shapes]
    assert marks == [result.latency.median_ms, result.latency.p90_ms, result.latency.p99_ms]


def test_step_breakdown_bars_are_the_step_phases(result):
    fig = charts.build_step_breakdown_figure(result)
    names = [t.name for t in fig.data]
    assert names[:3] == ["forward", "backward", "optimizer"]
    assert fig.layout.barmode == "stack" and fig.layout.yaxis.title.text == "time (ms)"
    for trace in fig.data:
        assert list(trace.y) == [getattr(s, f"{trace.name}_ms") for s in result.steps]
    total = [sum(t.y[i] for t in fig.data) for i in range(len(result.steps))]
    assert total == pytest.approx([s.step_ms for s in result.steps])
    split = charts.build_device_split_figure(result)
    assert [t.name for t in split.data] == ["kernel", "memcpy", "memset", "CUDA runtime", "CPU exec", "other"]
    assert split.layout.yaxis.title.text == "time (ms)"


def test_top_operators(result):
    fig = charts.build_top_operators_figure(result, n=5)
    top = sorted(result.operators, key=lambda r: -r.self_cpu_ms)[:5]
    labels = list(fig.data[0].y)  # a long name (autograd::engine::evaluate_function: ...) is shortened with '…'
    assert len(labels) == len(top) and all(label == r.name or (label.endswith("…") and r.name.startswith(label[:-1]))
                                           for label, r in zip(labels, top)), (labels, [r.name for r in top])
    assert list(fig.data[0].x) == [r.self_cpu_ms for r in top]
    assert fig.layout.xaxis.title.text == "self CPU time (ms)"
    empty = charts.build_top_operators_figure(result, by="self_device_ms")
    assert "no operator has self device time" in empty.layout.annotations[0].text


def test_module_icicle_sizes_are_self_times(result):
    fig = charts.build_module_tree_figure(result, "forward")
    ice = fig.data[0]
    mods = {m.name: m for m in result.modules if m.name != "(backward, no module)"}
    assert set(ice.ids) == set(mods) and "2.0" in mods and mods["2.0"].parent == "2"
    for i, name in enumerate(ice.ids):
        assert ice.values[i] == mods[name].forward_self_ms
        assert ice.parents[i] == (mods[name].parent or "")
    assert "ms" in fig.layout.title.text
    assert charts.build_module_tree_figure(result, "backward").data[0].type == "icicle"


def test_no_module_times_are_explained_by_the_result_or_its_setting(result):
    note = "no per-module times: a TorchScript model is a compiled graph"
    text = charts.build_module_tree_figure(replace(result, modules=(), modules_note=note)).layout.annotations[0].text
    assert text == note
    stored_before = replace(result, modules_note=None)  # a profile stored before the note
    off = replace(stored_before, modules=(), config={**result.config, "with_modules": False})
    on = replace(stored_before, modules=(), config={**result.config, "with_modules": True})
    assert charts.modules_missing(off) == "per-module times need with_modules (module ranges); it was off"
    assert charts.modules_missing(on) == "no per-module times were recorded (with_modules was on)"


def test_kernel_chart_without_and_with_kernels(result):
    assert "CUDA did not run" in charts.build_kernel_figure(result).layout.annotations[0].text
    common = dict(min_us=5.0, registers_per_thread=None, occupancy_pct=None)
    fake = replace(result, kernels=(
        KernelRow(name="sm80_xmma_gemm", calls=2, total_us=40.0, mean_us=20.0, max_us=30.0, grid="4×1×1",
                  block="128×1×1", tensor_cores=True, pct_of_kernel_time=88.9, **common),
        KernelRow(name="elementwise", calls=1, total_us=5.0, mean_us=5.0, max_us=5.0, grid=None, block=None,
                  tensor_cores=False, pct_of_kernel_time=11.1, **common)))
    fig = charts.build_kernel_figure(fake)
    assert [t.name for t in fig.data] == ["Tensor Cores", "no Tensor Cores"]
    assert list(fig.data[0].x) == [0.04] and fig.layout.xaxis.title.text == "total kernel time (ms)"


def test_kernels_alike_for_60_characters_are_two_bars_in_their_order(result):
    """CUTLASS templates share long prefixes: each kernel keeps a bar of its own (a label each, the axis'
    order that of the table), whatever its Tensor Core colour."""
    common = dict(min_us=5.0, registers_per_thread=None, occupancy_pct=None, grid=None, block=None)
    stem = "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x"
    rows = (KernelRow(name=stem + "2_tn_align8>", calls=2, total_us=40.0, mean_us=20.0, max_us=30.0,
                      tensor_cores=True, pct_of_kernel_time=50.0, **common),
            KernelRow(name="elementwise", calls=1, total_us=30.0, mean_us=30.0, max_us=30.0,
                      tensor_cores=False, pct_of_kernel_time=30.0, **common),
            KernelRow(name=stem + "1_nn_align8>", calls=1, total_us=10.0, mean_us=10.0, max_us=10.0,
                      tensor_cores=True, pct_of_kernel_time=20.0, **common))
    fig = charts.build_kernel_figure(replace(result, kernels=rows))
    order = list(fig.layout.yaxis.categoryarray)
    assert len(set(order)) == 3 and order[2] == order[0] + " (2)" and order[1] == "elementwise"
    tc = fig.data[0]
    assert list(tc.y) == [order[0], order[2]] and list(tc.x) == [0.04, 0.01]
    assert [c[5] for c in tc.customdata] == [rows[0].name, rows[2].name]


def test_timeline_lanes_and_events(result):
    fig = charts.build_timeline_figure(result)
    tl = result.timeline  # the trace layer's Timeline record (µs)
    assert sum(len(t.x) for t in fig.data) == tl.shown > 0
    assert set().union(*(set(t.y) for t in fig.data)) == {l.label for l in tl.lanes}
    assert fig.layout.xaxis.title.text == "time since the first event (ms)"
    starts = sorted(b for t in fig.data for b in t.base)
    assert 0.0 <= starts[0] and starts[-1] <= tl.t1 / 1e3
    steps = [e for e in tl.events if e.name.startswith("ProfilerStep#")]
    assert len(steps) == 2 and all(e.depth == 0 for e in steps)


def test_report_figures_keep_full_operator_names_and_make_room_for_them(result):
    """The HTML report (opened outside Streamlit): every figure's axes automargin, titles set off from
    their ticks, the top-operator bars labelled with the operators' full names, the white template
    and a colour scale on the module icicle. Read back from the figure JSON in the page."""
    from diagnostics.render.html import build_report
    from tests.charts.test_style import figures_in_report

    figs = figures_in_report(build_report("profile", result))
    assert figs
    for f in figs:
        for axis in ("xaxis", "yaxis"):
            if axis in f["layout"]:
                assert f["layout"][axis].get("automargin") is True, (f["layout"].get("title"), axis)
        assert f["layout"]["template"]["layout"]["plot_bgcolor"] == "white"
    top = next(f for f in figs if f["layout"]["title"]["text"].startswith("Top") and "operators" in
               f["layout"]["title"]["text"])
    expected = [r.name for r in sorted(result.operators, key=lambda r: -r.self_cpu_ms) if r.self_cpu_ms > 0]
    ticks = top["data"][0]["y"]
    # whole names up to the axis's width ('aten::addmm', not 'at'); a longer one ('autograd::engine::
    # evaluate_function: torch::autograd::AccumulateGrad') cut with '…' there and whole in the hover
    assert ticks == short_names(expected)[:len(ticks)] and any(len(t) > 10 for t in ticks)
    assert [c[2] for c in top["data"][0]["customdata"]] == expected[:len(ticks)]
    assert all(len(t) <= MAX_NAME_CHARS for t in ticks)
    hist = next(f for f in figs if f["layout"]["title"]["text"].startswith("Latency"))
    assert hist["layout"]["yaxis"]["title"]["standoff"] > 0
    icicle = next(d for f in figs for d in f["data"] if d["type"] == "icicle")
    assert icicle["marker"]["colorscale"] and len(icicle["marker"]["colors"]) == len(icicle["ids"])
