"""Memory, batch-scan and gradient figures: built from real small results; data and units checked."""

import msgspec
import pytest
import torch
from torch import nn

from diagnostics.analyses.gradients import job as gradients

from diagnostics.analyses.memory import MemoryTimeline
from diagnostics.analyses.memory import job as memory

from diagnostics.analyses.batch_scan import ANALYSIS as BATCH_SCAN
from diagnostics.analyses.batch_scan import job as memory_scan
from diagnostics.render.charts import gradients as gcharts
from diagnostics.render.charts import memory as mcharts
from diagnostics.intake import LoadedModel, default_loss
from diagnostics.results import decode
from diagnostics.runner import AnalysisContext, Job
from diagnostics.spec import InputSpec, ModelSpec

MIB = 2**20


def _ctx(tmp, analysis, model, x, options):
    ctx = AnalysisContext(Job(analysis, ModelSpec(), options), tmp)
    ctx._loaded = LoadedModel(ModelSpec(name="handmade"), model, (InputSpec(tuple(x.shape)),), (x,), default_loss, "mse")
    return ctx


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.Sigmoid(), nn.Linear(64, 4))


@pytest.fixture(scope="module")
def mem(tmp_path_factory):
    return memory.analyze(_ctx(tmp_path_factory.mktemp("m"), "memory", _model(), torch.randn(16, 32), {}), {})


@pytest.fixture(scope="module")
def scan(tmp_path_factory):
    opts = {"max_batch": 8, "mode": "inference", "repeats": 1}
    return memory_scan.analyze(_ctx(tmp_path_factory.mktemp("s"), "batch_scan", _model(), torch.randn(4, 32), opts),
                               opts)


@pytest.fixture(scope="module")
def grads(tmp_path_factory):
    opts = {"steps": 3}
    return gradients.analyze(_ctx(tmp_path_factory.mktemp("g"), "gradients", _model(), torch.randn(16, 32), opts),
                             opts)


def test_breakdown_stacks_categories_in_mib(mem):
    fig = mcharts.build_memory_breakdown_figure(mem)
    assert fig.layout.barmode == "stack" and fig.layout.yaxis.title.text == "memory (MiB)"
    by_name = {t.name: t for t in fig.data}
    assert by_name["parameters"].y[-1] == pytest.approx(mem.accounting.parts["parameters"] / MIB)
    # the accounting bar adds up to at least the measured peak, drawn as a line
    assert sum(t.y[-1] for t in fig.data) >= mem.metrics.peak_train_bytes / MIB - 1e-9
    assert fig.layout.shapes[0].y0 == pytest.approx(mem.metrics.peak_train_bytes / MIB)


def test_layer_activation_bars(mem):
    fig = mcharts.build_layer_activation_figure(mem)
    saved = {y: x for y, x in zip(fig.data[0].y, fig.data[0].x)}
    # ReLU and Sigmoid save their [16, 64] outputs; the next Linear saves the same storage as its
    # input, which counts once, for the module that saved it first
    assert saved["1 (ReLU)"] == saved["3 (Sigmoid)"] == pytest.approx(16 * 64 * 4 / MIB)
    assert saved["2 (Linear)"] == 0
    assert fig.layout.xaxis.title.text == "memory (MiB)"


def test_timeline_is_stacked_over_time(mem):
    fig = mcharts.build_memory_timeline_figure(mem)
    assert all(t.stackgroup == "mem" for t in fig.data)
    assert list(fig.data[0].x) == list(mem.timeline.times_ms)
    assert fig.layout.xaxis.title.text == "time since the step started (ms)"
    assert fig.layout.yaxis.title.text == "memory (MiB)"
    assert {a.text for a in fig.layout.annotations} >= {"forward", "backward", "optimizer"}


def test_timeline_falls_back_to_phases(mem):
    r = msgspec.structs.replace(mem, phases_ms={}, timeline=MemoryTimeline(
        phases_only=True, labels=("start", "end"), series={"parameters": [MIB, MIB]}, source="x"))
    fig = mcharts.build_memory_timeline_figure(r)
    assert list(fig.data[0].x) == ["start", "end"] and list(fig.data[0].y) == [1.0, 1.0]
    assert fig.layout.xaxis.title.text == "phase"


def test_estimate_bars_show_the_error(mem):
    fig = mcharts.build_estimate_figure(mem)
    bar = fig.data[0]
    assert bar.y[-1] == pytest.approx(mem.metrics.peak_train_bytes / MIB)
    assert bar.text[1] == f"{mem.estimate.estimates[1].error_pct:+.1f} %"
    assert fig.layout.yaxis.title.text == "memory (MiB)"


def test_batch_scan_panels(scan):
    fig = mcharts.build_batch_scan_figure(scan)
    assert list(fig.data[0].x) == [1, 2, 4, 8]
    assert list(fig.data[0].y) == [r.latency_ms for r in scan.rows]
    assert fig.layout.yaxis.title.text == "latency (ms)"
    assert fig.layout.yaxis2.title.text == "samples/s"
    # The default budget (half the free RAM) dwarfs this model's peaks: the memory panel goes log.
    assert scan.budget.bytes > 4 * max(r.peak_bytes for r in scan.rows)
    assert fig.layout.yaxis3.type == "log" and fig.layout.yaxis3.title.text == "peak (MiB, log scale)"
    assert fig.layout.xaxis3.title.text == "batch size (samples, log scale)"
    assert fig.layout.shapes[-1].y0 == pytest.approx(scan.budget.bytes / MIB)  # the budget line


def test_batch_scan_marks_failures():
    r = decode(BATCH_SCAN, {
        "model": "m", "device": "cpu", "options": {}, "mode": "train", "search": [], "stopped": None, "summary": "",
        "memory_source": "", "timing_source": "", "budget": {"bytes": 2 * MIB, "source": "set by the user"},
        "metrics": {"largest_batch_under_budget": 1, "budget_bytes": 2 * MIB, "stopped_at_batch": 2,
                    "max_throughput": 1000.0, "best_throughput_batch": 1, "probes": 2},
        "rows": [{"batch": 1, "fits": True, "latency_ms": 1.0, "throughput": 1000.0, "peak_bytes": MIB,
                  "reserved_bytes": None},
                 {"batch": 2, "fits": False, "reason": "out of memory", "peak_bytes": None, "reserved_bytes": None,
                  "latency_ms": None, "throughput": None}]})
    fig = mcharts.build_batch_scan_figure(r)
    failed = [t for t in fig.data if t.name == "over budget / out of memory"][0]
    assert list(failed.x) == [2] and list(failed.customdata) == ["out of memory"]
    assert fig.layout.yaxis3.type is None and fig.layout.yaxis3.title.text == "peak (MiB)"  # budget near the peaks


def test_grad_norm_depth_is_log_scale_and_coloured(grads):
    fig = gcharts.build_grad_norm_depth_figure(grads)
    assert fig.layout.yaxis.type == "log"
    assert fig.layout.yaxis.title.text == "gradient L2 norm (log scale)"
    healthy = [t for t in fig.data if t.name == "healthy"][0]
    assert list(healthy.y) == [l.grad_norm_mean for l in grads.layers]


def test_heatmap_is_log10_of_the_norm(grads):
    fig = gcharts.build_grad_heatmap_figure(grads)
    hm = fig.data[0]
    assert list(hm.y) == [l.layer for l in grads.layers] and list(hm.x) == [1, 2, 3]
    first = next(s for s in grads.steps if s.step == 1 and s.layer == "0")
    import math
    assert hm.z[0][0] == pytest.approx(math.log10(first.grad_norm))
    assert fig.layout.xaxis.title.text == "training step"


def test_global_norm_and_activation_health(grads):
    fig = gcharts.build_global_norm_figure(grads)
    assert list(fig.data[0].y) == [g.global_norm for g in grads.global_norms]
    assert fig.layout.yaxis.type == "log" and "loss" in fig.layout.yaxis2.title.text
    fig = gcharts.build_activation_health_figure(grads)
    assert list(fig.data[0].x) == ["1 (ReLU)", "3 (Sigmoid)"]
    assert fig.data[0].y[0] == pytest.approx(100 * grads.activations[0].dead_fraction)
    assert fig.data[1].y[1] == pytest.approx(100 * grads.activations[1].saturated_fraction)
    assert fig.layout.yaxis.title.text == "share of units (%)"
