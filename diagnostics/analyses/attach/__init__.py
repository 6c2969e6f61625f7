"""Attach mode: the user's own training script, run unmodified under ``python -m diagnostics run --
COMMAND`` (diagnostics.attach starts it with a bootstrap on PYTHONPATH); this analysis reads the run
folder the bootstrap wrote (protocol.py) into the result (result.py, job.py) and its findings
(rules.py). Re-running it on a stored run folder gives the same result."""

from diagnostics.analyses.attach.protocol import PHASES
from diagnostics.declare import Analysis, Column, Metric, Option, Table

DEFAULT_STEPS = 5

ANALYSIS = Analysis(
    name="attach", title="Run a script", target="diagnostics.analyses.attach.job:analyze", needs_model=False,
    view="ui.views.attach:show",
    report="diagnostics.render.charts.attach:attach_sections", timeout_s=300,
    description="your own training script, unmodified, profiled while it runs (python -m diagnostics run -- ...)",
    options=(
        Option("run_dir", "path", None, "the run folder the bootstrap wrote", required=True, flag=""),
        Option("command", "list", [], "the command that ran (for the record)", flag=""),
        Option("cwd", "path", None, "its working folder (for the record)", optional=True, flag=""),
        Option("steps", "int", DEFAULT_STEPS, "profiled steps", lo=1, hi=1000, flag=""),
        Option("at", "int", None, "the first profiled step (auto: after warm-up)", lo=2, optional=True, flag=""),
        Option("exit_code", "int", None, "the script's exit code", optional=True, flag=""),
    ),
    metrics=(
        Metric("step_ms", "ms", "Step time", "median step outside the profiled window, after warm-up", better="lower"),
        *(Metric(f"{k}_ms", "ms", f"{k.replace('_', ' ').capitalize()}", f"median {k.replace('_', ' ')} per step"
                 + (" (the rest of the step)" if k == "host" else ""), better="lower") for k in PHASES),
        Metric("bottleneck_share", "fraction", "Bottleneck share", "the largest part's share of the step"),
        Metric("step_ms_profiled", "ms", "Profiled step", "median step in the profiled window"),
        Metric("overhead_pct", "percent", "Profiler overhead", "profiled steps against the steps outside the window",
               better="lower"),
        Metric("steps", "count", "Steps seen"),
        Metric("profiled_steps", "count", "Profiled steps"),
        Metric("ranks", "count", "Processes that stepped"),
        Metric("exit_code", "number", "Exit code"),
        Metric("gpu_idle_ms", "ms", "GPU idle per step", better="lower"),
        Metric("kernel_ms", "ms", "Kernel time per step"),
        Metric("peak_memory_bytes", "bytes", "Peak memory", "largest per-step CUDA peak in the window", better="lower"),
        Metric("findings_failed", "count", "Findings failed", better="lower"),
        Metric("findings_warned", "count", "Findings warned", better="lower"),
    ),
    tables=(
        Table("step_table", "Steps", (Column("step_ms", "ms", "step"), *(Column(f"{k}_ms", "ms", k) for k in PHASES),
                                      Column("tool_ms", "ms", "ours"), Column("peak_bytes", "bytes", "peak"),
                                      Column("rss_bytes", "bytes", "resident"), Column("gpu_idle_ms", "ms", "GPU idle"),
                                      Column("kernel_ms", "ms", "kernels"))),
        Table("syncs", "Device syncs", (Column("ms_per_step", "ms", "ms per step"),)),
        Table("workers.per_worker", "DataLoader workers", (Column("fetch_collate_ms", "ms", "fetch + collate"),
                                                          Column("collate_ms", "ms", "collate"))),
        Table("findings", "Findings"),
        Table("fix_first", "Fix this first", (Column("est_saving_ms", "ms", "saving per step"),)),
    ),
)
