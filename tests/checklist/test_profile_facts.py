"""Profile facts read from a trace: a hand-made CUDA step (no GPU needed) for the device-side
figures, and a real CPU profile of a Python loop."""

import json

import pytest
import torch

from diagnostics.analyses.checklist.facts import profile_facts, step_profile_facts
from diagnostics.trace import load_trace


def X(name, ts, dur, cat="cpu_op", pid=1, tid=1, **args):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat, "pid": pid, "tid": tid, "args": args}


def K(name, ts, dur, corr, cat="kernel"):
    return X(name, ts, dur, cat, pid=0, tid=7, device=0, stream=7, correlation=corr)


def launch(ts, corr, name="cudaLaunchKernel"):
    return X(name, ts, 5, "cuda_runtime", correlation=corr)


CUDA_STEP = [
    X("ProfilerStep#0", 0, 1000, "user_annotation"),
    X("aten::contiguous", 10, 90), X("aten::clone", 15, 75), X("aten::copy_", 20, 60), launch(30, 1),
    X("aten::mm", 110, 100), launch(120, 2),
    X("c10d::allreduce_", 300, 50), launch(310, 3),
    X("autograd::engine::evaluate_function: CloneBackward0", 400, 100),
    X("aten::clone", 410, 50), launch(420, 4),                 # a copy PyTorch makes for backward
    X("aten::item", 600, 20), X("aten::_local_scalar_dense", 605, 10), launch(607, -1, "cudaStreamSynchronize"),
    X("ProfilerStep#0", 0, 1000, "gpu_user_annotation", pid=0, tid=7),  # the step's mirror: not a kernel
    K("void at::native::elementwise_kernel<copy>", 40, 30, 1),
    K("sm80_xmma_gemm_f16f16_f16f32", 130, 60, 2),
    K("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 320, 10, 3),
    K("void at::native::elementwise_kernel<copy>", 430, 20, 4),
    launch(1100, -1, "cudaDeviceSynchronize"),                 # the harness's wait, after the step
]


def test_cuda_step_facts_from_the_trace(tmp_path):
    path = tmp_path / "step.json"
    path.write_text(json.dumps({"traceEvents": CUDA_STEP}))
    f = step_profile_facts(load_trace(path), torch.device("cuda"))
    assert (f.steps, f.step_wall_us) == (1, 1000.0)
    assert f.kernels_per_step == 4 and f.median_kernel_us == 25.0
    assert f.tensor_core_kernels == ("sm80_xmma_gemm_f16f16_f16f32",)
    assert f.gpu_busy_fraction == pytest.approx(120 / 1000)
    assert f.communication_fraction == pytest.approx(10 / 120)
    # the forward's .contiguous() once (its clone and copy_ are inside it); backward's clone left out
    assert (f.layout_copies_per_step, f.layout_copy_us_per_step) == (1, 30.0)
    assert f.layout_copy_fraction == pytest.approx(30 / 120) and f.layout_copy_time_kind == "GPU kernel"
    assert f.sync_per_step["aten::item"] == 1 and f.sync_per_step["cudaStreamSynchronize"] == 1
    assert f.sync_per_step["cudaDeviceSynchronize"] == 0
    assert f.sync_points_per_step == 2
    assert f.ops_per_step == 3 and f.eligible_ops == ("aten::mm",)
    assert f.element_ops_per_step == {"aten::item": 1}


def test_a_python_loop_over_rows_is_counted_on_cpu():
    torch.manual_seed(0)
    fc = torch.nn.Linear(16, 16)
    x = torch.randn(8, 16)

    def step():
        fc.zero_grad(set_to_none=True)
        torch.stack([fc(row) for row in x]).sum().backward()

    f = profile_facts(step, torch.device("cpu"), steps=2)
    assert f.steps == 2 and f.kernels_per_step == 0 and f.communication_fraction is None
    assert f.element_ops_per_step == {"aten::select (unbind)": 8}
    assert "aten::addmm" in f.eligible_ops and f.gpu_busy_fraction is None
    assert 0 < f.op_time_us_per_step <= f.step_wall_us


def test_the_checklists_training_step_counts_the_models_ops_only():
    """The checklist trains with the one training step (measure.training.Step) built to keep no copy of the
    loss: its ops per step are the model's, its loss's and backward's (Linear's addmm, the loss's mean and
    backward), with no aten::detach of Step's own. Step keeping its loss adds exactly that one op."""
    from diagnostics.analyses.checklist.facts import _train_step
    from diagnostics.inputs import Inputs
    from diagnostics.measure.training import Step, Trainee

    torch.manual_seed(0)
    fc = torch.nn.Linear(16, 4)
    loaded = Trainee(fc, lambda out: out.mean(), Inputs((torch.randn(8, 16),), {}))
    step = _train_step(loaded, fc)
    assert step() is None
    counted = profile_facts(step, torch.device("cpu"), steps=2)
    calls = {r.name: r.count_per_step for r in counted.top_ops}   # every call, nested ones too
    assert calls["aten::linear"] == calls["aten::mean"] == 1
    keeping = Step(Trainee(fc, lambda out: out.mean(), loaded.inputs), True, optimizer=None)
    assert keeping() is not None
    kept = profile_facts(keeping, torch.device("cpu"), steps=2)
    assert kept.ops_per_step == counted.ops_per_step + 1
    kept_calls = {r.name: r.count_per_step for r in kept.top_ops}
    assert kept_calls["aten::detach"] == calls.get("aten::detach", 0) + 1   # Step's own copy of the loss
