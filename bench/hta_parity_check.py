"""Side-by-side check of the trace explorer's HTA-parity analyses (definitions=hta) against Holistic
Trace Analysis itself, on a generated Kineto trace.

    PYTHONPATH=/path/to/hta .venv/bin/python bench/hta_parity_check.py [--launches 3000] [--seed 7]

HTA (``pip install --target DIR --no-deps HolisticTraceAnalysis``; 0.5.0 checked) must be importable.
The trace: one CPU thread launching kernels on streams 7 and 8, copies and sets on stream 9 and NCCL
all-reduces on stream 20 (with "bytes" and Kineto's "memory bandwidth (GB/s)" on the copies), random
launch and GPU delays, CPU stalls, and, unless --no-annotations, gpu_user_annotation ranges (HTA
counts those as computation in its overlap, so the overlap is compared on a copy without them).
Prints each figure from both and exits 1 when one that should agree does not.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

T0, PID, DEV = 1_000_000, 4242, 0
KERNELS = ["gemm_A", "bias_B", "relu_C", "softmax_D"]
COPIES = ["Memcpy HtoD (Pageable -> Device)", "Memcpy DtoH (Device -> Pinned)", "Memcpy DtoD (Device -> Device)"]


def generate(n: int, seed: int, annotations: bool) -> dict:
    rnd = random.Random(seed)
    ev = [{"name": "process_labels", "ph": "M", "ts": T0, "pid": DEV, "tid": 0, "args": {"labels": "GPU 0"}}]
    t_cpu, prev_end = 0, {7: 0, 8: 0, 9: 0, 20: 0}
    for corr in range(1, n + 1):
        r = rnd.random()
        if r < 0.08:
            stream, cat, name, call = 9, "gpu_memcpy", rnd.choice(COPIES), "cudaMemcpyAsync"
        elif r < 0.1:
            stream, cat, name, call = 9, "gpu_memset", "Memset (Device)", "cudaMemsetAsync"
        elif r < 0.15:
            stream, cat, name, call = 20, "kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "cudaLaunchKernel"
        else:
            stream, cat, call = rnd.choice([7, 7, 7, 8]), "kernel", "cudaLaunchKernel"
            name = KERNELS[corr % 4] if rnd.random() < 0.7 else rnd.choice(KERNELS)
        launch = t_cpu + rnd.randint(1, 8)
        ldur = rnd.randint(2, 6)
        t_cpu = launch + ldur + (rnd.randint(50, 400) if rnd.random() < 0.02 else 0)
        start = max(launch + rnd.randint(3, 30), prev_end[stream] + rnd.choice([0, 0, 1, 2, 10, 40]))
        dur = rnd.randint(1, 25)
        prev_end[stream] = start + dur
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": call, "pid": PID, "tid": PID, "ts": T0 + launch,
                   "dur": ldur, "args": {"correlation": corr, "cbid": 211, "External id": corr}})
        args = {"device": DEV, "stream": stream, "correlation": corr, "External id": corr, "context": 1}
        if cat != "kernel":
            args["bytes"] = rnd.randint(1, 64) * 4096
            args["memory bandwidth (GB/s)"] = args["bytes"] / (dur * 1e3)
        ev.append({"ph": "X", "cat": cat, "name": name, "pid": DEV, "tid": stream, "ts": T0 + start, "dur": dur,
                   "args": args})
    if annotations:
        for k, s in enumerate(range(0, max(prev_end.values()), 700)):
            ev.append({"ph": "X", "cat": "gpu_user_annotation", "name": ("forward", "backward", "optimizer")[k % 3],
                       "pid": DEV, "tid": 7, "ts": T0 + s, "dur": 650, "args": {"device": DEV, "stream": 7}})
    return {"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1, "backend": "nccl"},
            "deviceProperties": [], "traceEvents": ev}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    logging.disable(logging.CRITICAL)
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError:
        print("HolisticTraceAnalysis is not importable: pip install --target DIR --no-deps HolisticTraceAnalysis "
              "and put DIR on PYTHONPATH")
        return 2
    from diagnostics.results import to_plain
    from diagnostics.trace import idle_time, load_trace
    from diagnostics.trace import gpu_activity as hp
    from diagnostics.trace.breakdowns import HTA_KERNEL_WAIT_US

    bad = []

    def check(what, theirs, ours, tol=1e-9):
        ok = math.isclose(float(theirs), float(ours), rel_tol=tol, abs_tol=tol)
        print(f"{'ok  ' if ok else 'DIFF'} {what}: HTA {float(theirs):,.6g}  ours {float(ours):,.6g}")
        if not ok:
            bad.append(what)

    with tempfile.TemporaryDirectory() as tmp:
        runs = {}
        for key, ann in (("with", True), ("without", False)):
            folder = Path(tmp) / key
            folder.mkdir()
            (folder / "rank0.json").write_text(json.dumps(generate(args.launches, args.seed, ann)))
            runs[key] = (load_trace(folder / "rank0.json"), TraceAnalysis(trace_dir=str(folder)))
        t, ta = runs["with"]
        full = 100
        ours_q = {s.stream: to_plain(s) for s in hp.queue_length(t, until="kernel_start", full=full).streams}
        summary = ta.get_queue_length_summary(ranks=[0])
        series = ta.get_queue_length_time_series(ranks=[0])[0]
        for (_rank, stream), row in summary.iterrows():
            st = str(int(stream))
            check(f"queue max, stream {st}", row[("queue_length", "max")], ours_q[st]["max"])
            df = series[series.stream == int(stream)].copy()
            df["dur"] = df.ts.shift(-1) - df.ts
            check(f"time at queue >= {full}, stream {st} (µs)", df.loc[df.queue_length >= full, "dur"].sum(),
                  ours_q[st]["full_us"])
        idle, _ = ta.get_idle_time_breakdown(ranks=[0], visualize=False)   # its default consecutive_kernel_delay
        mine = {s.stream: to_plain(s) for s in idle_time(t, kernel_wait_max_us=HTA_KERNEL_WAIT_US, rules="hta").streams}
        for st, m in sorted(mine.items()):
            theirs = idle[idle.stream == int(st)].set_index("idle_category")["idle_time"]
            for cat, key in (("host_wait", "host_wait_us"), ("kernel_wait", "kernel_wait_us"), ("other", "other_wait_us")):
                check(f"idle {cat}, stream {st} (µs)", theirs.get(cat, 0.0), m[key])
        launch = ta.get_cuda_kernel_launch_stats(ranks=[0], visualize=False)[0]
        ld = to_plain(hp.launch_delay(t, since="call_end"))
        check("launches", len(launch), ld["launches"])
        check("mean launch delay (µs)", launch["launch_delay"].mean(), ld["mean_us"])
        check("max launch delay (µs)", launch["launch_delay"].max(), ld["max_us"])
        ua = ta.get_gpu_user_annotation_breakdown(visualize=False, num_kernels=100).set_index("name")
        for a in to_plain(hp.annotations(t))["annotations"]:
            check(f"annotation {a['name']} total (µs)", ua.loc[a["name"], "sum (us)"], a["total_us"])
        t2, ta2 = runs["without"]
        check("comm/comp overlap % (no annotations)", ta2.get_comm_comp_overlap(visualize=False)["comp_comm_overlap_pctg"][0],
              round(hp.comm_overlap(t2, "kernels").overlap_pct, 2))
        bw = ta.get_memory_bw_summary(ranks=[0])
        for d in to_plain(hp.memcpy_bandwidth(t))["directions"]:
            name = "Memset" if d["direction"] == "Memset" else f"Memcpy {d['direction']}"
            check(f"max bandwidth per copy, {d['direction']} (GB/s)", bw.loc[(0, name), ("memory_bw_gbps", "max")],
                  d["max_bytes_per_s"] / 1e9)
    print("all agree" if not bad else f"{len(bad)} differ: {', '.join(bad)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
