"""The one timer: how long a call takes, on CUDA and on the CPU.

On a CUDA device a call is timed between two CUDA events recorded on the current stream, the end
event synchronized (the call's GPU work is inside the figure, the host's wait is not counted
twice); on the CPU with ``time.perf_counter``. Every analysis that times something (the profiler's
latency, the batch scan, the checklist's probes, the fix trials and their first calls, the compiled
model's first call, the distributed ranks' steps) times through here, so "a step took 3.2 ms" means
the same thing on every page.

Samples are milliseconds. ``latency_stats`` summarizes them (median, percentiles, spread, samples/s).
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np
import torch


def method(device: torch.device | str) -> str:
    """How ``time_once`` times on ``device``, in words for a result."""
    return "CUDA events" if torch.device(device).type == "cuda" else "time.perf_counter"


def sync(device: torch.device | str) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_once(fn: Callable[[], object], device: torch.device | str) -> float:
    """Milliseconds one call of ``fn`` takes (CUDA events on CUDA, perf_counter on the CPU)."""
    return timed(fn, device)[0]


def timed(fn: Callable[[], object], device: torch.device | str) -> tuple[float, object]:
    """``time_once`` and what the call returned: a first call (compiling, lazy initialisation) timed with
    its output kept. On CUDA the end event is recorded once ``fn`` has returned, so the host's work in the
    call (a compile) is inside the figure as the GPU's is."""
    device = torch.device(device)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)), out
    t0 = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0) * 1e3, out


def time_calls(fn: Callable[[], object], device: torch.device | str, iters: int, warmup: int = 0,
               progress: Callable[[float, str], None] | None = None) -> list[float]:
    """``warmup`` untimed calls (then a synchronize), then ``iters`` timed calls: their milliseconds."""
    device = torch.device(device)
    total = max(1, warmup + iters)
    for i in range(warmup):
        fn()
        if progress and i % max(1, warmup // 5) == 0:
            progress(i / total, f"warmup {i + 1}/{warmup}")
    sync(device)
    samples = []
    for i in range(iters):
        samples.append(time_once(fn, device))
        if progress and i % max(1, iters // 10) == 0:
            progress((warmup + i) / total, f"timed call {i + 1}/{iters}")
    return samples


def latency_stats(samples_ms: list[float], batch_size: int = 1) -> dict:
    """median / p90 / p99 (numpy linear percentiles), mean, std (population), min, max, the
    coefficient of variation (std / mean) and samples per second at the median."""
    a = np.asarray(samples_ms, dtype=float)
    median, mean = float(np.median(a)), float(a.mean())
    return {
        "median_ms": median, "p90_ms": float(np.percentile(a, 90)), "p99_ms": float(np.percentile(a, 99)),
        "mean_ms": mean, "std_ms": float(a.std()), "min_ms": float(a.min()), "max_ms": float(a.max()),
        "cv": float(a.std() / mean) if mean > 0 else None,
        "samples_per_s": batch_size / (median / 1e3) if median > 0 else None,
        "iterations": int(a.size),
    }
