"""Small timing and memory probes shared by the checklist facts and the fix trials.

``time_calls(fn, device)`` times repeated calls (CUDA events + synchronize on CUDA,
``time.perf_counter`` on CPU); ``peak_bytes(fn, device)`` measures the peak memory one call adds
on top of what was allocated before it, through the memory analysis' ``measure_peak``.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch


def _percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def time_calls(fn: Callable[[], object], device: torch.device | str, iters: int = 10,
               warmup: int = 2) -> dict:
    """Seconds per call of ``fn``: median, p90, mean, min over ``iters`` calls after ``warmup``."""
    device = torch.device(device)
    cuda = device.type == "cuda"
    for _ in range(max(0, warmup)):
        fn()
    if cuda:
        torch.cuda.synchronize(device)
    times = []
    for _ in range(max(1, iters)):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(device)
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return {"median_s": statistics.median(times), "p90_s": _percentile(times, 0.9),
            "mean_s": statistics.fmean(times), "min_s": min(times), "iters": len(times)}


def peak_bytes(fn: Callable[[], object], device: torch.device | str) -> int:
    """Peak bytes allocated during one call of ``fn`` above what was allocated before it.

    Delegates to the memory analysis' ``measure_peak`` (CUDA: max_memory_allocated after a reset;
    CPU: the profiler's allocation events), so both pages measure memory the same way.
    """
    from diagnostics.analyses.memory_measure import measure_peak

    p = measure_peak(fn, device, 0)
    return int(p.peak_bytes - p.baseline_bytes)


def absolute_peak_bytes(fn: Callable[[], object], device: torch.device | str) -> int:
    """Peak bytes in use during one call of ``fn``, what was allocated before included (CUDA)."""
    from diagnostics.analyses.memory_measure import measure_peak

    return int(measure_peak(fn, device, 0).peak_bytes)
