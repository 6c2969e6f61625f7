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

from diagnostics.devices import logical_cores
from diagnostics.trace.errors import TraceError
from diagnostics.trace.mainless import plain_main

#: Processes analysing ranks at once, at most (and never more than the machine's logical cores, devices.logical_cores,
#: the ranks, or what the available memory holds: memory_workers).
MAX_RANK_WORKERS = 4
#: Memory one rank's summary needs above its worker's start-up: TASK_FIXED_BYTES, MEMORY_PER_EVENT per event
#: (the columns, the nesting, the per-step views) and MEMORY_PER_JSON_BYTE per byte of decoded JSON (what the
#: reader holds). Fitted on public traces of 6.8-46 MB (bench/bench_worker_memory.py; docs/BENCHMARKS.md, "Rank
#: workers' memory"): 0.9-2.8 KB more per event, 25-97 MB at the least, the most on with_stack traces (many
#: short Python-frame events); the old 1.5 bytes per byte alone let a worker reach 9.8x its JSON.
MEMORY_PER_EVENT = 3584
MEMORY_PER_JSON_BYTE = 1.5
TASK_FIXED_BYTES = 100 << 20
#: A worker process's own memory before its first rank (the interpreter, numpy, pandas, pyarrow: 108 MiB measured).
WORKER_BASE_BYTES = 128 << 20
#: Local processes at once are bounded so that together they need at most this share of the available memory.
LOCAL_MEMORY_SHARE = 0.5
#: Decoded JSON read from a rank's start to count its events per byte (rank_events).
EVENT_SAMPLE_BYTES = 4 << 20
#: Bytes per event where a sample finds none (the densest traces read ~220).
MIN_BYTES_PER_EVENT = 200
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


#: Decoded / compressed size of a gzip trace JSON, at least (read 8-17 on the public traces).
GZ_MIN_RATIO = 2


def decoded_size(path) -> int:
    """A trace's decoded JSON size: a .gz file's from its gzip trailer (ISIZE: the size modulo 2**32, so past
    4 GiB the multiple of 2**32 that gives at least GZ_MIN_RATIO), its compressed size x GZ_RATIO_GUESS when
    the trailer cannot be read."""
    from diagnostics.trace.ingest import GZ_RATIO_GUESS

    size = Path(path).stat().st_size
    with open(path, "rb") as f:
        if f.read(2) != b"\x1f\x8b":
            return size
        if size < 20:
            return int(size * GZ_RATIO_GUESS)
        f.seek(-4, 2)
        isize = int.from_bytes(f.read(4), "little")
    while isize < size * GZ_MIN_RATIO and size * GZ_MIN_RATIO < 1 << 40:
        isize += 1 << 32
    return isize


def rank_events(path) -> int:
    """A rank's events, estimated: its decoded size over the bytes per event of its first
    EVENT_SAMPLE_BYTES of JSON (each event has one "ph"), exact for a file no larger than the sample."""
    import gzip

    size = decoded_size(path)
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    try:
        with (gzip.open(path, "rb") if gz else open(path, "rb")) as f:
            head = f.read(EVENT_SAMPLE_BYTES)
    except (OSError, EOFError):
        return size // MIN_BYTES_PER_EVENT
    n = head.count(b'"ph"')
    if len(head) < EVENT_SAMPLE_BYTES:
        return n
    return int(size * n / len(head)) if n else size // MIN_BYTES_PER_EVENT


def rank_memory(path) -> int:
    """Memory one worker needs to summarise the rank at ``path``: its start-up, TASK_FIXED_BYTES,
    MEMORY_PER_EVENT per (estimated) event and MEMORY_PER_JSON_BYTE per byte of decoded JSON."""
    return (WORKER_BASE_BYTES + TASK_FIXED_BYTES + rank_events(path) * MEMORY_PER_EVENT
            + int(decoded_size(path) * MEMORY_PER_JSON_BYTE))


def _available_memory() -> int | None:
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except (ImportError, OSError):
        return None


def memory_workers(paths: list[str]) -> int:
    """How many ranks fit in LOCAL_MEMORY_SHARE of the available memory at once (rank_memory of the largest)."""
    available = _available_memory()
    if available is None or not paths:
        return MAX_RANK_WORKERS
    need = max(rank_memory(p) for p in paths)
    return max(1, int(available * LOCAL_MEMORY_SHARE // need))


class LocalPool:
    """Ranks in local worker processes (spawned), or one after another where processes cannot run."""

    def __init__(self, paths: list[str], parallel: bool | None = None, workers: int | None = None):
        n = len(paths)
        cpus = logical_cores()
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
            with plain_main():  # workers start at submit
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
            # Its nannies spawn the worker processes now: not re-running a page script as their main (under an
            # AppTest's, every nanny failed to start: "name '__args' is not defined").
            with plain_main():
                self.cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                            memory_limit=memory_limit, host=LOCAL_CLUSTER_HOST, dashboard_address=None,
                                            silence_logs=logging.ERROR)
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
        self.need = max((rank_memory(p) for p in paths if os.path.exists(p)), default=None)

    @property
    def mode(self) -> str:
        limit = f", {self.memory_limit / 2**30:.1f} GiB memory limit per worker" if self.memory_limit else ""
        short = ""
        if self.memory_limit and self.need and self.need > self.memory_limit:
            short = (f"; the largest rank needs about {self.need / 2**30:.1f} GiB (rank_memory), above that limit: "
                     "fewer workers (local:N) or a larger --memory-limit keep them from being killed")
        return f"dask ({self.where}: {self.workers} workers{limit}{short})"

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
