"""The GPU (NCCL) side: the breakdown on a hand-made GPU trace (runs anywhere), and a live NCCL
run when CUDA GPUs are present.

GPU trace, one step [0, 1000) us: compute kernels [100,400] and [700,800] = 400; NCCL kernel
[300,600] = 300; overlap [300,400] = 100; other = 1000 - 600 = 400; exposed = 200; busy = 800.
CPU ops (aten::mm, record_param_comms) do not count on a GPU trace; they are listed as collectives
(record_param_comms with 1024 float elements = 4096 bytes).
"""

import json

import pytest
import torch

from diagnostics.analyses.distributed.job import analyze, analyze_folder_path
from diagnostics.runner import AnalysisContext, Job
from diagnostics.spec import ModelSpec


def _gpu_trace(path, rank):
    def ev(name, ts, dur, cat, tid, **args):
        return {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat, "pid": 0 if cat == "kernel" else 9,
                "tid": tid, "args": args}
    events = [
        ev("ProfilerStep#3", 0, 1000, "user_annotation", 1),
        ev("aten::mm", 50, 40, "cpu_op", 1),
        ev("record_param_comms", 250, 10, "cpu_op", 1, **{"In msg nelems": 1024, "Out msg nelems": 1024,
                                                           "dtype": "Float"}),
        ev("void gemm_kernel", 100, 300, "kernel", 7, device=0, stream=7),
        ev("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 300, 300, "kernel", 20, device=0, stream=20),
        ev("void relu_kernel", 700, 100, "kernel", 7, device=0, stream=7),
    ]
    path.write_text(json.dumps({"distributedInfo": {"rank": rank, "world_size": 1, "backend": "nccl"},
                                "traceEvents": events}))


def test_gpu_trace_breakdown(tmp_path):
    _gpu_trace(tmp_path / "rank0.pt.trace.json", 0)
    res = analyze_folder_path(tmp_path)
    assert res["device_kind"] == "GPU" and res["backend"] == "nccl"
    s = res["steps"][0]
    assert (s["step"], s["step_ms"]) == (3, pytest.approx(1.0))
    assert s["compute_ms"] == pytest.approx(0.4) and s["comm_ms"] == pytest.approx(0.3)
    assert s["overlap_ms"] == pytest.approx(0.1) and s["other_ms"] == pytest.approx(0.4)
    assert s["exposed_comm_ms"] == pytest.approx(0.2) and s["busy_ms"] == pytest.approx(0.8)
    coll = {c["name"]: c for c in res["collectives"]}
    assert coll["ncclDevKernel_AllReduce_Sum_f32_RING_LL"]["where"] == "GPU"
    assert coll["record_param_comms"]["where"] == "CPU" and coll["record_param_comms"]["bytes"] == 4096
    assert res["metrics"]["overlap_ratio"] == pytest.approx(1 / 3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA GPUs for NCCL")
def test_live_nccl_run(tmp_path):
    nproc = min(2, torch.cuda.device_count())
    ctx = AnalysisContext(Job("distributed", ModelSpec(name="mlp", device="cuda:0"), {}), tmp_path)
    res = analyze(ctx, {"nproc": nproc, "steps": 3, "warmup": 1, "backend": "nccl"})
    assert res.backend == "nccl" and res.device_kind == "GPU"
    assert res.metrics.ranks_loaded == nproc
    assert all(r.compute_ms > 0 for r in res.ranks)
    if nproc > 1:
        assert any(c.where == "GPU" and c.name.lower().startswith("nccl") for c in res.collectives)
    for r in res.ranks:  # CUDA-event step time vs the trace's step
        assert r.wall_step_ms == pytest.approx(r.step_ms, rel=0.25)


def test_distributed_info_is_added_when_the_profiler_left_it_out(tmp_path):
    from diagnostics.analyses.distributed.rank_main import _ensure_distributed_info

    p = tmp_path / "rank3.pt.trace.json"
    p.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "a", "ts": 0, "dur": 1, "pid": 1, "tid": 1}]}))
    _ensure_distributed_info(p, 3, 4, "gloo")
    assert json.loads(p.read_text())["distributedInfo"] == {"rank": 3, "world_size": 4, "backend": "gloo"}
    before = p.read_bytes()
    _ensure_distributed_info(p, 3, 4, "gloo")  # already there: left alone
    assert p.read_bytes() == before
