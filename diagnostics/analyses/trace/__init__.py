"""The trace explorer's analyses: open a Chrome/Kineto trace (trace), recompute one of its parts from the
columns a trace run kept (trace_timeline: the timeline for another time range; trace_critical_path:
another step's critical path) and compare two traces (trace_diff). The work is in job.py; the trace
layer (diagnostics.trace) does the reading and the views; result.py declares the typed results."""

from diagnostics.analyses.trace.result import (
    TraceCriticalPathResult, TraceDiffResult, TracePartial, TraceResult, TraceTimelineResult,
)
from diagnostics.declare import COMM_KERNELS, Analysis, Option, OptionError

TOP_N = 20


def _rank_paths(value: list) -> list:
    """The "ranks" option: trace files or folders, each a non-empty string."""
    bad = [v for v in value if not isinstance(v, str) or not v.strip()]
    if bad:
        raise OptionError(f"option ranks: each entry must be a trace file or folder path, got {bad[0]!r}")
    return value

TIMELINE_MAX_EVENTS = 4000

_TIMELINE = (
    Option("t0", "float", None, "timeline start (µs from the trace's first event)", optional=True, flag=""),
    Option("t1", "float", None, "timeline end (µs)", optional=True, flag=""),
    Option("max_events", "int", TIMELINE_MAX_EVENTS, "timeline bars drawn at most", lo=10, hi=200_000, flag=""),
)

# ---- Holistic Trace Analysis parity (diagnostics.trace.gpu_activity): options and tables -------------
# "definitions" picks every rule at once; the other options, when given, override one rule.
HTA_OPTIONS = (
    Option("definitions", "choice", "torchscope", "whose definitions the figures follow: torchscope, or hta to "
           "compare with Holistic Trace Analysis (overlap over compute kernels only, idle kernel wait "
           "under 30 µs with HTA's comparisons, the launch queue counting a kernel until it starts, launch "
           "delay from the end of the launch call)",
           choices=("torchscope", "hta")),
    Option("kernel_wait_us", "float", None, "idle gaps up to this long between queued GPU work count as "
           "kernel wait (auto: 5 µs; 30 µs under definitions=hta: HTA's consecutive_kernel_delay of 30, "
           "which it compares with Kineto's µs timestamps)", optional=True, lo=0,
           unit="us"),
    Option("overlap_compute", "choice", None, "computation in the communication overlap: gpu_work (kernels, "
           "copies, sets) or kernels (compute kernels only, as HTA); auto: by definitions", optional=True,
           choices=("gpu_work", "kernels")),
    Option("queue_until", "choice", None, "a launch stays in its stream's queue until its GPU work ends "
           "(kernel_end) or starts (kernel_start, as HTA); auto: by definitions", optional=True,
           choices=("kernel_end", "kernel_start")),
    Option("launch_delay_from", "choice", None, "launch delay measured from the launch call's start "
           "(call_start) or its end, negative delays clipped to 0 (call_end, as HTA); auto: by definitions",
           optional=True, choices=("call_start", "call_end")),
    Option("queue_full", "int", 1024, "launch queue length counted as full (HTA's max_queue_length)", lo=1,
           hi=1_000_000),
    Option("sequence_length", "int", 3, "longest run of consecutive kernels looked for as a fusion candidate "
           "(runs of 2 up to this)", lo=2, hi=16),
)
def _timeline_ranks(value: str) -> str:
    """The "timeline_ranks" option: "all" or rank numbers separated by commas."""
    text = value.strip()
    if text != "all" and not all(p.strip().isdigit() for p in text.split(",")):
        raise OptionError(f"option timeline_ranks: rank numbers separated by commas (0,5) or 'all', got {value!r}")
    return text


#: Where several ranks are analysed and which are drawn (issue #35, diagnostics.trace.ranks).
RANKS_OPTIONS = (
    Option("dask", "str", None, "analyse the ranks on a Dask cluster: its scheduler address (tcp://host:8786), or "
           "local:N for a LocalCluster of N worker processes on this machine (needs the optional packages dask and "
           "distributed); default: local processes", optional=True),
    Option("trust_dask_scheduler", "bool", False, "use the Dask scheduler address given with --dask: it runs code as "
           "you (distributed exchanges pickles, so whoever controls that cluster runs code in the trace job and on "
           "its workers); without it a scheduler address is refused (local:N needs no trust)"),
    Option("dask_memory_limit", "str", None, "memory limit of each worker of --dask local:N (e.g. 4GB; default "
           "80% of the available memory / N)", optional=True),
    Option("timeline_ranks", "str", None, "ranks drawn on the merged timeline: numbers separated by commas, or "
           "all (up to 8); default: the slowest rank and the rank that waits most", optional=True,
           check=_timeline_ranks),
)

#: The options `trace analyze` has flags for: the HTA-parity definitions and the user's communication kernels.
ANALYZE_FLAGS = HTA_OPTIONS + (COMM_KERNELS,)

#: The critical path's options (issue #18), kept together so other parts' options merge cleanly.
_CRITICAL_PATH = (
    Option("critical_path_step", "int", None, "the profiler step number whose critical path is "
           "computed; default: the longest complete step", optional=True, lo=0, flag=""),
)

TRACE = Analysis(
    name="trace", title="Trace explorer", target="diagnostics.analyses.trace.job:analyze", needs_model=False,
    timeout_s=600, result=TraceResult, view="ui.views.traces:show",
    report="diagnostics.render.charts.traces:trace_sections",
    # the first answer (issue #42): the Summary, sent as soon as the ingest is done; the CLI prints it first
    partial=TracePartial, partial_text="diagnostics.render.trace_summary:summary_lines",
    description="one torch.profiler / Kineto trace: steps, operators, kernels, idle time, launches",
    options=(
        Option("path", "path", None, "a .json or .json.gz trace file", required=True, flag=""),
        Option("display_name", "str", None, "the name the user knows the file by (uploads are stored under "
               "another)", optional=True, flag=""),
        Option("stamp", "dict", None, "path, size and mtime of the file, so a changed file is a new job",
               optional=True, flag=""),
        Option("top", "int", TOP_N, "rows kept per table (operators, kernels, launches)", lo=1, hi=100_000),
        Option("allow_truncated", "bool", False, "read what a truncated file holds instead of refusing it",
               flag=""),
        Option("keep_columns", "bool", True, "keep the parsed columns beside the run (fast timeline re-draws)",
               flag=""),
        # Multi-rank (diagnostics.trace.ranks): several ranks' traces side by side, in the result's "ranks".
        Option("ranks", "list", None, "trace files or folders of several ranks of one job: a per-rank table, "
               "checks that they are one run, a merged timeline", optional=True, flag="", check=_rank_paths),
        Option("ranks_names", "dict", None, "rank file path -> the name the user knows it by (uploads are "
               "stored under another)", optional=True, flag=""),
        Option("ranks_stamps", "list", None, "path, size and mtime of the rank files, so a changed file is a "
               "new job", optional=True, flag=""),
    ) + RANKS_OPTIONS + _TIMELINE + HTA_OPTIONS + (COMM_KERNELS,) + _CRITICAL_PATH,
)

#: The parts recomputed from a trace run's kept columns (its keep_columns option) read them from here.
_COLUMNS_DIR = Option("columns_dir", "path", None, "where a trace run kept its parsed columns", required=True, flag="")

TRACE_TIMELINE = Analysis(
    name="trace_timeline", title="Trace timeline", target="diagnostics.analyses.trace.job:analyze_timeline",
    needs_model=False, result=TraceTimelineResult, view="ui.views.traces:show_range",
    description="the timeline of a trace opened before, for another time range",
    options=(_COLUMNS_DIR,) + _TIMELINE,
)

TRACE_CRITICAL_PATH = Analysis(
    name="trace_critical_path", title="Trace critical path",
    target="diagnostics.analyses.trace.job:analyze_critical_path", needs_model=False,
    result=TraceCriticalPathResult, view="ui.views.critical_path:show_part",
    report="diagnostics.render.charts.critical_path:critical_path_part_sections",
    description="another step's critical path of a trace opened before (from its kept columns)",
    options=(_COLUMNS_DIR,) + _CRITICAL_PATH,
)

TRACE_DIFF = Analysis(
    name="trace_diff", title="Trace diff", target="diagnostics.analyses.trace.job:analyze_diff", needs_model=False,
    timeout_s=600, result=TraceDiffResult, view="ui.views.traces:show_diff",
    report="diagnostics.render.charts.traces:trace_diff_sections",
    description="two traces compared by operator and kernel: added, removed, faster, slower",
    options=(
        Option("before", "path", None, "the baseline trace", required=True, flag=""),
        Option("after", "path", None, "the trace to compare with it", required=True, flag=""),
        Option("stamps", "list", None, "path, size and mtime of both files", optional=True, flag=""),
    ),
)

ANALYSES = (TRACE, TRACE_TIMELINE, TRACE_CRITICAL_PATH, TRACE_DIFF)
