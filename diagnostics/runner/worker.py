"""The worker process: its entry (``_worker_main`` for a cold worker, ``_job_main`` for one job in
either kind), the caps applied inside it (address space, file size), how a failure is classified
(out of memory, the GPU's memory, the disk quota), and starting a spawned process without re-running
the caller's main script."""

from __future__ import annotations

import errno
import gc
import os
import signal
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


def _die_with_parent(parent_pid: int) -> None:
    """Linux: get SIGKILL when the thread that started us ends, so a killed dashboard leaves no worker."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the parent's finally still kills us
        return
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _is_oom(exc: BaseException) -> bool:
    """MemoryError, torch's OutOfMemoryError, or an allocator message, anywhere in the cause chain."""
    seen = 0
    while exc is not None and seen < 10:
        text = str(exc).lower()
        if (isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError"
                or "out of memory" in text or "can't allocate memory" in text or "cannot allocate memory" in text):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _is_file_too_big(exc: BaseException) -> bool:
    """A write past RLIMIT_FSIZE (EFBIG) anywhere in the cause chain: the job's disk quota."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, OSError) and exc.errno == errno.EFBIG:
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _is_gpu_oom(exc: BaseException) -> bool:
    """torch's OutOfMemoryError (the CUDA caching allocator's) anywhere in the cause chain."""
    seen = 0
    while exc is not None and seen < 10:
        if type(exc).__name__ == "OutOfMemoryError" or "cuda out of memory" in str(exc).lower():
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


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
    _job_main(job_dict, Sender(conn), artifact_dir, mem_limit, parent_pid, tmp_dir, hidden, caps=caps)


def _cap_file_size(limit: int) -> None:
    """No file the job writes may grow past ``limit`` (RLIMIT_FSIZE; Python ignores SIGXFSZ, so the
    write fails with EFBIG): the disk quota holds even for one file written faster than it is watched."""
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))


def _job_main(job_dict: dict, conn: Sender, artifact_dir: str, mem_limit: int | None, parent_pid: int,
              tmp_dir: str | None = None, hidden: tuple = (), close: tuple = (), caps: dict | None = None) -> None:
    """Run one job in this process and exit: guardian, sandbox, memory cap, the job, its answer.

    ``conn``: the job's end of its channel to the runner, a bare descriptor that sends typed messages
    as bytes (runner.channel): the model's code runs in this process and can reach it (a frame walk, the
    descriptor's number), but all it can send is data the runner decodes against the schema.

    A cold worker calls it before torch is imported; a spare (``_spare_main``) after, with torch's
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
        # Our own errors say what happened: one is an OOM only when it wraps one (a model's forward
        # running out), not when its text mentions memory (a distributed rank's report, say).
        mine = isinstance(e, TorchScopeError)
        if _is_file_too_big(e) and caps.get("disk_bytes"):
            text = (f"the job wrote a file past its disk quota of {caps['disk_bytes'] / 2**20:,.0f} MiB "
                    f"(set {jobfiles.DISK_ENV}): {type(e).__name__}: {e}")
            message = Failed("error", "JobError", text, traceback.format_exc(limit=8))
        elif _is_oom(e.__cause__ or e.__context__ if mine else e):
            if _is_gpu_oom(e):  # the device's memory, not this worker's cap
                text = f"the GPU ran out of memory: {e}"
            else:
                cap = f" (the worker's cap is {mem_limit / 2**30:.1f} GiB; set {MEMORY_LIMIT_ENV})" if mem_limit else ""
                text = f"ran out of memory{cap}: {e}"
            message = Failed("oom", type(e).__name__, text, traceback.format_exc(limit=8))
        elif mine:
            message = Failed("error", type(e).__name__, str(e), "")
        else:
            message = Failed("error", type(e).__name__, f"{type(e).__name__}: {e}", traceback.format_exc(limit=8))
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
def _main_script_hidden():
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
