"""Where the ranks' tasks run: a local process pool (the default) or a Dask cluster.

    with executor_for(dask=None, paths=files) as ex:          # local processes
    with executor_for(dask="local:2", paths=files) as ex:     # a LocalCluster of 2 workers
    with executor_for(dask="tcp://10.0.0.5:8786") as ex:      # an existing Dask scheduler
        for i, result, error in ex.map(fn, items): ...

Each worker runs one task at a time (one rank at a time: the streaming ingest holds one trace's
columns), so memory is O(workers x one rank), never O(ranks). ``map`` yields every item's result or
the exception that ended it (a rank that fails is named by the caller, never fatal); results come as
they finish. A worker process that dies (out of memory, killed) fails its task, not the run.

Dask (``dask`` and ``distributed``) is optional: without it ``--dask`` is refused with the command
that installs it. On a remote cluster the workers must have TorchScope importable (the same code) and
see the trace files at the paths given (a shared file system, or the same paths on every node).

A scheduler the user names runs code as them: distributed's protocol is pickle, so whoever controls
that scheduler or its workers runs code in the process that holds the Client (the trace job) and in
the workers. It is used only when the caller says it is trusted (``trusted=True``: the trace option
``trust_dask_scheduler``, the CLI's ``--trust-dask-scheduler``); the trace job's results still reach
the tool through the runner's schema'd channel (runner/channel.py), never as a pickle. A LocalCluster
(``local:N``) listens on 127.0.0.1, which a trace job run with namespaces has to itself (its own
network namespace, loopback only: diagnostics/namespaces.py).
"""

from __future__ import annotations

import multiprocessing
import os
import re
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from diagnostics.trace.errors import TraceError

#: Processes analysing ranks at once, at most (and never more than the CPU count or the ranks).
MAX_RANK_WORKERS = 4
#: Memory one rank's summary needs, per byte of decoded trace JSON (the columns and the per-step views);
#: local processes at once are bounded so that together they need at most half the available memory.
MEMORY_PER_JSON_BYTE = 1.5
#: A LocalCluster's memory limit per worker, by default: this share of the available memory / workers.
LOCAL_CLUSTER_MEMORY_SHARE = 0.8
#: Where a LocalCluster's scheduler and workers listen: loopback (in a trace job with namespaces, its own).
LOCAL_CLUSTER_HOST = "127.0.0.1"
DASK_INSTALL = "pip install 'dask[distributed]>=2024.1'"
_LOCAL_RE = re.compile(r"^local(?::(\d+))?$")
#: Why a scheduler address needs the trust flag (the error says it).
REMOTE_TRUST = ("a Dask scheduler runs code as you: distributed exchanges pickles, so whoever controls that "
                "scheduler or its workers runs code in this job and on the workers. Use a scheduler address only "
                "for a cluster you control, and say so with --trust-dask-scheduler (option "
                "trust_dask_scheduler=true); local:N (a cluster of this machine's processes) needs no trust flag")


def is_remote(dask: str | None) -> bool:
    """Whether ``dask`` names a scheduler (an address), not a LocalCluster (``local[:N]``) or nothing."""
    return bool(dask and dask.strip()) and not _LOCAL_RE.match(dask.strip())


def check_trusted(dask: str | None, trusted: bool) -> None:
    """A scheduler address is refused unless the user said it is trusted (REMOTE_TRUST)."""
    if is_remote(dask) and not trusted:
        raise TraceError(f"--dask {dask.strip()}: refused: {REMOTE_TRUST}")


def decoded_size(path) -> int:
    """A trace's decoded JSON size (a .gz file's guessed from its compressed size)."""
    from diagnostics.trace.ingest import GZ_RATIO_GUESS

    size = Path(path).stat().st_size
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    return int(size * (GZ_RATIO_GUESS if gz else 1))


def _available_memory() -> int | None:
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except (ImportError, OSError):
        return None


def memory_workers(paths: list[str]) -> int:
    """How many ranks fit in half the available memory at once (by the largest trace's decoded size)."""
    available = _available_memory()
    if available is None or not paths:
        return MAX_RANK_WORKERS
    need = max(1, max(int(decoded_size(p) * MEMORY_PER_JSON_BYTE) for p in paths))
    return max(1, int(available * 0.5 // need))


class LocalPool:
    """Ranks in local worker processes (spawned), or one after another where processes cannot run."""

    def __init__(self, paths: list[str], parallel: bool | None = None, workers: int | None = None):
        n = len(paths)
        cpus = os.cpu_count() or 1
        self.workers = min(MAX_RANK_WORKERS, cpus, max(1, n), memory_workers(paths)) if workers is None else workers
        self.why = None
        if parallel is False:
            self.why = "asked for"
        elif self.workers < 2:
            self.why = ("one rank" if n < 2 else "one CPU" if cpus < 2
                        else "not enough free memory for two ranks at once")
        elif multiprocessing.current_process().daemon:
            self.why = "this process is a daemon and may not start processes"
        self.pool = None
        self.memory_limit = None

    @property
    def mode(self) -> str:
        return f"parallel ({self.workers} processes)" if self.why is None else f"sequential ({self.why})"

    def map(self, fn, items: list, progress=None):
        """(index, result, None) or (index, None, exception) for each item, as they finish."""
        if self.why is None:
            try:
                yield from self._parallel(fn, items, progress)
                return
            except (OSError, BrokenProcessPool, PermissionError) as e:
                self.why = f"worker processes could not run ({type(e).__name__}: {e})"
        for i, item in enumerate(items):
            try:
                yield i, fn(*item), None
            except Exception as e:  # noqa: BLE001 - one rank's failure is reported, not fatal
                yield i, None, e

    def _parallel(self, fn, items, progress):
        done: set = set()
        # No max_tasks_per_child: Python 3.11's pool can hang replacing a worker that left after its quota
        # (seen at 64 ranks); a worker's memory goes back to what one rank needs after each task.
        with ProcessPoolExecutor(max_workers=self.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.submit(fn, *item): i for i, item in enumerate(items)}
            for fut in as_completed(futures):
                i = futures[fut]
                err = fut.exception()
                if isinstance(err, BrokenProcessPool) and not done:
                    raise err  # nothing ran: the caller falls back to one after another
                done.add(i)
                yield (i, None, err) if err is not None else (i, fut.result(), None)

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class DaskExecutor:
    """Ranks as tasks of a Dask cluster: an existing scheduler (its address) or a LocalCluster of N
    single-threaded worker processes with a memory limit each (``local:N``)."""

    def __init__(self, spec: str, paths: list[str], memory_limit: str | int | None = None):
        try:
            from dask.distributed import Client, LocalCluster
        except ImportError:
            raise TraceError(f"--dask needs the optional packages dask and distributed: {DASK_INSTALL}") from None
        self.cluster = None
        m = _LOCAL_RE.match(spec.strip())
        if m:
            n = int(m.group(1) or 2)
            if n < 1:
                raise TraceError(f"--dask local:N needs at least one worker, got {spec!r}")
            if memory_limit is None:
                available = _available_memory()
                memory_limit = int(available * LOCAL_CLUSTER_MEMORY_SHARE / n) if available else "auto"
            import logging

            # Loopback only, said here rather than left to distributed's default; no dashboard (an HTTP port).
            self.cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, memory_limit=memory_limit,
                                        host=LOCAL_CLUSTER_HOST, dashboard_address=None, silence_logs=logging.ERROR)
            self.client = Client(self.cluster)
            self.where = f"a Dask LocalCluster of {n} worker processes"
        else:
            try:
                self.client = Client(spec, timeout="20s")
            except (OSError, TimeoutError) as e:
                raise TraceError(f"--dask {spec}: cannot reach the Dask scheduler ({e})") from None
            self.where = f"the Dask cluster at {spec}"
        info = self.client.scheduler_info()
        limits = [w.get("memory_limit") for w in info.get("workers", {}).values()]
        self.workers = len(limits)
        self.memory_limit = max((x for x in limits if x), default=None)

    @property
    def mode(self) -> str:
        limit = f", {self.memory_limit / 2**30:.1f} GiB memory limit per worker" if self.memory_limit else ""
        return f"dask ({self.where}: {self.workers} workers{limit})"

    def map(self, fn, items: list, progress=None):
        from dask.distributed import as_completed as dask_completed

        futures = [self.client.submit(fn, *item, pure=False, retries=0) for item in items]
        index = {f.key: i for i, f in enumerate(futures)}
        for fut in dask_completed(futures):
            i = index[fut.key]
            if fut.status == "error":
                yield i, None, fut.exception()
            else:
                yield i, fut.result(), None
            fut.release()

    def close(self):
        try:
            self.client.close()
        finally:
            if self.cluster is not None:
                self.cluster.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def executor_for(dask: str | None, paths: list[str], parallel: bool | None = None,
                 memory_limit: str | int | None = None, trusted: bool = False):
    """A LocalPool, or a DaskExecutor when ``dask`` names a scheduler address (``trusted`` only) or
    ``local[:N]``."""
    check_trusted(dask, trusted)
    if dask:
        return DaskExecutor(dask, paths, memory_limit)
    return LocalPool(paths, parallel)
