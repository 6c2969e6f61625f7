"""Analyses checked against answers computed by hand from tests/data/traces/gpu_small.json.

The GPU trace (times in µs, relative to its first event at 995):
  step 1 [5, 105): aten::mm 20 (launch 5), aten::add 10 (launch 4), aten::copy_ 15
  (cudaMemcpyAsync 3), c10d::allreduce_ 8 (launch 3), cudaMemsetAsync 1, sync 26.
  stream 7: sgemm [25,55) elementwise [55,57) memcpy [60,65) memset [87,89);
  stream 20: nccl [71,85).
  step 2 [105, 205): two aten::mm 15 (launches 4 and 2), sync 45; sgemm [117,137) [150,170).
"""

import json
from pathlib import Path

import numpy as np
import pytest

from diagnostics.results import to_plain
from diagnostics.trace import (
    idle_time, launch_stats, load_trace, summary, temporal_breakdown, top_operators,
)
from diagnostics.trace.breakdowns import KERNEL_WAIT_MAX_US

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"


@pytest.fixture(scope="module")
def gpu():
    return load_trace(DATA / "gpu_small.json")


@pytest.fixture(scope="module")
def cpu():
    return load_trace(DATA / "cpu_small.pt.trace.json.gz")


def _by(rows, *keys):
    return {tuple(r[k] for k in keys) if len(keys) > 1 else r[keys[0]]: r for r in rows}


def test_summary(gpu):
    s = to_plain(summary(gpu))
    json.dumps(s)
    assert s["duration_us"] == 200.0          # 1000 .. 1200, the frame span left out
    assert s["n_steps"] == 2 and [st["step"] for st in s["steps"]] == [1, 2]
    assert s["rank"] == 0 and s["has_gpu"] is True
    cats = _by(s["categories"], "cat")
    assert cats["cpu_op"]["events"] == 6 and cats["cpu_op"]["total_us"] == 83.0
    assert cats["kernel"]["events"] == 5 and cats["kernel"]["total_us"] == 86.0
    assert cats["cuda_runtime"]["events"] == 9
    streams = _by(s["streams"], "stream")
    assert streams["7"] == {"device": "0", "stream": "7", "kernels": 4, "memcpy": 1, "memset": 1,
                            "busy_us": 79.0}
    assert streams["20"]["kernels"] == 1 and streams["20"]["busy_us"] == 14.0
    (thread,) = s["threads"]
    assert thread["name"] == "thread 100 (python)" and thread["busy_us"] == 200.0
    assert s["memory"] == [{"device": "cuda:0", "peak_allocated_bytes": 4096}]


def test_temporal_breakdown_gpu(gpu):
    r = to_plain(temporal_breakdown(gpu))
    g = _by(r["gpu"], "step")
    # step 1 window [25, 117): from its first GPU event to step 2's first = 92: compute [25,57) 32,
    # nccl 14, memcpy 5, memset 2, idle 3+6+2 inside its work and 28 waiting for step 2's launches.
    assert g[1] == {"step": 1, "window_start_us": 25.0, "window_us": 92.0, "events": 5, "compute_us": 32.0,
                    "communication_us": 14.0, "memcpy_us": 5.0, "memset_us": 2.0, "idle_us": 39.0}
    # the last step's window ends with its last event: [117, 170)
    assert g[2]["window_us"] == 53.0 and g[2]["compute_us"] == 40.0 and g[2]["idle_us"] == 13.0
    assert g[2]["events"] == 2
    assert r["attribution"] == {"launch_events": 7, "time_events": 0, "before_profiling_events": 0,
                                "outside_steps_events": 0, "before_profiling_us": 0.0, "outside_steps_us": 0.0}
    assert r["notes"] == []


def test_temporal_breakdown_cpu_self_time(gpu):
    cpu = _by(to_plain(temporal_breakdown(gpu))["cpu"], "step", "group")
    assert cpu[(1, "op: matmul")]["self_us"] == 15.0          # 20 - launch 5
    assert cpu[(1, "op: elementwise")]["self_us"] == 6.0      # 10 - 4
    assert cpu[(1, "op: memory")]["self_us"] == 12.0          # 15 - 3
    assert cpu[(1, "op: communication")]["self_us"] == 5.0    # 8 - 3
    assert cpu[(1, "cuda_runtime")]["self_us"] == 42.0        # 5+4+3+3+1+26
    assert cpu[(1, "untracked (step self time)")]["self_us"] == 20.0
    assert cpu[(2, "op: matmul")]["self_us"] == 24.0
    assert cpu[(2, "cuda_runtime")]["self_us"] == 51.0
    for step in (1, 2):   # self times of a step add up to its duration
        assert sum(v["self_us"] for k, v in cpu.items() if k[0] == step) == 100.0


def test_top_operators(gpu):
    r = to_plain(top_operators(gpu, n=3))
    ops = r["operators"]
    assert [o["name"] for o in ops] == ["aten::mm", "aten::copy_", "aten::add"]
    assert (ops[0]["calls"], ops[0]["total_us"], ops[0]["self_us"]) == (3, 50.0, 39.0)
    assert r["n_operators"] == 4 and r["operator_self_us"] == 62.0
    k = r["kernels"][0]
    assert (k["name"], k["calls"], k["total_us"]) == ("ampere_sgemm_128x64_nn", 3, 70.0)
    assert r["kernel_us"] == 93.0 and r["n_kernels"] == 5
    assert _by(r["kernels"], "name")[r["kernels"][1]["name"]]["kind"] == "communication"


def test_idle_time_causes(gpu):
    s = _by(to_plain(idle_time(gpu))["streams"], "stream")["7"]
    # gaps on stream 7: 3 (memcpy queued at 1047 < 1052: kernel wait), 22 (memset launched at
    # 1070 after 1060: host wait), 28 (sgemm launched at 1106 after 1084: host wait),
    # 13 (sgemm queued at 1126 < 1132, longer than KERNEL_WAIT_MAX_US: other wait).
    assert KERNEL_WAIT_MAX_US == 5.0
    assert (s["host_wait_us"], s["kernel_wait_us"], s["other_wait_us"]) == (50.0, 3.0, 13.0)
    assert s["idle_us"] == 66.0 and s["gaps"] == 4 and s["busy_us"] == 79.0


def test_launch_stats(gpu):
    r = to_plain(launch_stats(gpu, n=20))
    assert r["launches"] == 7
    assert r["mean_delay_us"] == pytest.approx(76 / 7)   # 10+18+8+3+12+6+19
    assert r["max_delay_us"] == 19.0
    assert r["short_kernels"] == 1                       # the 2 µs add under a 4 µs launch
    assert r["long_delays"] == 0
    top = r["by_name"][0]
    assert top["name"].startswith("void at::native::vectorized_elementwise_kernel")
    assert len(r["sample"]) == 7


def test_cpu_only_trace(cpu):
    s = to_plain(summary(cpu))
    assert s["has_gpu"] is False and s["streams"] == [] and s["n_steps"] == 3
    r = to_plain(temporal_breakdown(cpu))
    assert r["gpu"] == []
    steps = {st["step"]: st["dur_us"] for st in r["steps"]}
    for step, dur in steps.items():   # nesting conserves time: self times sum to the step
        total = sum(c["self_us"] for c in r["cpu"] if c["step"] == step)
        assert total == pytest.approx(dur, rel=1e-6)
    assert to_plain(idle_time(cpu))["streams"] == [] and to_plain(launch_stats(cpu, n=20))["launches"] == 0
    top = to_plain(top_operators(cpu, n=20))
    assert top["kernels"] == []
    assert any(o["name"] == "aten::addmm" for o in top["operators"])
    nest = cpu.nesting()
    assert np.nanmin(nest["self_us"]) >= 0


def test_no_steps_uses_whole_trace(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 2, "dur": 3},
        {"ph": "X", "cat": "cpu_op", "name": "aten::view", "pid": 1, "tid": 1, "ts": 5, "dur": 0},
    ]}))
    t = load_trace(p)
    r = to_plain(temporal_breakdown(t))
    assert r["steps"] == [{"step": -1, "start_us": 0.0, "dur_us": 10.0}]
    cpu = _by(r["cpu"], "group")
    assert cpu["op: matmul"]["self_us"] == 7.0 and cpu["op: elementwise"]["self_us"] == 3.0
    assert cpu["op: view"]["self_us"] == 0.0
    assert t.nesting()["depth"].tolist() == [0, 1, 1]


def test_top_operators_match_key_averages_on_a_real_training_trace(tmp_path):
    """Calls, total and self time per operator, against torch's own key_averages on the same run
    (an only child named like its parent is one call recorded twice, as torch counts it)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from diagnostics.trace import load_trace, top_operators

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                            torch.nn.Flatten(), torch.nn.Linear(8 * 14 * 14, 10))
    opt = torch.optim.AdamW(m.parameters())
    x = torch.randn(4, 3, 16, 16)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(2):
            with record_function(f"ProfilerStep#{i}"):
                opt.zero_grad()
                m(x).pow(2).mean().backward()
                opt.step()
    path = tmp_path / "train.json"
    prof.export_chrome_trace(str(path))
    # On a CUDA machine the optimizer step makes runtime calls (cudaStreamIsCapturing) even in a
    # CPU-only run: key_averages lists them, the operator table does not (runtime time is its own view).
    runtime = {e["name"] for e in json.loads(path.read_text())["traceEvents"]
               if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    torch_says = {e.key: e for e in prof.key_averages() if not e.is_user_annotation and e.key not in runtime}
    ours = to_plain(top_operators(load_trace(path), n=10_000))["operators"]
    assert {r["name"] for r in ours} == set(torch_says)
    for r in ours:
        e = torch_says[r["name"]]
        assert r["calls"] == e.count, r["name"]
        assert r["total_us"] == pytest.approx(e.cpu_time_total, abs=2), r["name"]
        assert r["self_us"] == pytest.approx(e.self_cpu_time_total, abs=2), r["name"]
