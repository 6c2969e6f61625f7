"""Small real-schema Kineto traces for several ranks (tests of diagnostics.trace.ranks and its page / CLI).

Every step of ``write_rank`` holds, from the step start t (µs): aten::mm on the host at t+10 (50 µs), two
cudaLaunchKernel calls at t+20 and t+30, a compute kernel on stream 7 over [t+100, t+500) and an NCCL
all-reduce kernel on stream 20 over [t+400, t+600). Per step, by hand: computation 0.4 ms, communication
0.2 ms, their overlap 0.1 ms, GPU busy (the union) 0.5 ms.
"""

from __future__ import annotations

import json
from pathlib import Path

BASE_NS = 1_700_000_000_000_000_000   # 2023-11-14, the traces' baseTimeNanoseconds
COMPUTE_US, COMM_US, OVERLAP_US, BUSY_US = 400.0, 200.0, 100.0, 500.0


def rank_doc(rank: int | None, world_size: int | None, step_us: list[float], *, first_step: int = 1,
             start_us: float = 1000.0, base_ns: int = BASE_NS, pg_count: int = 1, schema: int = 1,
             device: str = "NVIDIA H100 80GB HBM3", arrive_us: list[float] | None = None,
             last_us: list[float] | None = None, nelems: int | None = None, host: str | None = None) -> dict:
    """One rank's trace. ``arrive_us`` (per step): the all-reduce kernel starts that much after t+400 and,
    with ``last_us`` (per step: the latest arrival of any rank), ends at t+600+last (it waits for the last
    rank); ``nelems``: the kernel carries record_param_comms' args (Seq = the step's index, fp32)."""
    events = [{"ph": "M", "name": "process_name", "pid": 100, "tid": 0, "args": {"name": "python"}},
              {"ph": "M", "name": "thread_name", "pid": 100, "tid": 1, "args": {"name": "main thread"}}]
    t, corr = start_us, 1
    for i, d in enumerate(step_us):
        late = arrive_us[i] if arrive_us else 0.0
        comm_args = {"device": 0, "stream": 20, "correlation": corr + 1}
        if nelems is not None:
            comm_args.update({"Collective name": "allreduce", "In msg nelems": nelems, "Out msg nelems": nelems,
                              "dtype": "Float", "Group size": world_size, "Process Group Name": "0", "Seq": i})
        events += [
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{first_step + i}", "pid": 100, "tid": 1,
             "ts": t, "dur": d},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 100, "tid": 1, "ts": t + 10, "dur": 50},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": 1, "ts": t + 20,
             "dur": 5, "args": {"correlation": corr}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": 1, "ts": t + 30,
             "dur": 5, "args": {"correlation": corr + 1}},
            {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_f32f32", "pid": 0, "tid": 7, "ts": t + 100,
             "dur": COMPUTE_US, "args": {"device": 0, "stream": 7, "correlation": corr}},
            {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "pid": 0, "tid": 20,
             "ts": t + 400 + late, "dur": COMM_US + ((last_us[i] if last_us else late) - late), "args": comm_args},
        ]
        t += d
        corr += 2
    doc = {"schemaVersion": schema, "deviceProperties": [{"id": 0, "name": device, "totalGlobalMem": 85 << 30}],
           "baseTimeNanoseconds": base_ns, "displayTimeUnit": "ms", "traceEvents": events}
    if host is not None:
        doc["host_name"] = host
    if rank is not None:
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world_size, "pg_count": pg_count,
                                  "pg_config": [{"pg_name": "0", "backend_config": "cuda:nccl",
                                                 "ranks": list(range(world_size or 0))}]}
    return doc


def write_rank(folder: Path, name: str, rank: int | None, world_size: int | None, step_us: list[float],
               **kw) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(json.dumps(rank_doc(rank, world_size, step_us, **kw)))
    return path
