"""Small timing and memory probes shared by the checklist facts and the fix trials.

``time_calls(fn, device)`` times repeated calls (CUDA events + synchronize on CUDA,
``time.perf_counter`` on CPU); ``peak_bytes(fn, device)`` measures the peak memory one call adds
on top of what was allocated before it (CUDA: the caching allocator's peak; CPU: a running sum
of the allocations and frees that ``torch.profiler`` records with ``profile_memory=True``).
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
    """Peak bytes allocated during one call of ``fn`` above what was allocated before it."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device) - before)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    running = peak = 0
    # An op event carries the bytes it allocated net of what it freed inside itself; frees that
    # happen outside any op come as "[memory]" events. Summed in time order, they give the peak.
    for e in sorted(prof.events(), key=lambda e: e.time_range.start):
        delta = e.cpu_memory_usage if e.name == "[memory]" else e.self_cpu_memory_usage
        running += delta
        peak = max(peak, running)
    return int(peak)
