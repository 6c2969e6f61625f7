"""``trace analyze PATH`` / ``trace diff A B``: the registered "trace" / "trace_diff" analyses as CLI jobs.

The CLI runs them like every other command (diagnostics.__main__.run_job_command: a worker, the
run store with source "cli", progress, the report folder); this module says what to run for the
parsed arguments and how to show the result. What it prints and writes (``--json``, result.json,
report.html, CSVs) is shaped like ``python -m diagnostics.cli.trace_text --json``:
``{"name", "path", "summary", "top_operators", "temporal_breakdown", "idle_time", "launch_stats",
"timeline", "metrics"}`` for "trace" and ``{"before", "after", "diff", "metrics"}`` for
"trace_diff". The store keeps the analysis' own result, which the dashboard's History reopens.
"""

from __future__ import annotations

from pathlib import Path

from diagnostics.trace.views import TOP_N

#: Rows shown in the text output when --top is not given.
DEFAULT_TOP = {"analyze": 10, "diff": 15}
#: The analysis result's keys -> the CLI's (and report layout's) names for them.
RENAMED = {"top": "top_operators", "breakdown": "temporal_breakdown", "idle": "idle_time", "launch": "launch_stats"}
#: Where the worker keeps the parsed columns for the dashboard's timeline re-draw: of no use in a report.
NOT_SHOWN = ("columns_dir",)


def trace_job(args) -> tuple[str, dict]:
    """(analysis, options) for ``trace analyze`` / ``trace diff``; options as the Trace explorer page sends
    them, so the run is the same job. Raises TorchScopeError naming a file that is not there (exit 2)."""
    from diagnostics.analyses.trace.job import file_stamp

    if args.trace_command == "analyze":
        stamp = file_stamp(args.path)
        options = {"path": stamp["path"], "stamp": stamp}
        if args.top is not None and args.top > TOP_N:  # the analysis keeps TOP_N rows per table unless told
            options["top"] = args.top
        return "trace", options
    stamps = [file_stamp(args.a), file_stamp(args.b)]
    return "trace_diff", {"before": stamps[0]["path"], "after": stamps[1]["path"], "stamps": stamps}


def cli_result(analysis: str, result: dict) -> dict:
    """The analysis' result with the CLI's key names (see the module docstring)."""
    out = {RENAMED.get(k, k): v for k, v in (result or {}).items() if k not in NOT_SHOWN}
    if analysis == "trace":
        order = ["name", "path", "summary", *RENAMED.values()]
        out = {**{k: out[k] for k in order if k in out}, **{k: v for k, v in out.items() if k not in order}}
    return out


def report_title(args) -> str:
    if args.trace_command == "analyze":
        return f"TorchScope trace: {Path(args.path).name}"
    return f"TorchScope trace diff: {Path(args.a).name} -> {Path(args.b).name}"


def text(args, result: dict) -> str:
    """What ``trace analyze`` / ``trace diff`` print without --json (the first --top rows of each table)."""
    from diagnostics.cli import trace_text as trace_cli
    top = args.top if args.top is not None else DEFAULT_TOP[args.trace_command]
    if args.trace_command == "analyze":
        return trace_cli.format_analysis(result, top)
    return trace_cli.format_diff(result["diff"], args.a, args.b, top)
