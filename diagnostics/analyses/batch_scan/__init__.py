"""The batch-size scan: latency, throughput and peak memory at batch 1, 2, 4, ... and the largest
batch under a memory budget (job.py)."""

from diagnostics.declare import Analysis, Column, Metric, Option, Table
from diagnostics.measure.optimizers import OPTIMIZERS

MAX_BATCH_LIMIT = 1 << 20

ANALYSIS = Analysis(
    name="batch_scan", title="Batch-size scan", target="diagnostics.analyses.batch_scan.job:analyze",
    command="batch_scan", exclusive=True, timeout_s=600, view="ui.views.memory:show_scan",
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
    metrics=(
        Metric("largest_batch_under_budget", "count", "Largest batch under the budget"),
        Metric("budget_bytes", "bytes", "Memory budget"),
        Metric("stopped_at_batch", "count", "Stopped at batch"),
        Metric("max_throughput", "per_s", "Best throughput"),
        Metric("best_throughput_batch", "count", "Batch of the best throughput"),
        Metric("probes", "count", "Probes run"),
    ),
    tables=(
        Table("rows", "Batch sizes", (Column("batch", "count", "batch"), Column("peak_bytes", "bytes", "peak"),
                                      Column("reserved_bytes", "bytes", "reserved"),
                                      Column("latency_ms", "ms", "latency"),
                                      Column("throughput", "per_s", "throughput"))),
        Table("search", "Binary search", (Column("batch", "count", "batch"), Column("peak_bytes", "bytes", "peak"))),
    ),
)
