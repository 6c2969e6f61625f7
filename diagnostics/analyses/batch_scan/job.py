"""Batch-size scan: latency, throughput and peak memory at batch 1, 2, 4, ... up to a limit, and the
largest batch under a memory budget found by binary search.

Each probe runs one warm-up pass, ``repeats`` timed passes (CUDA events + synchronize on CUDA,
``time.perf_counter`` on the CPU; the median is kept) and one pass measured for peak memory
(``diagnostics.measure.memory.measure_peak``). A probe whose peak exceeds the budget, or that runs out of
memory (``torch.OutOfMemoryError`` on CUDA, ``MemoryError`` / "can't allocate memory" on the CPU),
ends the doubling; the search then looks between the last fitting batch and that one. The failure
is reported in the result ("stopped at batch N: ..."), never raised.
"""

from __future__ import annotations

import gc
import statistics

import psutil
import torch

from diagnostics.analyses.batch_scan import (ANALYSIS, BatchScanMetrics, BatchScanResult, Budget, ScanRow, SearchRow,
                                             Stopped)
from diagnostics.measure.memory import is_cuda, measure_peak
from diagnostics.measure.state import restored_state
from diagnostics.tensors import buffer_bytes, optimizer_state_bytes, param_bytes, tensor_bytes
from diagnostics.measure.timer import time_once
from diagnostics.measure.training import Step

#: With no budget given on the CPU, the budget is this share of the RAM available when the scan starts.
CPU_DEFAULT_BUDGET_SHARE = 0.5
_OOM_TEXT = ("out of memory", "can't allocate memory", "memoryerror", "cannot allocate memory")


class OverBudget(Exception):
    pass



def is_oom(e: BaseException) -> bool:
    if isinstance(e, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = f"{type(e).__name__}: {e}".lower()
    return any(s in text for s in _OOM_TEXT)


def batch_plan(max_batch: int) -> list[int]:
    """1, 2, 4, ... up to max_batch, and max_batch itself when it is not a power of two."""
    out, b = [], 1
    while b <= max_batch:
        out.append(b)
        b *= 2
    if out[-1] != max_batch:
        out.append(max_batch)
    return out


def default_budget(device) -> tuple[int, str]:
    if is_cuda(device):
        total = torch.cuda.get_device_properties(torch.device(device)).total_memory
        return total, "the GPU's total memory"
    avail = psutil.virtual_memory().available
    return int(avail * CPU_DEFAULT_BUDGET_SHARE), f"{CPU_DEFAULT_BUDGET_SHARE:.0%} of the RAM available at the start"


def _recover(model, device) -> None:
    for p in model.parameters():
        p.grad = None
    gc.collect()
    if is_cuda(device):
        torch.cuda.empty_cache()


class _Prober:
    """Probes one batch size at a time with the scan's step (its mode, optimizer, budget, repeats)."""

    def __init__(self, loaded, step: Step, o: dict, budget: int):
        self.loaded, self.step, self.o, self.budget = loaded, step, o, budget
        self.train = o["mode"] == "train"

    def probe(self, batch: int, timed: bool) -> ScanRow:
        """Peak (and latency) at ``batch``; raises OverBudget or the OOM error itself."""
        loaded, step, train = self.loaded, self.step, self.train
        model, device = loaded.model, loaded.device
        inputs = loaded.make_inputs(batch)
        ctx_grad = torch.enable_grad() if train else torch.no_grad()
        with ctx_grad:
            step(inputs=inputs)  # warm-up; in training it also creates the optimizer state
            if train:
                step.zero_grad()
            baseline = (param_bytes(model) + buffer_bytes(model) + tensor_bytes(inputs)
                        + optimizer_state_bytes(step.optimizer))
            peak = measure_peak(lambda: step(inputs=inputs), device, baseline)
            if peak.peak_bytes > self.budget:
                raise OverBudget(f"peak {peak.peak_bytes / 2**20:.1f} MiB exceeds the budget "
                                 f"{self.budget / 2**20:.1f} MiB")
            latency_ms = throughput = None
            if timed:
                times = []
                for _ in range(self.o["repeats"]):
                    if train:
                        step.zero_grad()
                    times.append(time_once(lambda: step(inputs=inputs), device) / 1e3)
                lat = statistics.median(times)
                latency_ms, throughput = lat * 1e3, batch / lat if lat > 0 else None
        return ScanRow(batch=batch, peak_bytes=int(peak.peak_bytes), reserved_bytes=peak.reserved_bytes, fits=True,
                       latency_ms=latency_ms, throughput=throughput)

    def attempt(self, batch: int, timed: bool) -> tuple[ScanRow | None, str | None]:
        """(the probe's row, None), or (None, why it did not fit or failed): never raises."""
        try:
            return self.probe(batch, timed), None
        except OverBudget as e:
            return None, str(e)
        except Exception as e:  # noqa: BLE001 - the user's model: report, never raise
            _recover(self.loaded.model, self.loaded.device)
            if is_oom(e):
                return None, f"out of memory ({type(e).__name__}: {str(e).splitlines()[0][:200]})"
            return None, f"the model failed ({type(e).__name__}: {str(e).splitlines()[0][:200]})"
        finally:
            gc.collect()


def _doubling(ctx, prober: _Prober, plan: list[int]) -> tuple[list[ScanRow], Stopped | None, int | None, int | None]:
    """Timed probes along ``plan`` until one does not fit: (rows, why it stopped, last fit, first failure)."""
    rows: list[ScanRow] = []
    stopped, last_fit, first_fail = None, None, None
    for i, b in enumerate(plan):
        ctx.progress(0.05 + 0.7 * i / len(plan), f"batch {b}")
        row, why = prober.attempt(b, timed=True)
        if row is None:
            stopped = Stopped(batch=b, reason=why, message=f"stopped at batch {b}: {why}")
            rows.append(ScanRow(batch=b, fits=False, peak_bytes=None, reserved_bytes=None, latency_ms=None,
                                throughput=None, reason=why))
            first_fail = b
            break
        rows.append(row)
        last_fit = b
    return rows, stopped, last_fit, first_fail


def _bisect(ctx, prober: _Prober, last_fit: int | None, first_fail: int | None) -> tuple[list[SearchRow], int | None]:
    """Untimed probes between the last batch that fit and the first that did not: (the probes, the largest fit)."""
    search: list[SearchRow] = []
    if first_fail is None or last_fit is None or first_fail - last_fit <= 1:
        return search, last_fit
    lo, hi = last_fit, first_fail
    while hi - lo > 1:
        mid = (lo + hi) // 2
        ctx.progress(0.8, f"binary search: batch {mid} (between {lo} and {hi})")
        row, why = prober.attempt(mid, timed=False)
        search.append(SearchRow(batch=mid, fits=row is not None, peak_bytes=None if row is None else row.peak_bytes,
                                reason=why))
        if row is None:
            hi = mid
        else:
            lo = mid
    return search, lo


def analyze(ctx, options: dict) -> BatchScanResult:
    o = ANALYSIS.validate(options)  # idempotent: the runner validated them too
    loaded = ctx.loaded
    model, device = loaded.model, loaded.device
    if o["memory_budget_mb"] is not None:
        budget, budget_source = int(o["memory_budget_mb"] * 2**20), "set by the user"
    else:
        budget, budget_source = default_budget(device)
    train = o["mode"] == "train"
    with restored_state(model):
        model.train(train)
        # Gradients are set to None before (not inside) the measured pass (zero_grad=False): the CPU
        # profiler cannot size frees of blocks allocated before it started.
        step = Step(loaded, train, o["optimizer"], o["lr"], zero_grad=False)
        prober = _Prober(loaded, step, o, budget)
        rows, stopped, last_fit, first_fail = _doubling(ctx, prober, batch_plan(o["max_batch"]))
        search, largest = _bisect(ctx, prober, last_fit, first_fail)
        del step, prober

    timed = [r for r in rows if r.throughput]
    best = max(timed, key=lambda r: r.throughput) if timed else None
    metrics = BatchScanMetrics(largest_batch_under_budget=largest, budget_bytes=budget,
                               stopped_at_batch=None if stopped is None else stopped.batch,
                               max_throughput=None if best is None else best.throughput,
                               best_throughput_batch=None if best is None else best.batch,
                               probes=len(rows) + len(search))
    if largest is None:
        summary = f"no batch size fits: {stopped.message}" if stopped else "no batch size fits"
    elif stopped is None:
        summary = f"every batch up to {o['max_batch']} fits the budget (the largest probed: {largest})"
    else:
        summary = f"largest batch under the budget: {largest} ({stopped.message})"
    ctx.progress(1.0, "done")
    return BatchScanResult(
        model=loaded.spec.label, device=str(device), options=dict(o), mode=o["mode"],
        budget=Budget(bytes=budget, source=budget_source), rows=tuple(rows), search=tuple(search), stopped=stopped,
        summary=summary, metrics=metrics,
        memory_source=("torch.cuda.max_memory_allocated per probe" if is_cuda(device) else
                       "torch.profiler memory events per probe (peak of the running allocated total) plus the "
                       "tensors alive before it"),
        timing_source=("CUDA events + synchronize, median of the repeats" if is_cuda(device) else
                       "time.perf_counter, median of the repeats"),
    )
