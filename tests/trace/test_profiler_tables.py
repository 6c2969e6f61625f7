"""The profiler page's views on hand-made traces: step phases, device split, modules, kernels, timeline."""

import json

import msgspec
import pytest

from diagnostics.results import UNSET
from diagnostics.trace import load_trace
from diagnostics.trace import profiler_tables as pv
from diagnostics.trace.timeline import timeline_data


def X(name, ts, dur, cat="cpu_op", tid=1, pid=1, **args):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat, "pid": pid, "tid": tid, "args": args}


@pytest.fixture
def trace_of(tmp_path):
    def make(events, meta=()):
        p = tmp_path / f"t{len(list(tmp_path.iterdir()))}.json"
        p.write_text(json.dumps({"traceEvents": list(events) + list(meta)}))
        return load_trace(p)
    return make


def test_step_breakdown_counts_the_phases_on_the_steps_thread(trace_of):
    t = trace_of([
        X("ProfilerStep#3", 0, 100, "user_annotation"),
        X("zero_grad", 0, 5, "user_annotation"),
        X("forward", 10, 40, "user_annotation"),
        X("backward", 50, 30, "user_annotation"),
        X("backward", 60, 10, "user_annotation", tid=2),   # another thread: not this step's
        X("optimizer", 85, 10, "user_annotation"),
        X("ProfilerStep#4", 120, 50, "user_annotation"),
        X("forward", 125, 20, "user_annotation"),
        X("forward", 180, 5, "user_annotation"),           # after the step
    ])
    a, b = pv.step_breakdown(t)
    assert (a["step"], a["step_ms"]) == (3, 0.1)
    assert (a["zero_grad_ms"], a["forward_ms"], a["backward_ms"], a["optimizer_ms"]) == pytest.approx(
        (0.005, 0.04, 0.03, 0.01))
    assert a["other_ms"] == pytest.approx(0.015)
    assert (b["step"], b["forward_ms"], b["backward_ms"]) == (4, pytest.approx(0.02), 0.0)
    assert pv.step_breakdown(trace_of([X("aten::mm", 0, 10)])) == []


def test_device_split_gives_each_moment_to_the_highest_priority_category(trace_of):
    t = trace_of([
        X("ProfilerStep#1", 0, 100, "user_annotation"),
        X("aten::mm", 10, 40),                                    # cpu 10..50
        X("cudaLaunchKernel", 20, 10, "cuda_runtime"),            # runtime 20..30 (under cpu)
        X("gemm", 25, 30, "kernel", pid=0, tid=7),                # kernel 25..55
        X("Memcpy HtoD", 60, 10, "gpu_memcpy", pid=0, tid=7),     # memcpy 60..70
        X("ProfilerStep#2", 120, 50, "user_annotation"),
        X("Memset", 150, 40, "gpu_memset", pid=0, tid=7),         # runs past the last step's end
    ])
    rows = pv.device_split(t)
    assert [r["step"] for r in rows] == [1, 2]
    a, b = rows
    assert a["window_ms"] == pytest.approx(0.120)  # to the next step's start
    assert a["kernel_ms"] == pytest.approx(0.030)
    assert a["runtime_ms"] == pytest.approx(0.005)   # 20..25, then the kernel covers it
    assert a["cpu_exec_ms"] == pytest.approx(0.010)  # 10..20
    assert a["memcpy_ms"] == pytest.approx(0.010)
    assert a["other_ms"] == pytest.approx(0.120 - 0.055)
    assert b["window_ms"] == pytest.approx(0.070)  # 120 .. end of the memset at 190
    assert b["memset_ms"] == pytest.approx(0.040)
    for r in rows:
        assert sum(r[f"{c}_ms"] for c in pv.SPLIT_CATEGORIES) == pytest.approx(r["window_ms"])


def _module_events():
    """A forward of (model) = [0: linear, 1: relu] and its backward, as the profiler job labels them.
    Backward nodes carry the sequence number of the forward op that made them; a Python frame of the
    pre-hook overhangs the start of module::0's range, as with_stack records it."""
    return [
        X("forward", 10, 390, "user_annotation"),
        X("module::(model)", 20, 370, "user_annotation"),
        X("job.py(140): pre", 25, 7, "python_function"),
        X("module::0", 30, 170, "user_annotation"),
        X("aten::linear", 40, 150, **{"Sequence number": 5, "Fwd thread id": 0}),
        X("aten::addmm", 50, 130, **{"Sequence number": 5}),
        X("module::1", 210, 170, "user_annotation"),
        X("aten::relu", 220, 150, **{"Sequence number": 6, "Fwd thread id": 0}),
        X("backward", 400, 500, "user_annotation"),
        X("autograd::engine::evaluate_function: ReluBackward0", 410, 90,
          **{"Sequence number": 6, "Fwd thread id": 1}),
        X("autograd::engine::evaluate_function: AddmmBackward0", 510, 190,
          **{"Sequence number": 5, "Fwd thread id": 1}),
        X("autograd::engine::evaluate_function: AddmmBackward0", 520, 50,   # nested: inside the outer one
          **{"Sequence number": 5, "Fwd thread id": 1}),
        X("aten::mm", 530, 30, **{"Sequence number": 5, "Fwd thread id": 1}),  # a backward op, not a forward one
        X("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", 710, 10),
    ]


def test_module_times_forward_ranges_and_backward_by_sequence_number(trace_of):
    rows = {r["name"]: r for r in pv.module_times(trace_of(_module_events()), {"0": "Linear", "1": "ReLU"})}
    assert list(rows) == ["(model)", "0", "1", "(backward, no module)"]
    root, lin, relu, rest = rows.values()
    assert (lin["type"], lin["parent"], lin["calls"], root["parent"]) == ("Linear", "(model)", 1, None)
    assert (lin["forward_ms"], relu["forward_ms"], root["forward_ms"]) == pytest.approx((0.17, 0.17, 0.37))
    assert root["forward_self_ms"] == pytest.approx(0.03)
    assert (lin["backward_self_ms"], relu["backward_self_ms"]) == pytest.approx((0.19, 0.09))
    assert (root["backward_ms"], root["backward_self_ms"]) == (pytest.approx(0.28), 0.0)
    assert rest["backward_ms"] == pytest.approx(0.01)  # AccumulateGrad has no sequence number


def test_module_times_sums_profiler_cycles(trace_of):
    one = trace_of(_module_events())
    shifted = [dict(e, ts=e["ts"] + 1000) for e in _module_events()]
    two = pv.module_times([one, trace_of(shifted)])
    rows = {r["name"]: r for r in two}
    assert rows["0"]["calls"] == 2 and rows["0"]["forward_ms"] == pytest.approx(0.34)
    assert rows["1"]["backward_self_ms"] == pytest.approx(0.18)


def test_kernel_table_groups_and_flags_tensor_cores(trace_of):
    t = trace_of([
        X("sm80_xmma_gemm_f16f16_f16f32", 0, 10, "kernel", grid=[4, 1, 1], block=[128, 1, 1],
          **{"registers per thread": 96, "est. achieved occupancy %": 25}),
        X("sm80_xmma_gemm_f16f16_f16f32", 20, 30, "kernel", grid=[8, 1, 1], block=[128, 1, 1]),
        X("vectorized_elementwise_kernel", 60, 5, "kernel"),
        X("aten::mm", 0, 70),
    ])
    rows = pv.kernel_table(t)
    assert [r["name"] for r in rows] == ["sm80_xmma_gemm_f16f16_f16f32", "vectorized_elementwise_kernel"]
    g, e = rows
    assert (g["calls"], g["total_us"], g["mean_us"], g["max_us"], g["min_us"]) == (2, 40, 20, 30, 10)
    assert (g["grid"], g["block"], g["registers_per_thread"], g["occupancy_pct"]) == ("4×1×1", "128×1×1", 96, 25.0)
    assert g["tensor_cores"] and not e["tensor_cores"]
    assert (e["grid"], e["block"], e["registers_per_thread"], e["occupancy_pct"]) == (None, None, None, None)
    assert g["pct_of_kernel_time"] == pytest.approx(100 * 40 / 45)
    assert pv.kernel_table(trace_of([X("aten::mm", 0, 70)])) == []


def test_tensor_core_pct_is_the_tensor_core_kernels_share_of_kernel_time(trace_of):
    """The profile's tensor_core_kernel_pct: 60 µs of Tensor Core gemm (an fp16 xmma kernel), 25 µs
    of fp32 sgemm on CUDA cores and 15 µs elementwise: 60 / 100."""
    t = trace_of([
        X("sm80_xmma_gemm_f16f16_f16f32_f32_nn_n_tilesize128x128x32", 0, 40, "kernel"),
        X("sm80_xmma_gemm_f16f16_f16f32_f32_nn_n_tilesize128x128x32", 50, 20, "kernel"),
        X("ampere_sgemm_128x64_nn", 80, 25, "kernel"),
        X("void at::native::vectorized_elementwise_kernel<4>", 110, 15, "kernel"),
        X("aten::mm", 0, 130),  # host time is not kernel time
    ])
    assert pv.tensor_core_pct(pv.kernel_table(t)) == pytest.approx(100 * 60 / (40 + 20 + 25 + 15))
    assert pv.tensor_core_pct(pv.kernel_table(trace_of([X("ampere_sgemm_128x64_nn", 0, 9, "kernel")]))) == 0.0
    assert pv.tensor_core_pct([]) is None


def test_timeline_is_the_trace_layers_record_with_thread_names(trace_of):
    t = trace_of([X("ProfilerStep#1", 0, 2000, "user_annotation"), X("aten::mm", 100, 500),
                  X("k", 300, 400, "kernel", pid=0, tid=7, device=0, stream=7)],
                 [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main thread"}}])
    tl = pv.timeline(t, 100)
    assert tl == timeline_data(t, max_events=100)  # without a trace file: the trace layer's record as it is
    assert [(l.label, l.kind) for l in tl.lanes] == [("main thread", "cpu"), ("GPU 0 · stream 7", "gpu")]
    label = {l.lane: l.label for l in tl.lanes}
    mm = next(e for e in tl.events if e.name == "aten::mm")
    assert (label[mm.lane], mm.depth, mm.start_us, mm.dur_us, mm.count) == ("main thread", 1, 100.0, 500.0, 1)
    assert (tl.in_range, tl.shown, tl.t1) == (3, 3, 2000.0)


def test_timeline_carries_the_input_shapes_the_trace_recorded(tmp_path):
    events = [X("ProfilerStep#1", 1000, 2000, "user_annotation"),
              X("aten::mm", 1100, 500, **{"Input Dims": [[8, 64], [64, 32]]}),
              X("aten::relu", 1700, 100, **{"Input Dims": [[8, 32]]}), X("aten::empty", 1800, 5, **{"Input Dims": []})]
    raw = json.dumps({"traceEvents": events}).encode()
    p = tmp_path / "t.json"
    p.write_bytes(raw)
    t = load_trace(p)
    tl = pv.timeline(t, 100, p)
    shapes = {e.name: e.shapes for e in tl.events}
    assert shapes == {"ProfilerStep#1": UNSET, "aten::mm": "[[8,64],[64,32]]", "aten::relu": "[[8,32]]",
                      "aten::empty": UNSET}
    assert all(e.shapes is UNSET for e in pv.timeline(t, 100).events)  # without the file: none claimed
    # the bars themselves are the trace layer's: only the shapes were added
    assert [msgspec.structs.replace(e, shapes=UNSET) for e in tl.events] == list(timeline_data(t, max_events=100).events)
