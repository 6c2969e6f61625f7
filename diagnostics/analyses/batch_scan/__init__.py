"""The batch-size scan: latency, throughput and peak memory at batch 1, 2, 4, ... and the largest
batch under a memory budget (job.py)."""

from __future__ import annotations

from typing import Annotated, Any

from diagnostics.declare import Analysis, Option, column, metric, table
from diagnostics.measure.optimizers import OPTIMIZERS
from diagnostics.results import UNSET, Record, Result, UnsetType

MAX_BATCH_LIMIT = 1 << 20


class BatchScanMetrics(Record, frozen=True, kw_only=True):
    #: None: no batch size fits
    largest_batch_under_budget: Annotated[int | None, metric("count", "Largest batch under the budget")]
    budget_bytes: Annotated[int, metric("bytes", "Memory budget")]
    stopped_at_batch: Annotated[int | None, metric("count", "Stopped at batch")]
    max_throughput: Annotated[float | None, metric("per_s", "Best throughput")]
    best_throughput_batch: Annotated[int | None, metric("count", "Batch of the best throughput")]
    probes: Annotated[int, metric("count", "Probes run")]


class ScanRow(Record, frozen=True, kw_only=True):
    """One batch size of the doubling: its peak and latency when it fits, the reason when it does not."""

    batch: Annotated[int, column("count", "batch")]
    peak_bytes: Annotated[int | None, column("bytes", "peak")]
    reserved_bytes: Annotated[int | None, column("bytes", "reserved")]
    fits: bool
    latency_ms: Annotated[float | None, column("ms", "latency")]
    throughput: Annotated[float | None, column("per_s", "throughput")]
    reason: str | UnsetType = UNSET  # only where it does not fit


class SearchRow(Record, frozen=True, kw_only=True):
    """One probe of the binary search between the last batch that fits and the first that does not."""

    batch: Annotated[int, column("count", "batch")]
    fits: bool
    peak_bytes: Annotated[int | None, column("bytes", "peak")]
    reason: str | None


class Budget(Record, frozen=True, kw_only=True):
    bytes: int
    source: str


class Stopped(Record, frozen=True, kw_only=True):
    """Where the doubling stopped: over the budget, out of memory, or the model failing."""

    batch: int
    reason: str
    message: str


class BatchScanResult(Result, frozen=True, kw_only=True):
    model: str
    device: str
    options: dict[str, Any]
    mode: str
    budget: Budget
    rows: Annotated[tuple[ScanRow, ...], table("Batch sizes")]
    search: Annotated[tuple[SearchRow, ...], table("Binary search")]
    stopped: Stopped | None
    summary: str
    metrics: BatchScanMetrics
    memory_source: str
    timing_source: str


ANALYSIS = Analysis(
    name="batch_scan", title="Batch-size scan", target="diagnostics.analyses.batch_scan.job:analyze",
    command="batch_scan", exclusive=True, timeout_s=600, result=BatchScanResult, view="ui.views.memory:show_scan",
    report="diagnostics.render.charts.memory:batch_scan_sections",
    description="latency, throughput and peak memory per batch size; the largest batch that fits",
    options=(
        Option("mode", "choice", "train", "scan training steps or inference", choices=("train", "inference")),
        Option("max_batch", "int", 64, "largest batch to try", lo=1, hi=MAX_BATCH_LIMIT),
        Option("memory_budget_mb", "float", None, "memory budget in MiB (default: the GPU's memory, or half the "
               "free RAM on the CPU)", gt=0, optional=True, label="Memory budget (MiB)"),
        Option("repeats", "int", 5, "timed passes per batch size", lo=1, hi=100),
        Option("optimizer", "choice", "sgd", "optimizer of training steps", choices=OPTIMIZERS),
        Option("lr", "float", 1e-3, "learning rate of training steps", gt=0, label="Learning rate"),
    ),
)
