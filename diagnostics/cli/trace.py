"""``trace analyze PATH`` / ``trace diff A B``: the registered "trace" / "trace_diff" analyses as CLI jobs.

The CLI runs them like every other command (diagnostics.cli.main.run_job_command: a worker, the
run store with source "cli", progress, the report folder); this module says what to run for the
parsed arguments and how to show the result. ``--json``, result.json and the report hold the
analysis' own result (``summary``, ``temporal_breakdown``, ``top_operators``, ``idle_time``,
``launch_stats``, ``critical_path``, ``timeline``, ``trace_cache``, ``metrics`` for "trace", and ``ranks``
when several rank traces are given; ``before``, ``after``, ``diff``, ``trace_cache``, ``metrics`` for
"trace_diff"), less where the worker kept its parsed columns.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from diagnostics.analyses.trace import ANALYZE_FLAGS, HTA_OPTIONS, RANKS_OPTIONS, TOP_N
from diagnostics.analyses.trace.result import TraceDiffResult, TraceResult
from diagnostics.cli.options import add_option, dest
from diagnostics.results import UNSET, to_json

#: Rows shown in the text output when --top is not given.
DEFAULT_TOP = {"analyze": 10, "diff": 15}


def add_trace_options(parser) -> None:
    """The flags of ``trace analyze`` that the trace analysis declares (its HTA-parity options and the
    user's communication kernels)."""
    group = parser.add_argument_group("analysis definitions (Holistic Trace Analysis parity)")
    for o in HTA_OPTIONS:
        add_option(group, o)
    for o in ANALYZE_FLAGS[len(HTA_OPTIONS):]:
        add_option(parser, o)
    group = parser.add_argument_group("several ranks (one trace per rank: files or a folder)")
    for o in RANKS_OPTIONS:
        add_option(group, o)


def trace_job(args) -> tuple[str, dict]:
    """(analysis, options) for ``trace analyze`` / ``trace diff``; options as the Trace explorer page sends
    them, so the run is the same job. Raises TorchScopeError naming a file that is not there (exit 2)."""
    from diagnostics.trace.cache import stamp as file_stamp

    if args.trace_command == "analyze":
        paths = _paths(args)
        ranks = len(paths) > 1 or Path(paths[0]).is_dir()
        if ranks:  # several ranks' traces: the first file is opened in full, all are compared
            files = _rank_files(paths)
            stamp = file_stamp(str(files[0]))
        else:
            stamp = file_stamp(paths[0])
        options = {"path": stamp["path"], "stamp": stamp}
        if getattr(args, "step", None) is not None:  # the critical path's step (#18)
            options["critical_path_step"] = args.step
        if ranks:
            options["ranks"] = [str(Path(p).resolve()) for p in paths]
            options["ranks_stamps"] = [file_stamp(str(f)) for f in files]
        if args.top is not None and args.top > TOP_N:  # the analysis keeps TOP_N rows per table unless told
            options["top"] = args.top
        options.update({o.key: getattr(args, dest(o)) for o in ANALYZE_FLAGS + RANKS_OPTIONS
                        if getattr(args, dest(o), None) is not None})
        return "trace", options
    stamps = [file_stamp(args.a), file_stamp(args.b)]
    return "trace_diff", {"before": stamps[0]["path"], "after": stamps[1]["path"], "stamps": stamps}


def in_process(name: str, options: dict, store, progress=lambda f, m: None, cancel=None, timeout=None,
               partial=None):
    """``trace analyze`` of one file answered in the CLI's own process, or None (then the job runs in a
    worker as every job does). Two cases, each recorded in ``store`` like any run (source "cli"):

    - a reopen: the trace job's stored result for these files and options (analyses/trace/stored.py,
      the job's own rule), its files linked into the run's folder; neither the trace job (job.py) nor
      its critical path is imported;
    - a first open of one trace file, without --timeout: the trace job itself, here (runner.execute: the
      result encoded and decoded once, as from a worker). A trace job runs no user code and needs no
      torch, and a worker costs a spawn and torch's import, several times a small trace's parse. Ctrl-C
      stops it (recorded as cancelled, ``cancel`` set); it has no memory cap but the machine's. ``partial``
      gets its partial result (the Summary, as soon as it is computed), as from a worker.

    Several ranks (their own processes or Dask), ``trace diff`` and --timeout go through the worker.
    Options that fail validation are left to the runner, whose error names them."""
    import time

    from diagnostics.analyses.trace import TRACE, stored
    from diagnostics.errors import TorchScopeError
    from diagnostics.runner import Job, JobOutcome
    from diagnostics.settings import check_server_path
    from diagnostics.store import StoreError

    if name != "trace":
        return None
    t = time.perf_counter()
    try:
        job = Job(name, None, TRACE.validate(options))
        if not check_server_path(job.options["path"], "trace").is_file():
            return None
        kept = stored.find(str(job.options["path"]), job.options)
    except (TorchScopeError, OSError):
        return None
    if kept is None and (job.options["ranks"] or timeout is not None):
        return None
    try:
        run_id = store.create_run(name, spec=None, options=job.options, cache_key=job.key(),
                                  model_label=job.label(), device="cpu", source="cli")
    except StoreError as e:   # read-only or full: said once, as the runner says it
        return JobOutcome("error", error=str(e), error_type="StoreError")
    art = store.artifact_dir(run_id)
    art.mkdir(parents=True, exist_ok=True)
    if kept is not None:
        result = stored.restore(kept, art, t, progress)
        if result is None:   # a file it names could not be linked: run the job after all
            store.delete(run_id)
            return None
        outcome = JobOutcome("ok", result=result)
    else:
        outcome = _execute(job, art, progress, cancel, partial)
    outcome.run_id, outcome.artifact_dir = run_id, str(art)
    from diagnostics import jobfiles

    try:
        store.finish_run(run_id, outcome.status, result=outcome.result, error=outcome.error,
                         artifacts=jobfiles.listing(art))
    except StoreError as e:   # as run_job: the answer is there, its run could not be stored
        outcome.error = f"{e} (the job itself ended '{outcome.status}'; its run is not stored)"
        outcome.status, outcome.error_type = "error", "StoreError"
    outcome.duration_s = time.perf_counter() - t
    return outcome


def _execute(job, artifact_dir, progress, cancel, partial=None):
    """The trace job in this process: its JobOutcome, a failure's message as the worker words it."""
    import signal
    import traceback

    from diagnostics.errors import TorchScopeError
    from diagnostics.runner import CANCELLED_MESSAGE, JobOutcome, execute

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)   # Ctrl-C stops this job
    try:
        return JobOutcome("ok", result=execute(job, artifact_dir, progress, partial))
    except KeyboardInterrupt:
        if cancel is not None:
            cancel.set()
        return JobOutcome("cancelled", error=CANCELLED_MESSAGE, error_type="JobError")
    except TorchScopeError as e:
        return JobOutcome("error", error=str(e), error_type=type(e).__name__)
    except MemoryError as e:
        return JobOutcome("oom", error=f"ran out of memory: {e}", error_type=type(e).__name__)
    except Exception as e:
        return JobOutcome("error", error=f"{type(e).__name__}: {e}", error_type=type(e).__name__,
                          log_tail=traceback.format_exc(limit=8))
    finally:
        signal.signal(signal.SIGINT, previous)


def _paths(args) -> list[str]:
    return list(args.path) if isinstance(args.path, (list, tuple)) else [args.path]


def _rank_files(paths: list[str]) -> list:
    """The trace files the rank paths name (TorchScopeError, exit 2, for one that is not there)."""
    from diagnostics.errors import TorchScopeError
    from diagnostics.trace.errors import TraceError
    from diagnostics.trace.ranks import rank_paths

    try:
        return rank_paths(paths)
    except TraceError as e:
        raise TorchScopeError(str(e)) from None


def cli_result(analysis: str, result: TraceResult | TraceDiffResult) -> TraceResult | TraceDiffResult:
    """The analysis' result as the CLI shows and writes it: less ``columns_dir``, where the worker keeps the
    parsed columns for the dashboard's recomputed parts (of no use in a report)."""
    if isinstance(result, TraceResult) and result.columns_dir:
        return msgspec.structs.replace(result, columns_dir=UNSET)
    return result


def report_memo_text(result: TraceResult | TraceDiffResult) -> str:
    """What keys the report body kept for a trace result (diagnostics.render.report_memo): the result less what
    differs between two opens of the same trace and the report does not show (how the open went, where the
    run keeps its marked trace), so that a reopen reuses the first open's charts."""
    if isinstance(result, TraceResult):   # (a trace diff's is its whole result: checked on trace analyze only)
        cp = result.critical_path
        if cp and cp.trace_file:
            cp = msgspec.structs.replace(cp, trace_file=UNSET)
        result = msgspec.structs.replace(result, trace_cache=UNSET, critical_path=cp)
    return to_json(result)


def report_title(args) -> str:
    if args.trace_command == "analyze":
        paths = _paths(args)
        if len(paths) > 1 or Path(paths[0]).is_dir():
            return f"TorchScope trace: {len(paths)} rank path(s), {Path(paths[0]).name} first"
        return f"TorchScope trace: {Path(paths[0]).name}"
    return f"TorchScope trace diff: {Path(args.a).name} -> {Path(args.b).name}"


def text(args, result: TraceResult | TraceDiffResult) -> str:
    """What ``trace analyze`` / ``trace diff`` print without --json (the first --top rows of each table)."""
    from diagnostics.render.text import format_analysis, format_diff

    top = args.top if args.top is not None else DEFAULT_TOP[args.trace_command]
    if args.trace_command == "analyze":
        return format_analysis(result, top, summary=False)   # printed first, as the job's partial result
    return format_diff(result.diff, args.a, args.b, top)
