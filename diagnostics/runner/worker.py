"""The worker process: starting a cold one (``start_cold_worker``), its entry (``job_main``, one job
in either kind of worker: a cold one or a spare), the caps applied inside it (address space, file
size), how a failure is classified (out of memory, the GPU's memory, the disk quota), and starting
a spawned process without re-running the caller's main script (``main_script_hidden``)."""

from __future__ import annotations

import errno
import gc
import multiprocessing as mp
import os
import sys
import traceback
from contextlib import contextmanager
from pathlib import Path

import psutil

import diagnostics.jobfiles as jobfiles
import diagnostics.procs as procs
import diagnostics.sandbox as sandbox
from diagnostics.errors import TorchScopeError
from diagnostics.results import to_plain
from diagnostics.runner.channel import Baseline, ChannelError, Failed, Ok, Partial, Progress, Sender
from diagnostics.runner.job import Job, execute
from diagnostics.runner.limits import MEMORY_LIMIT_ENV
from diagnostics.runner.logs import LogDrain


#: How far a failure's cause chain is followed (``__cause__``, else ``__context__``).
CAUSE_CHAIN_DEPTH = 10


def _cause_chain(exc: BaseException | None):
    """``exc`` and what caused it, nearest first: ``__cause__`` where one was given, else ``__context__``;
    at most CAUSE_CHAIN_DEPTH of them (a chain may loop back on itself)."""
    for _ in range(CAUSE_CHAIN_DEPTH):
        if exc is None:
            return
        yield exc
        exc = exc.__cause__ or exc.__context__


def _is_oom(exc: BaseException) -> bool:
    """MemoryError, torch's OutOfMemoryError, or an allocator message, anywhere in the cause chain."""
    return any(isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError"
               or any(m in str(e).lower() for m in ("out of memory", "can't allocate memory", "cannot allocate memory"))
               for e in _cause_chain(exc))


def _is_file_too_big(exc: BaseException) -> bool:
    """A write past RLIMIT_FSIZE (EFBIG) anywhere in the cause chain: the job's disk quota."""
    return any(isinstance(e, OSError) and e.errno == errno.EFBIG for e in _cause_chain(exc))


def _is_gpu_oom(exc: BaseException) -> bool:
    """torch's OutOfMemoryError (the CUDA caching allocator's) anywhere in the cause chain."""
    return any(type(e).__name__ == "OutOfMemoryError" or "cuda out of memory" in str(e).lower()
               for e in _cause_chain(exc))


def _cap_address_space(base: int, extra: int) -> None:
    """Cap the worker's address space (RLIMIT_AS) at ``base``, what it maps once torch is loaded,
    plus ``extra``.

    Counted from that baseline because a CUDA build of torch maps gigabytes of libraries before a
    job allocates anything (a flat 1.5 GiB cap failed to load libtorch_cpu.so there). Only the soft
    limit is set: the distributed launch lifts it again for torchrun's ranks (NCCL maps device
    memory into the address space and failed with 'out of memory' under the worker's cap).
    """
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = base + extra if hard == resource.RLIM_INFINITY else min(base + extra, hard)
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _worker_main(job_dict: dict, conn, log_conn, artifact_dir: str, mem_limit: int | None,
                 parent_pid: int, tmp_dir: str | None = None, hidden: tuple = (), caps: dict | None = None) -> None:
    """A cold worker: started for this one job."""
    sandbox.scrub_environment()  # first: nothing of the dashboard's environment reaches the job
    os.dup2(log_conn.fileno(), 1)
    os.dup2(log_conn.fileno(), 2)
    log_conn.close()
    job_main(job_dict, Sender(conn), artifact_dir, mem_limit, parent_pid, tmp_dir, hidden, caps=caps)


def _cap_file_size(limit: int) -> None:
    """No file the job writes may grow past ``limit`` (RLIMIT_FSIZE; Python ignores SIGXFSZ, so the
    write fails with EFBIG): the disk quota holds even for one file written faster than it is watched."""
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))


def _failure(e: BaseException, mem_limit: int | None, disk_bytes: int | None) -> Failed:
    """What the runner is told of a job that raised ``e``: out of its disk quota, out of memory (the
    GPU's, or the worker's cap), one of our own errors (its message alone), or anything else (with
    its traceback). Called inside the ``except`` block, while the traceback is current.

    Our own errors say what happened: one is an OOM only when it wraps one (a model's forward
    running out), not when its text mentions memory (a distributed rank's report, say)."""
    mine = isinstance(e, TorchScopeError)
    if _is_file_too_big(e) and disk_bytes:
        text = (f"the job wrote a file past its disk quota of {disk_bytes / 2**20:,.0f} MiB "
                f"(set {jobfiles.DISK_ENV}): {type(e).__name__}: {e}")
        return Failed("error", "JobError", text, traceback.format_exc(limit=8))
    if _is_oom(e.__cause__ or e.__context__ if mine else e):
        if _is_gpu_oom(e):  # the device's memory, not this worker's cap
            text = f"the GPU ran out of memory: {e}"
        else:
            cap = f" (the worker's cap is {mem_limit / 2**30:.1f} GiB; set {MEMORY_LIMIT_ENV})" if mem_limit else ""
            text = f"ran out of memory{cap}: {e}"
        return Failed("oom", type(e).__name__, text, traceback.format_exc(limit=8))
    if mine:
        return Failed("error", type(e).__name__, str(e), "")
    return Failed("error", type(e).__name__, f"{type(e).__name__}: {e}", traceback.format_exc(limit=8))


def job_main(job_dict: dict, conn: Sender, artifact_dir: str, mem_limit: int | None, parent_pid: int,
              tmp_dir: str | None = None, hidden: tuple = (), close: tuple = (), caps: dict | None = None) -> None:
    """Run one job in this process and exit: guardian, sandbox, memory cap, the job, its answer.

    ``conn``: the job's end of its channel to the runner, a bare descriptor that sends typed messages
    as bytes (runner.channel): the model's code runs in this process and can reach it (a frame walk, the
    descriptor's number), but all it can send is data the runner decodes against the schema.

    A cold worker calls it before torch is imported; a spare (``spare_pool._spare_main``) after, with torch's
    threads running: the guardian's fork leaves the job process with a single thread either way, so
    the sandbox is applied to it exactly as in a cold worker. ``caps``: the job's disk quota
    (``disk_bytes``) and the size of its private /dev/shm (``shm_bytes``)."""
    caps = caps or {}
    # This process stays behind as the job's guardian (it ends whatever the job leaves running,
    # also when the parent is killed); the job runs in the forked process that returns here.
    procs.guard(parent_pid, close=(conn, *close))
    import faulthandler

    faulthandler.enable()  # a segfault in native code leaves a Python traceback in worker.log
    setup_error = None
    try:  # the sandbox, once the job is known: before any user code, and before torch starts a thread
        line = sandbox.enter(Job.from_dict(job_dict), Path(artifact_dir), Path(tmp_dir or artifact_dir), hidden,
                             shm_bytes=caps.get("shm_bytes"), close=(conn, *close), exit_as=procs.exit_as)
        print(line, flush=True)
    except BaseException as e:
        setup_error = e
    import torch  # noqa: F401  (loaded before the baseline: the cap counts what the job adds)

    sandbox.torch_loaded()

    # The parent's watchdog counts resident memory from here, as the address-space cap below
    # counts from here: otherwise the watchdog fired first, at cap minus torch's own footprint.
    # The parent adds what the processes above this one hold (the guardian, and in namespaces the
    # processes that wait for this one), which a job in a PID namespace cannot see.
    mem = psutil.Process().memory_info()
    conn.send(Baseline(int(mem.rss)))
    # Everything loaded so far (torch's ~300k objects) lives as long as this one-job process: moved
    # out of the collector's reach, a full collection scans only the job's objects (0.2 s -> 0.04 s
    # here), so no long GC pause lands inside a timed step or a profile (docs/BENCHMARKS.md).
    gc.freeze()
    if mem_limit:
        _cap_address_space(mem.vms, mem_limit)
    if caps.get("disk_bytes"):
        _cap_file_size(int(caps["disk_bytes"]))
    try:
        if setup_error is not None:
            raise setup_error
        job = Job.from_dict(job_dict)
        result = execute(job, Path(artifact_dir), lambda f, m: conn.send(Progress(float(f), str(m))),
                         lambda p: conn.send(Partial(to_plain(p))))
        message = Ok(to_plain(result))  # plain builtins cross the boundary; the parent decodes them
    except BaseException as e:  # the user's code: anything can come out
        # Build the message here but send it after the except block: the traceback keeps the
        # failing frames (and whatever they allocated) alive until then.
        message = _failure(e, mem_limit, caps.get("disk_bytes"))
    try:
        conn.send(message)
    except ChannelError as e:  # a result holding an object, or too long
        conn.send(Failed("error", "JobError", f"the result could not be sent back: {e}", ""))
    finally:
        conn.close()
        sys.stdout.flush()
        sys.stderr.flush()
    # The answer is sent and the output flushed: skip the interpreter's teardown (with torch loaded
    # it takes a few tenths of a second, which the page would otherwise wait for in proc.join).
    os._exit(0)


@contextmanager
def main_script_hidden():
    """Start a spawned worker without re-running the caller's main script in it.

    spawn runs ``__main__.__file__`` in every child (so objects defined there unpickle). Under
    Streamlit, __main__ is the page script, so each job's worker ran the whole dashboard (app.py,
    the sidebar, a page) before its job; a notebook or a user's script would be re-run likewise.
    A job is a plain dict and needs nothing from __main__, so its file is hidden while the worker
    starts (milliseconds; the child has read it by the time start() returns).
    """
    main = sys.modules.get("__main__")
    path = None if main is None or getattr(main, "__spec__", None) is not None else main.__dict__.pop("__file__", None)
    try:
        yield
    finally:
        if path is not None:
            main.__dict__["__file__"] = path


def start_cold_worker(job_dict: dict, job_dir: str, mem_limit: int | None, tmp_dir: str, hidden: tuple, caps: dict,
                      log_path: Path):
    """(process, answer pipe, log drain) of a worker spawned for this one job (``job_main``'s arguments).

    Not a daemon, so a job may start processes of its own (DataLoader workers, torchrun); the worker
    still dies with the calling thread (PR_SET_PDEATHSIG) and the runner kills it with its children."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    log_read, log_write = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_worker_main, args=(job_dict, child, log_write, job_dir, mem_limit, os.getpid(),
                                                  tmp_dir, hidden, caps), daemon=False)
    drain = LogDrain(os.dup(log_read.fileno()), log_path)
    log_read.close()
    try:
        with main_script_hidden():
            proc.start()
    finally:
        child.close()
        log_write.close()  # the worker holds the only write end: EOF when it ends
        drain.start()
    return proc, parent, drain
