"""Roofline: the row arithmetic on known numbers, the op counts against hand counts, and MFU of a
profiled step recomputed from its FLOPs, its measured latency and the reported roof."""

import pytest
import torch
from torch import nn

from torch.profiler import ProfilerActivity, profile

from diagnostics.measure.roofline import (count_ops, counted_times, datasheet, footprint, measure_roofs, memory_roof,
                                           mfu, op_nesting, roofline_rows)
from diagnostics.runner import Job, execute
from diagnostics.spec import ModelSpec

ROOFS = {"peak_flops": 100e9, "bandwidth_bytes_per_s": 10e9}  # ridge at 10 FLOP/byte


def test_rows_place_each_op_against_its_roof():
    ops = {"aten::mm": {"flops": 2e9, "bytes": 40e6, "calls": 2},          # 50 FLOP/B: compute-bound
           "aten::relu": {"flops": 0, "bytes": 100e6, "calls": 1},         # memory-bound by its bytes
           "aten::view": {"flops": 0, "bytes": 0, "calls": 4}}             # moves nothing: no row
    rows = {r["op"]: r for r in roofline_rows(ops, {"aten::mm": 40.0, "aten::relu": 5.0, "aten::view": 0.1}, ROOFS)}
    mm, relu = rows["aten::mm"], rows["aten::relu"]
    assert set(rows) == {"aten::mm", "aten::relu"}
    assert mm["intensity"] == 50 and mm["bound"] == "compute" and mm["roof_ms"] == pytest.approx(20.0)
    assert mm["achieved_tflops"] == pytest.approx(2e9 / 0.040 / 1e12) and mm["headroom_ms"] == pytest.approx(20.0)
    assert mm["pct_of_roof"] == pytest.approx(50.0) and not mm["above_roof"]
    assert relu["bound"] == "memory" and relu["roof_ms"] == pytest.approx(10.0) and relu["above_roof"]  # 2x faster
    assert mfu(2e9, 40.0, 100e9) == pytest.approx(0.5) and mfu(0, 1, 1) is None


def test_small_ops_are_held_to_the_cache_roof():
    roofs = {**ROOFS, "cache_bandwidth_bytes_per_s": 40e9, "cache_op_bytes": 1 << 20}
    ops = {"aten::relu": {"flops": 0, "bytes": 2 * 500_000, "calls": 2},   # 0.5 MB per call: in cache
           "aten::add": {"flops": 0, "bytes": 8_000_000, "calls": 2}}      # 4 MB per call: DRAM
    rows = {r["op"]: r for r in roofline_rows(ops, {"aten::relu": 0.05, "aten::add": 1.0}, roofs)}
    assert rows["aten::relu"]["memory_roof"] == "cache" and rows["aten::relu"]["roof_ms"] == pytest.approx(0.025)
    assert rows["aten::add"]["memory_roof"] == "DRAM" and rows["aten::add"]["roof_ms"] == pytest.approx(0.8)


def test_each_op_is_held_to_the_largest_copy_that_moves_no_more_than_it_does():
    """A working set no larger than the op's is at least as fast as any level its data can live in: the roof
    never falls below what the op can reach (the next larger copy's did: a 1.3 MB add at 131 %)."""
    curve = [[1 << 20, 200e9], [8 << 20, 150e9], [256 << 20, 15e9]]
    roofs = {**ROOFS, "bandwidth_curve": curve}
    assert memory_roof(512 << 10, roofs) == (200e9, "cache")  # smaller than every copy: the smallest's
    assert memory_roof(4 << 20, roofs) == (200e9, "cache")    # between 1 and 8 MiB: the 1 MiB copy's
    assert memory_roof(100 << 20, roofs) == (150e9, "cache")  # the 8 MiB copy's, not DRAM's
    assert memory_roof(1 << 30, roofs) == (15e9, "DRAM")      # past the largest copy: DRAM
    ops = {"aten::relu_": {"flops": 0, "bytes": 2 * (2 << 20), "calls": 2}}  # 2 MiB per call, in cache
    (row,) = roofline_rows(ops, {"aten::relu_": 0.05}, roofs)
    assert row["memory_roof"] == "cache" and row["roof_ms"] == pytest.approx((4 << 20) / 200e9 * 1e3)


def _conv_relu_profile():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(inplace=True)).eval()
    x = torch.randn(4, 3, 32, 32)
    with torch.inference_mode():
        ops, count = count_ops(lambda: model(x), "Sequential")
        model(x)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            model(x)
    return ops, count, prof.events()


def test_a_counted_op_is_timed_with_the_children_that_do_its_work():
    """FlopCounterMode counts a convolution at aten::convolution, whose work runs in its child
    aten::mkldnn_convolution; ReLU's in aten::clamp_min_ under aten::relu_. Their self times put the
    CPU convolution at 26,324 % of its roof (issue #31); each counted op's inclusive time does not."""
    ops, count, events = _conv_relu_profile()
    assert count.by_op["aten::convolution"] > 0 and "aten::mkldnn_convolution" not in ops  # counted at the top
    times = counted_times(op_nesting(events), frozenset(ops), steps=1)
    by_name = {}
    for e in events:
        by_name.setdefault(e.name, []).append(e)
    (conv,) = by_name["aten::convolution"]
    (inner,) = by_name["aten::mkldnn_convolution"]
    assert times["aten::convolution"] == pytest.approx(conv.cpu_time_total / 1e3)
    assert times["aten::convolution"] >= inner.cpu_time_total / 1e3 > conv.self_cpu_time_total / 1e3
    (relu,) = by_name["aten::relu_"]
    assert times["aten::relu_"] == pytest.approx(relu.cpu_time_total / 1e3)
    assert times["aten::relu_"] > relu.self_cpu_time_total / 1e3
    # an aten::empty inside the convolution is the convolution's work, not a counted call of its own
    assert "aten::empty" not in ops or times.get("aten::empty", 0.0) < sum(
        e.cpu_time_total for e in by_name.get("aten::empty", [])) / 1e3 + 1e-9


def test_counted_flops_and_bytes_of_a_linear_layer():
    lin, x = nn.Linear(64, 32), torch.randn(16, 64)
    ops, count = count_ops(lambda: lin(x), "Linear")
    total = count.total
    assert count.by_module == {"": total} and count.not_counted == {}
    assert ops["aten::addmm"]["flops"] == 2 * 16 * 64 * 32 == total
    four = 4  # float32
    assert ops["aten::addmm"]["bytes"] == four * (32 + 16 * 64 + 64 * 32 + 16 * 32)  # bias, x, W^T, out
    assert ops["aten::t"]["bytes"] == 0  # a view moves nothing


def test_a_broadcast_input_counts_its_own_memory_once():
    """x + bias with the bias expanded over the rows: the bias is 32 floats in memory, read again from cache,
    not 16 x 32 (the counted bytes against an independent sum of what lies in memory)."""
    x, bias = torch.randn(16, 32), torch.randn(32)
    ops, _ = count_ops(lambda: torch.add(x, bias.expand(16, 32)))
    assert ops["aten::add"]["bytes"] == 4 * (16 * 32 + 32 + 16 * 32)  # x, the bias once, the output
    assert footprint(bias.expand(16, 32)) == 4 * 32 and footprint(x) == 4 * 16 * 32
    assert footprint(x[:, :8]) == 4 * 16 * 8  # a slice is its elements (no stride 0)


def test_a_gather_counts_the_elements_its_index_reads_not_the_whole_source():
    """nll_loss reads one log-prob per target, an embedding the rows its indices name: counting the whole
    N x C input put aten::nll_loss_forward above its roof in CI. Checked against hand counts."""
    logp, target = torch.randn(64, 1000).log_softmax(1), torch.randint(0, 1000, (64,))
    ops, _ = count_ops(lambda: nn.functional.nll_loss(logp, target))
    assert ops["aten::nll_loss_forward"]["bytes"] == 4 * 64 + 8 * 64 + 4 + 4  # 64 log-probs, targets, loss, weight sum
    table, idx = torch.randn(5000, 32), torch.randint(0, 5000, (8, 10))
    ops, _ = count_ops(lambda: nn.functional.embedding(idx, table))
    assert ops["aten::embedding"]["bytes"] == 4 * 80 * 32 + 8 * 80 + 4 * 80 * 32  # 80 rows read, indices, out
    cols = torch.tensor([0, 1])
    ops, _ = count_ops(lambda: torch.index_select(table, 1, cols))
    assert ops["aten::index_select"]["bytes"] == 4 * 5000 * 2 + 8 * 2 + 4 * 5000 * 2  # two columns, along dim 1
    small = torch.randn(4, 3)  # an index reading more than the source: the source once
    ops, _ = count_ops(lambda: torch.index_select(small, 0, torch.zeros(10, dtype=torch.long)))
    assert ops["aten::index_select"]["bytes"] == 4 * 12 + 8 * 10 + 4 * 30


def test_measured_roofs_are_plausible_and_named():
    r = measure_roofs("cpu", reps=3)
    assert 1e8 < r["peak_flops"] < 1e14 and 1e8 < r["bandwidth_bytes_per_s"] < 1e13
    assert r["peak_flops"] == max(r["gemm_rates"].values())  # the roof is the best size, not one size
    assert r["ridge_intensity"] == pytest.approx(r["peak_flops"] / r["bandwidth_bytes_per_s"])
    bws = [bw for _, bw in r["bandwidth_curve"]]
    assert bws == sorted(bws, reverse=True) and r["bandwidth_bytes_per_s"] == bws[-1]
    assert r["cache_bandwidth_bytes_per_s"] == bws[0] >= r["bandwidth_bytes_per_s"]
    assert r["datasheet"] is None and "torch.mm" in r["method"] and "1x1 convolutions (oneDNN)" in r["method"]
    # on the CPU the compute roof is the best of MKL's mm and oneDNN's convolution (AVX2 vs AVX-512 on AMD)
    assert {"256", "512", "1024", "conv1x1 c256", "conv1x1 c512"} == set(r["gemm_rates"])
    assert datasheet("NVIDIA H100 80GB HBM3", "bfloat16")["peak_flops"] == 989e12


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    return execute(Job("profile", ModelSpec(name="mlp", batch_size=32),
                       {"active": 2, "latency_iters": 10, "latency_warmup": 2}), tmp_path_factory.mktemp("p"))


def test_profile_mfu_is_recomputed_from_flops_latency_and_the_roof(profiled):
    m = profiled.metrics
    d_in, h, c, b = 64, 128, 10, 32
    assert m.model_flops_per_step == 2 * b * (d_in * h + h * h + h * c)  # three Linear layers, inference
    assert m.mfu == pytest.approx(m.model_flops_per_step / (m.latency_median_ms / 1e3) / m.peak_flops)
    assert 0 < m.mfu <= 1
    assert m.peak_flops == profiled.roofs.peak_flops


def test_module_mfu_is_its_flops_over_its_time_and_the_peak(profiled):
    rows = {r.name: r for r in profiled.modules}
    steps = len(profiled.steps)
    fc1 = rows["fc1"]
    assert fc1.flops == 2 * 32 * 64 * 128
    t_ms = (fc1.forward_ms + (fc1.backward_ms or 0)) / steps
    assert fc1.mfu == pytest.approx(fc1.flops / (t_ms / 1e3) / profiled.metrics.peak_flops)
    assert rows["(model)"].flops == profiled.metrics.model_flops_per_step
    assert rows["act1"].flops is None and rows["act1"].mfu is None  # ReLU: no FLOPs counted, no MFU


def test_profile_roofline_rows_and_no_matmul_above_its_roof(profiled):
    rows = {r.op: r for r in profiled.roofline}
    assert "aten::addmm" in rows and rows["aten::addmm"].calls == 3
    assert rows["aten::addmm"].bound in ("compute", "memory") and rows["aten::addmm"].time_ms > 0
    assert not any(r.above_roof for r in profiled.roofline)
    assert profiled.metrics.roofline_headroom_ms == pytest.approx(sum(r.headroom_ms for r in rows.values()))
