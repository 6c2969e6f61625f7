"""A trace job's stored result, found and put back: the reopen of an unchanged trace with the same options.

The trace job keeps its result beside the trace's cache entry (job._keep, diagnostics.trace.cache); a
second open finds it here (``find``) and returns it with the files it names linked into the new run's
folder (``restore``). Both the job (in its worker) and the CLI (in its own process, with no worker:
``trace analyze`` a second time answers at about the CLI's start-up) use these two, so a reopen is one
rule. Only the trace cache's index is read (JSON decoded into the typed TraceResult: never a pickle);
nothing here imports the trace job (job.py) or its critical path.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from diagnostics.analyses.trace import TRACE
from diagnostics.analyses.trace.result import TraceResult
from diagnostics.results import ResultError, decode
from diagnostics.settings import check_server_path, trace_cache_dir
from diagnostics.trace import cache as trace_cache
from diagnostics.trace.errors import TraceError

#: Options that choose where the work runs, not what it finds: left out of the stored result's key.
EXECUTION_OPTIONS = ("dask", "dask_memory_limit", "trust_dask_scheduler")
#: The parsed trace a run keeps, under the trace cache's own names (trace_cache.write_columns / read_columns).
META_FILE, EVENTS_FILE = trace_cache.META_FILE, trace_cache.EVENTS_FILE
#: The files a trace result names, kept beside it in the trace cache: result key -> file in the run folder.
RESULT_FILES = {"critical_path": "critical_path.pt.trace.json", "meta": META_FILE}
#: The ranks' mode on a reopen: their summaries and cross-rank views come with the stored analysis.
REOPEN_MODE = "the stored analysis of these ranks (unchanged files, same options): none read again"
#: The progress message of a reopen.
REOPEN_MESSAGE = "the stored analysis of this trace (unchanged file, same options)"


def result_key(options: dict) -> str:
    """The stored result's key: every option but where the work runs, and the stamps (path, size, mtime
    in ns) of the rank files the job reads, looked at now."""
    keyed = {k: v for k, v in options.items() if k not in EXECUTION_OPTIONS}
    if options.get("ranks"):
        from diagnostics.trace.ranks.checks import rank_paths   # only for several ranks

        keyed["ranks_stamps"] = [trace_cache.stamp(p) for p in rank_paths([str(check_server_path(r, "trace"))
                                                                           for r in options["ranks"]])]
    return trace_cache.result_key(keyed)


def find(path: str, options: dict) -> tuple[dict, dict, Path] | None:
    """(the stored result's plain form, {name: file it keeps}, the cache entry's folder) for the trace job
    on ``path`` with these validated ``options``, or None: none stored, the trace cache off, a file changed
    or gone."""
    if trace_cache.max_bytes() <= 0:
        return None
    try:
        folder = trace_cache.entry_folder(path, trace_cache_dir(), allow_truncated=options["allow_truncated"])
        key = result_key(options)
    except (OSError, TraceError):
        return None
    kept = trace_cache.kept_result(folder, key)
    return None if kept is None else (*kept, folder)


def restore(kept: tuple[dict, dict, Path], artifact_dir: str | Path | None, started: float,
            progress: Callable[[float, str], None] = lambda f, m: None) -> TraceResult | None:
    """The stored result ``find`` returned as this run's TraceResult: the files it names linked into
    ``artifact_dir``, this open's own figures (``trace_cache``: a hit from the stored result, its seconds
    since ``started``, a perf_counter time; the ranks read again: none). None when a file cannot be put
    in the run's folder or the stored form no longer fits TraceResult (then the job runs in full). It
    was built strictly when it was stored (results.build); read back, it is decoded as the store's runs
    are (results.decode), which skips build's second pass over a large result."""
    out, files, folder = kept
    art = Path(artifact_dir) if artifact_dir is not None else None
    if out.get("columns_dir"):
        if art is None or "meta" not in files or not (
                trace_cache.link_file(folder / trace_cache.EVENTS_FILE, art / EVENTS_FILE)
                and trace_cache.link_file(files["meta"], art / META_FILE)):
            return None
        out["columns_dir"] = str(art)
    cp = out.get("critical_path") or {}
    if cp.get("trace_file"):
        if art is None or "critical_path" not in files or not trace_cache.link_file(
                files["critical_path"], art / RESULT_FILES["critical_path"]):
            return None
        cp["trace_file"] = str(art / RESULT_FILES["critical_path"])
    ranks = out.get("ranks")
    if isinstance(ranks, dict):
        # This open's own figures, not the first run's: no rank was read, no worker ran.
        read = int(ranks.get("n_files") or 0) - len(ranks.get("failed") or ())
        ranks.update(mode=REOPEN_MODE, workers=[], cache={"hits": max(read, 0), "misses": 0, "kept": True})
        ranks.pop("memory_limit_bytes", None)
    out["trace_cache"] = {"hit": True, "result": True, "open_s": time.perf_counter() - started}
    if isinstance(ranks, dict):
        ranks["seconds"] = out["trace_cache"]["open_s"]
    progress(0.95, REOPEN_MESSAGE)
    try:
        return decode(TRACE, out)
    except ResultError:
        return None
