"""Batch-size scan: latency, throughput and peak memory at batch 1, 2, 4, ... up to a limit, and the
largest batch under a memory budget found by binary search.

Each probe runs one warm-up pass, ``repeats`` timed passes (CUDA events + synchronize on CUDA,
``time.perf_counter`` on the CPU; the median is kept) and one pass measured for peak memory
(``memory_measure.measure_peak``). A probe whose peak exceeds the budget, or that runs out of
memory (``torch.OutOfMemoryError`` on CUDA, ``MemoryError`` / "can't allocate memory" on the CPU),
ends the doubling; the search then looks between the last fitting batch and that one. The failure
is reported in the result ("stopped at batch N: ..."), never raised.
"""

from __future__ import annotations

import gc
import statistics

import psutil
import torch

from diagnostics.analyses.batch_scan import ANALYSIS, BatchScanResult
from diagnostics.measure.memory import is_cuda, measure_peak
from diagnostics.measure.state import restored_state
from diagnostics.tensors import buffer_bytes, optimizer_state_bytes, param_bytes, tensor_bytes
from diagnostics.measure.timer import time_once
from diagnostics.measure.training import Step
from diagnostics.results import build

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


def analyze(ctx, options: dict) -> BatchScanResult:
    options = ANALYSIS.validate(options)  # idempotent: the runner validated them too
    o = options
    loaded = ctx.loaded
    model, device = loaded.model, loaded.device
    if o["memory_budget_mb"] is not None:
        budget, budget_source = int(o["memory_budget_mb"] * 2**20), "set by the user"
    else:
        budget, budget_source = default_budget(device)
    train = o["mode"] == "train"
    rows: list[dict] = []
    search: list[dict] = []
    stopped = None
    plan = batch_plan(o["max_batch"])

    with restored_state(model):
        model.train(train)
        # Gradients are set to None before (not inside) the measured pass (zero_grad=False): the CPU
        # profiler cannot size frees of blocks allocated before it started.
        step = Step(loaded, train, o["optimizer"], o["lr"], zero_grad=False)

        def probe(batch: int, timed: bool) -> dict:
            """Peak (and latency) at ``batch``; raises OverBudget or the OOM error itself."""
            inputs = loaded.make_inputs(batch)
            ctx_grad = torch.enable_grad() if train else torch.no_grad()
            with ctx_grad:
                step(inputs=inputs)  # warm-up; in training it also creates the optimizer state
                if train:
                    step.zero_grad()
                baseline = (param_bytes(model) + buffer_bytes(model) + tensor_bytes(inputs)
                            + optimizer_state_bytes(step.optimizer))
                peak = measure_peak(lambda: step(inputs=inputs), device, baseline)
                if peak.peak_bytes > budget:
                    raise OverBudget(f"peak {peak.peak_bytes / 2**20:.1f} MiB exceeds the budget "
                                     f"{budget / 2**20:.1f} MiB")
                row = {"batch": batch, "peak_bytes": int(peak.peak_bytes), "reserved_bytes": peak.reserved_bytes,
                       "fits": True}
                if timed:
                    times = []
                    for _ in range(o["repeats"]):
                        if train:
                            step.zero_grad()
                        times.append(time_once(lambda: step(inputs=inputs), device) / 1e3)
                    lat = statistics.median(times)
                    row.update(latency_ms=lat * 1e3, throughput=batch / lat if lat > 0 else None)
            return row

        def attempt(batch: int, timed: bool) -> tuple[dict | None, str | None]:
            try:
                return probe(batch, timed), None
            except OverBudget as e:
                return None, str(e)
            except Exception as e:  # noqa: BLE001 - the user's model: report, never raise
                _recover(model, device)
                if is_oom(e):
                    return None, f"out of memory ({type(e).__name__}: {str(e).splitlines()[0][:200]})"
                return None, f"the model failed ({type(e).__name__}: {str(e).splitlines()[0][:200]})"
            finally:
                gc.collect()

        last_fit, first_fail = None, None
        for i, b in enumerate(plan):
            ctx.progress(0.05 + 0.7 * i / len(plan), f"batch {b}")
            row, why = attempt(b, timed=True)
            if row is None:
                stopped = {"batch": b, "reason": why, "message": f"stopped at batch {b}: {why}"}
                rows.append({"batch": b, "fits": False, "peak_bytes": None, "reserved_bytes": None,
                             "latency_ms": None, "throughput": None, "reason": why})
                first_fail = b
                break
            rows.append(row)
            last_fit = b

        if first_fail is not None and last_fit is not None and first_fail - last_fit > 1:
            lo, hi = last_fit, first_fail
            while hi - lo > 1:
                mid = (lo + hi) // 2
                ctx.progress(0.8, f"binary search: batch {mid} (between {lo} and {hi})")
                row, why = attempt(mid, timed=False)
                search.append({"batch": mid, "fits": row is not None,
                               "peak_bytes": None if row is None else row["peak_bytes"], "reason": why})
                if row is None:
                    hi = mid
                else:
                    lo = mid
            largest = lo
        else:
            largest = last_fit
        del step

    timed = [r for r in rows if r.get("throughput")]
    best = max(timed, key=lambda r: r["throughput"]) if timed else None
    metrics = {
        "largest_batch_under_budget": largest,
        "budget_bytes": budget,
        "stopped_at_batch": None if stopped is None else stopped["batch"],
        "max_throughput": None if best is None else best["throughput"],
        "best_throughput_batch": None if best is None else best["batch"],
        "probes": len(rows) + len(search),
    }
    if largest is None:
        summary = f"no batch size fits: {stopped['message']}" if stopped else "no batch size fits"
    elif stopped is None:
        summary = f"every batch up to {o['max_batch']} fits the budget (the largest probed: {largest})"
    else:
        summary = f"largest batch under the budget: {largest} ({stopped['message']})"
    ctx.progress(1.0, "done")
    return build(BatchScanResult, {
        "model": loaded.spec.label,
        "device": str(device),
        "options": o,
        "mode": o["mode"],
        "budget": {"bytes": budget, "source": budget_source},
        "rows": rows,
        "search": search,
        "stopped": stopped,
        "summary": summary,
        "metrics": metrics,
        "memory_source": ("torch.cuda.max_memory_allocated per probe" if is_cuda(device) else
                          "torch.profiler memory events per probe (peak of the running allocated total) plus the "
                          "tensors alive before it"),
        "timing_source": ("CUDA events + synchronize, median of the repeats" if is_cuda(device) else
                          "time.perf_counter, median of the repeats"),
    })
