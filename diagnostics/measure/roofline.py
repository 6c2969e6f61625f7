"""The roofline: what this machine can do (measured roofs), what each operator did (exact FLOPs and
bytes moved per step, measured time), and how far from its roof each one ran.

* ``measure_roofs(device, dtype)``: dense GEMM FLOP/s (an n x n matmul) and memory bandwidth (a
  large copy: bytes read + bytes written), timed with the one timer; datasheet peaks beside them for
  known GPUs.
* ``count_ops(fn)``: run ``fn`` (one step) under ``flops.FlopCounter`` (the same FLOP formulas as
  the Model page: FlopCounterMode's plus grouped matmuls and fused attention) and a dispatch mode that
  sums the bytes of every op's tensor inputs and outputs (views move nothing and count 0): FLOPs,
  bytes and calls per aten op, and the ops whose FLOPs could not be counted.
* ``not_counted_rows(count, times_ms)``: those ops with their share of the measured op time.
* ``roofline_rows(ops, times_ms, roofs)``: per op, achieved FLOP/s, arithmetic intensity, the roof
  at that intensity, compute- or memory-bound, the time at the roof and the headroom.
* ``mfu(model_flops, step_ms, peak)``: model FLOPs utilisation of a step.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from diagnostics.measure.flops import FlopCount, FlopCounter, op_name
from diagnostics.measure.timer import sync, time_calls

#: Dense peak FLOP/s and memory bandwidth from the datasheets (dense, no sparsity), by name fragment.
DATASHEET = {
    "H200": {"bfloat16": 989e12, "float16": 989e12, "float32": 67e12, "bandwidth": 4.8e12},
    "H100": {"bfloat16": 989e12, "float16": 989e12, "float32": 67e12, "bandwidth": 3.35e12},
    "A100": {"bfloat16": 312e12, "float16": 312e12, "float32": 19.5e12, "bandwidth": 2.0e12},
    "L40S": {"bfloat16": 362e12, "float16": 362e12, "float32": 91.6e12, "bandwidth": 0.864e12},
    "L4": {"bfloat16": 121e12, "float16": 121e12, "float32": 30.3e12, "bandwidth": 0.3e12},
    "A10": {"bfloat16": 125e12, "float16": 125e12, "float32": 31.2e12, "bandwidth": 0.6e12},
    "V100": {"float16": 125e12, "float32": 15.7e12, "bandwidth": 0.9e12},
    "T4": {"float16": 65e12, "float32": 8.1e12, "bandwidth": 0.32e12},
}
#: An op whose achieved rate exceeds its roof by more than this factor is flagged (timing noise).
ABOVE_ROOF_TOLERANCE = 1.10
#: Ops moving at most this many bytes per call work in cache: their memory roof is the cache
#: bandwidth (a copy of CACHE_COPY_BYTES, repeated), not DRAM's.
CACHE_OP_BYTES = 1 << 20
CACHE_COPY_BYTES = 256 << 10


def datasheet(device_name: str | None, dtype: str) -> dict | None:
    for key, peaks in DATASHEET.items():
        if device_name and key.lower() in device_name.lower() and dtype in peaks:
            return {"gpu": key, "peak_flops": peaks[dtype], "bandwidth_bytes_per_s": peaks["bandwidth"]}
    return None


def measure_roofs(device: torch.device | str, dtype: torch.dtype = torch.float32, reps: int = 5) -> dict:
    """Measured dense-GEMM FLOP/s and copy bandwidth on ``device`` (medians of ``reps`` timed calls)."""
    device = torch.device(device)
    cuda = device.type == "cuda"
    n = 8192 if cuda else 1024
    elems = (256 << 20) // 4 if cuda else (128 << 20) // 4  # 256 / 128 MiB of float32: past every cache
    peak = _gemm_rate(n, device, dtype, reps)
    bandwidth = _copy_rate(elems, device, reps)
    cache_bandwidth = max(bandwidth, _copy_rate(CACHE_COPY_BYTES // 4, device, reps, repeat=64))
    sync(device)
    name = torch.cuda.get_device_name(device) if cuda else "CPU"
    return {"device": str(device), "device_name": name, "dtype": str(dtype).replace("torch.", ""),
            "threads": torch.get_num_threads(), "peak_flops": peak, "bandwidth_bytes_per_s": bandwidth,
            "cache_bandwidth_bytes_per_s": cache_bandwidth, "cache_op_bytes": CACHE_OP_BYTES,
            "ridge_intensity": peak / bandwidth,
            "method": f"median of {reps}: torch.mm of two {n}x{n} {str(dtype).replace('torch.', '')} matrices "
                      f"(2n^3 FLOP); a copy of {elems * 4 >> 20} MiB (read + write) for DRAM, of "
                      f"{CACHE_COPY_BYTES >> 10} KiB for ops that move at most {CACHE_OP_BYTES >> 20} MiB per call",
            "datasheet": datasheet(name if cuda else None, str(dtype).replace("torch.", ""))}


def _gemm_rate(n: int, device, dtype, reps: int) -> float:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    ms = sorted(time_calls(lambda: torch.mm(a, b), device, reps, 1))[reps // 2]
    return 2.0 * n ** 3 / (ms / 1e3)


def _copy_rate(elems: int, device, reps: int, repeat: int = 1) -> float:
    x = torch.empty(elems, device=device, dtype=torch.float32).fill_(1.0)
    y = torch.empty_like(x)

    def copies():
        for _ in range(repeat):
            y.copy_(x)

    ms = sorted(time_calls(copies, device, reps, 1))[reps // 2]
    return 2.0 * x.nbytes * repeat / (ms / 1e3)  # every byte read once and written once


class _Bytes(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.bytes: dict[str, int] = defaultdict(int)
        self.calls: dict[str, int] = defaultdict(int)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # A composite op (aten::linear under inference_mode) is counted as the ops it runs, as
        # FlopCounterMode counts its FLOPs and as the profiler charges their time (aten::addmm).
        with self:
            r = func.decompose(*args, **kwargs)
        if r is not NotImplemented:
            return r
        out = func(*args, **kwargs)
        name = op_name(func)
        self.calls[name] += 1
        if not getattr(func, "is_view", False):
            tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
            self.bytes[name] += sum(t.numel() * t.element_size() for t in tensors)
        return out


def count_ops(fn: Callable[[], object], root: str | None = None) -> tuple[dict[str, dict], FlopCount]:
    """Per aten op of one call of ``fn``: {"flops", "bytes", "calls"}, and the ``FlopCount`` (total,
    FLOPs per module when ``root`` names the model's class, the ops not counted)."""
    counter = FlopCounter()
    moved = _Bytes()
    with counter, moved:
        fn()
    count = counter.result(root)
    ops = {name: {"flops": int(count.by_op.get(name, 0)), "bytes": int(moved.bytes.get(name, 0)),
                  "calls": int(moved.calls[name])} for name in set(moved.calls) | set(count.by_op)}
    return ops, count


def not_counted_rows(count: FlopCount, times_ms: dict[str, float]) -> list[dict]:
    """The ops the FLOP count left out, each with its measured time per step and share of all op time."""
    total = sum(t for t in times_ms.values() if t and t > 0)
    rows = [{"op": op, "calls": d["calls"], "modules": d["modules"], "time_ms": times_ms.get(op),
             "pct_of_time": 100.0 * times_ms[op] / total if total and times_ms.get(op) else None}
            for op, d in count.not_counted.items()]
    rows.sort(key=lambda r: -(r["time_ms"] or 0.0))
    return rows


def roofline_rows(ops: dict[str, dict], times_ms: dict[str, float], roofs: dict) -> list[dict]:
    """One row per op with a measured time and counted work, slowest first."""
    peak, dram = roofs["peak_flops"], roofs["bandwidth_bytes_per_s"]
    cache = roofs.get("cache_bandwidth_bytes_per_s") or dram
    rows = []
    for name, work in ops.items():
        t = times_ms.get(name)
        if not t or t <= 0 or (work["flops"] <= 0 and work["bytes"] <= 0):
            continue
        flops, nbytes = work["flops"], work["bytes"]
        in_cache = nbytes / max(1, work["calls"]) <= roofs.get("cache_op_bytes", 0)
        bw = cache if in_cache else dram
        intensity = flops / nbytes if nbytes else None
        roof_rate = peak if intensity is None else min(peak, bw * intensity)
        roof_ms = max(flops / peak, nbytes / bw) * 1e3
        achieved = flops / (t / 1e3)
        bound = "compute" if intensity is None or intensity >= peak / bw else "memory"
        rows.append({
            "op": name, "calls": work["calls"], "flops": flops, "bytes": nbytes, "time_ms": t,
            "achieved_tflops": achieved / 1e12, "achieved_bytes_per_s": nbytes / (t / 1e3),
            "intensity": intensity, "roof_tflops": roof_rate / 1e12, "bound": bound, "roof_ms": roof_ms,
            "memory_roof": "cache" if in_cache else "DRAM",
            "headroom_ms": max(0.0, t - roof_ms), "pct_of_roof": 100.0 * roof_ms / t,
            "above_roof": roof_ms > t * ABOVE_ROOF_TOLERANCE,
        })
    rows.sort(key=lambda r: -r["time_ms"])
    return rows


def module_mfu(rows: list[dict], module_flops: dict[str, int], steps: int, peak_flops: float,
               root_name: str, not_counted: dict[str, dict[str, int]] | None = None) -> None:
    """Add ``flops``, ``mfu`` and ``flops_not_counted`` (the ops under the module whose FLOPs the count
    leaves out, or None) to each module row of the profiler (forward + backward time per step)."""
    for r in rows:
        key = "" if r["name"] == root_name else r["name"]
        f = module_flops.get(key)
        t_ms = ((r.get("forward_ms") or 0.0) + (r.get("backward_ms") or 0.0)) / max(1, steps)
        missing = sorted((not_counted or {}).get(key, {}))
        r["flops"] = f
        r["mfu"] = mfu(f, t_ms, peak_flops) if f else None
        r["flops_not_counted"] = ", ".join(missing) or None


def mfu(model_flops: float, step_ms: float, peak_flops: float) -> float | None:
    """Model FLOPs utilisation: FLOPs a step needs / (its time x the peak FLOP/s)."""
    if not model_flops or not step_ms or not peak_flops:
        return None
    return model_flops / (step_ms / 1e3) / peak_flops
