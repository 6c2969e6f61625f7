"""Small timing and memory probes shared by the checklist facts and the fix trials.

``time_calls(fn, device)`` times repeated calls (CUDA events on CUDA, perf_counter on CPU) through
the profiler analysis' ``measure_latency``; ``peak_bytes(fn, device)`` measures the peak memory
one call adds on top of what was allocated before it, through the memory analysis' ``measure_peak``.
"""

from __future__ import annotations

from typing import Callable

import torch


def time_calls(fn: Callable[[], object], device: torch.device | str, iters: int = 10,
               warmup: int = 2) -> dict:
    """Seconds per call of ``fn``: median, p90, mean, min over ``iters`` calls after ``warmup``.

    The samples come from the profiler analysis' ``measure_latency`` (CUDA events on CUDA,
    perf_counter on CPU), the statistics from its ``latency_stats``: one way to time, app-wide.
    """
    from diagnostics.analyses.profile.job import latency_stats, measure_latency

    samples = measure_latency(fn, torch.device(device), max(0, warmup), max(1, iters))
    st = latency_stats(samples, 1)
    return {"median_s": st["median_ms"] / 1e3, "p90_s": st["p90_ms"] / 1e3, "mean_s": st["mean_ms"] / 1e3,
            "min_s": st["min_ms"] / 1e3, "iters": st["iterations"]}


def peak_bytes(fn: Callable[[], object], device: torch.device | str) -> int:
    """Peak bytes allocated during one call of ``fn`` above what was allocated before it.

    Delegates to the memory analysis' ``measure_peak`` (CUDA: max_memory_allocated after a reset;
    CPU: the profiler's allocation events), so both pages measure memory the same way.
    """
    from diagnostics.measure.memory import measure_peak

    p = measure_peak(fn, device, 0)
    return int(p.peak_bytes - p.baseline_bytes)


def absolute_peak_bytes(fn: Callable[[], object], device: torch.device | str) -> int:
    """Peak bytes in use during one call of ``fn``, what was allocated before included (CUDA)."""
    from diagnostics.measure.memory import measure_peak

    return int(measure_peak(fn, device, 0).peak_bytes)
