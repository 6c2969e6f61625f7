"""Execute a job (spec + analysis + options) in a worker process and return plain data.

The worker is a fresh ``spawn`` process: a crash, hang, abort or runaway allocation in user code
ends the worker, never the dashboard. The parent enforces the timeout, a memory cap (RLIMIT_AS on
CPU jobs, an RSS watchdog on all; both count from the worker's footprint once torch is loaded),
cancellation, and a per-device queue for jobs that time the device, so two sessions do not distort
each other's figures. The worker's stdout/stderr are drained
by a thread into a log file in the run's artifact folder (its first LOG_HEAD_BYTES and last
LOG_TAIL_BYTES), so a model that prints megabytes neither blocks nor fills the disk; the log's
last lines shown with a failure come from that pipe, never from a file. The job writes a staging
folder of its own (``jobfiles.JOB_FOLDER``) under a disk quota and a file-count limit; once it is
gone, its regular files are moved into the run's folder (``jobfiles.collect``). The worker
dies with the thread that started it (PR_SET_PDEATHSIG on Linux). A job is stopped by setting its
``cancel`` event (the CLI's Ctrl-C, the dashboard's Cancel: ui.background), or by an exception in
the calling thread; either way its worker is killed and the run is stored as 'cancelled'.
"""

from __future__ import annotations

import errno
import fcntl
import gc
import multiprocessing as mp
import os
import select
import signal
import sys
import tempfile
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import psutil

import diagnostics.jobfiles as jobfiles
import diagnostics.procs as procs
import diagnostics.sandbox as sandbox
from diagnostics.errors import JobError, SpecError, TorchScopeError
from diagnostics.registry import get_analysis
from diagnostics.settings import env_number
from diagnostics.spec import ModelSpec, cache_key
from diagnostics.store import StoreError

MEMORY_LIMIT_ENV = "TORCHSCOPE_WORKER_MEMORY_MB"
#: Overrides every analysis' default timeout (a caller's explicit timeout_s still wins).
TIMEOUT_ENV = "TORCHSCOPE_JOB_TIMEOUT_S"
#: Default worker memory cap: this share of physical memory.
DEFAULT_MEMORY_SHARE = 0.6
LOG_TAIL_CHARS = 2000
#: worker.log keeps the first and the last bytes of the worker's output; the middle is dropped.
LOG_HEAD_BYTES = 1 << 20
LOG_TAIL_BYTES = 256 << 10
#: Stored as the error of a run whose calling thread was interrupted mid-job (an exception from a
#: callback, KeyboardInterrupt in a notebook).
INTERRUPTED_MESSAGE = "cancelled: the process running the job was interrupted before it finished"
#: Stored as the error of a run stopped through its ``cancel`` event, unless the event carries a
#: ``reason`` of its own (the dashboard's shutdown does).
CANCELLED_MESSAGE = "cancelled: stopped by the user before it finished"

ProgressFn = Callable[[float, str], None]
#: Gets a running job's partial result (plain data, the analysis' own shape): rows known so far.
PartialFn = Callable[[dict], None]


@dataclass(frozen=True)
class Job:
    analysis: str
    spec: ModelSpec | None
    options: dict = field(default_factory=dict)

    def validated(self) -> "Job":
        """This job with its options checked against the analysis' declaration and every default
        filled in (raises OptionError / TorchScopeError naming the problem)."""
        return Job(self.analysis, self.spec, get_analysis(self.analysis).validate(self.options))

    def key(self) -> str:
        """Same key, same computation: options are keyed with their defaults filled in, so a run that
        spells out a default and one that leaves it out share their result."""
        try:
            options = self.validated().options
        except TorchScopeError:
            options = self.options
        return cache_key(self.spec or ModelSpec(), self.analysis, options)

    def label(self) -> str | None:
        """What History shows in its model column: the model, or the trace file(s) a spec-less job reads."""
        if self.spec is not None:
            return self.spec.label
        o = dict(self.options)  # any analysis' options: read what is there

        def name(p) -> str:  # the file and its folder: a profiling run's id, or a trace's directory
            p = Path(str(p).rstrip("/"))
            return f"{p.parent.name[:24]}/{p.name}" if p.parent.name else p.name

        if o.get("path"):
            return name(o["path"])
        if o.get("before") and o.get("after"):
            return f"{name(o['before'])} vs {name(o['after'])}"
        if o.get("trace_dir"):
            return f"{name(o['trace_dir'])}/ (per-rank traces)"
        return None

    def to_dict(self) -> dict:
        return {"analysis": self.analysis, "spec": None if self.spec is None else self.spec.to_dict(),
                "options": self.options}

    @classmethod
    def from_dict(cls, d: dict) -> "Job":
        return cls(d["analysis"], None if d["spec"] is None else ModelSpec.from_dict(d["spec"]), d["options"])


@dataclass
class JobOutcome:
    status: str  # ok | error | timeout | crashed | oom | cancelled; "running": ui.jobs' job not finished yet
    result: dict | None = None
    error: str | None = None
    error_type: str | None = None
    run_id: str | None = None
    duration_s: float = 0.0
    log_tail: str = ""
    artifact_dir: str | None = None
    from_cache: bool = False

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def unwrap(self) -> dict:
        if not self.ok:
            raise JobError(self.error or self.status)
        return self.result


#: Analyses that run on a model built on the meta device (counts on fake tensors, no measurement).
META_ANALYSES = ("summary", "memory", "validate", "plan")


class AnalysisContext:
    """What an analysis sees: the loaded model (lazily), options, progress, partial results and an
    artifact folder."""

    def __init__(self, job: Job, artifact_dir: Path, progress: ProgressFn | None = None,
                 partial: PartialFn | None = None):
        self.job = job
        self.spec = job.spec
        self.options = job.options
        self.artifact_dir = Path(artifact_dir)
        self._progress = progress
        self._partial = partial
        self._loaded = None

    @property
    def loaded(self):
        if self._loaded is None:
            from diagnostics.intake import load_model

            self.progress(0.0, "loading model")
            loaded = load_model(self.spec)
            if loaded.meta and self.job.analysis not in META_ANALYSES:
                raise SpecError(f"{self.spec.label} was {loaded.meta}: nothing was allocated, so only the "
                                      f"counting analyses run on it ({', '.join(META_ANALYSES)}); for "
                                      f"{self.job.analysis}, use a smaller config")
            self._loaded = loaded
        return self._loaded

    def progress(self, fraction: float, message: str = "") -> None:
        if self._progress is not None:
            self._progress(max(0.0, min(1.0, float(fraction))), message)

    def partial(self, result: dict) -> None:
        """Report what is known so far (plain data; the page and the CLI draw it while the job runs)."""
        if self._partial is not None:
            self._partial(result)


def execute(job: Job, artifact_dir: Path, progress: ProgressFn | None = None,
            partial: PartialFn | None = None) -> dict:
    """Run the analysis in this process (the worker calls this; tests and notebooks may too)."""
    analysis = get_analysis(job.analysis)
    job = job.validated()
    Path(artifact_dir).mkdir(parents=True, exist_ok=True)
    ctx = AnalysisContext(job, artifact_dir, progress, partial)
    if not analysis.exclusive:
        return analysis.load()(ctx, dict(job.options))
    # A timed analysis: was the machine busy meanwhile? (measure.disturbance; the figures and the
    # verdict go into the result, and a page, the report and the CLI say so.)
    from diagnostics.measure.disturbance import assess, watch

    with watch() as w:
        result = analysis.load()(ctx, dict(job.options))
    if isinstance(result, dict):
        result["disturbance"] = assess(w.figures, result.get("timing_cv"))
    return result


# ----------------------------------------------------------------------------- the worker
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
    _job_main(job_dict, conn, artifact_dir, mem_limit, parent_pid, tmp_dir, hidden, caps=caps)


def _cap_file_size(limit: int) -> None:
    """No file the job writes may grow past ``limit`` (RLIMIT_FSIZE; Python ignores SIGXFSZ, so the
    write fails with EFBIG): the disk quota holds even for one file written faster than it is watched."""
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))


def _job_main(job_dict: dict, conn, artifact_dir: str, mem_limit: int | None, parent_pid: int,
              tmp_dir: str | None = None, hidden: tuple = (), close: tuple = (), caps: dict | None = None) -> None:
    """Run one job in this process and exit: guardian, sandbox, memory cap, the job, its answer.

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
    conn.send(("baseline", mem.rss))
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
        result = execute(job, Path(artifact_dir), lambda f, m: conn.send(("progress", f, m)),
                         lambda p: conn.send(("partial", p)))
        message = ("ok", result)
    except BaseException as e:  # the user's code: anything can come out
        # Build the message here but send it after the except block: the traceback keeps the
        # failing frames (and whatever they allocated) alive until then.
        # Our own errors say what happened: one is an OOM only when it wraps one (a model's forward
        # running out), not when its text mentions memory (a distributed rank's report, say).
        mine = isinstance(e, TorchScopeError)
        if _is_file_too_big(e) and caps.get("disk_bytes"):
            text = (f"the job wrote a file past its disk quota of {caps['disk_bytes'] / 2**20:,.0f} MiB "
                    f"(set {jobfiles.DISK_ENV}): {type(e).__name__}: {e}")
            message = ("error", "JobError", text, traceback.format_exc(limit=8))
        elif _is_oom(e.__cause__ or e.__context__ if mine else e):
            if _is_gpu_oom(e):  # the device's memory, not this worker's cap
                text = f"the GPU ran out of memory: {e}"
            else:
                cap = f" (the worker's cap is {mem_limit / 2**30:.1f} GiB; set {MEMORY_LIMIT_ENV})" if mem_limit else ""
                text = f"ran out of memory{cap}: {e}"
            message = ("oom", type(e).__name__, text, traceback.format_exc(limit=8))
        elif mine:
            message = ("error", type(e).__name__, str(e), "")
        else:
            message = ("error", type(e).__name__, f"{type(e).__name__}: {e}", traceback.format_exc(limit=8))
    try:
        conn.send(message)
    except Exception as e:  # e.g. a result that cannot be pickled
        conn.send(("error", type(e).__name__, f"the result could not be sent back: {type(e).__name__}: {e}", ""))
    finally:
        conn.close()
        sys.stdout.flush()
        sys.stderr.flush()
    # The answer is sent and the output flushed: skip the interpreter's teardown (with torch loaded
    # it takes a few tenths of a second, which the page would otherwise wait for in proc.join).
    os._exit(0)


# ----------------------------------------------------------------------------- warm spares
#: How many spare workers the dashboard keeps waiting: started, torch and the engine imported, no
#: job and no sandbox yet. A job takes one (and a new one is started behind it), so a click does not
#: pay Python's and torch's start-up. Each spare still runs exactly one job, confined as a cold
#: worker is, and exits after it.
SPARE_WORKERS = 1
#: At most this many spares, whatever the setting asks.
MAX_SPARE_WORKERS = 4
#: ``TORCHSCOPE_SPARE_WORKERS``: how many spares the dashboard keeps (0 turns them off).
SPARES_ENV = "TORCHSCOPE_SPARE_WORKERS"
#: What a spare imports while it waits: torch, the loader, the samples, and the jobs of the Model
#: page and of the upload check. Not torch._dynamo (1-2 s, +68 MiB per spare): torch's FlopCounterMode
#: imported it at its first count, our counter's mode (measure.flops) does not, so the first session of
#: a just-started server no longer waits for it. Nothing that keeps a cache folder read from the
#: environment at import (dynamo's import reads tempfile.gettempdir(), which sandbox.prepare_temp resets).
SPARE_PRELOAD = ("torch", "diagnostics.intake", "sample_models.convnets", "sample_models.mlps", "sample_models.sequence",
                 "diagnostics.analyses.summary.job", "diagnostics.analyses.validate.job",
                 # imported lazily by torch when a dispatch mode (the FLOP counter) is entered
                 "torch._subclasses.schema_check_mode")
#: The next spare starts this long after the last job of the process ended (and none runs): the
#: page that shows the job's result is drawn meanwhile, without a spare's imports beside it.
REFILL_DELAY_S = 3.0
#: A spare's process name (``ps``, psutil's ``name()``) while it waits; a job renames it.
SPARE_NAME, WORKER_NAME = "tscope-spare", "tscope-worker"
#: The first line a spare writes into the worker.log of the job it takes.
WARM_LOG_LINE = "worker: a warm spare"


def _set_name(name: str) -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def _spare_main(job_conn, conn, log_conn, parent_pid: int, preload: tuple) -> None:
    """A spare: import ``preload`` (torch...), then wait for one job and run it as a cold worker does.

    No sandbox, no memory cap and no guardian yet: all three come with the job (``_job_main``). It
    dies with the pool's thread (the dashboard's process), and exits when the pool closes its pipe."""
    sandbox.scrub_environment()  # first: nothing of the dashboard's environment reaches the job
    os.dup2(log_conn.fileno(), 1)
    os.dup2(log_conn.fileno(), 2)
    log_conn.close()
    procs.die_with_parent(parent_pid)
    _set_name(SPARE_NAME)
    t0 = time.monotonic()
    import importlib

    failed = []
    for name in preload:
        try:
            importlib.import_module(name)
        except Exception as e:  # the job imports what it needs again, and reports the error then
            failed.append(f"{name} ({type(e).__name__}: {e})")
    ready = time.monotonic()
    gc.collect()
    gc.freeze()  # what the job process shares with this one stays shared (no refcount writes by the GC)
    try:
        threads = sys.modules["torch"].get_num_threads() if "torch" in sys.modules else None
        conn.send(("ready", ready - t0, threads))
        args = job_conn.recv()
    except (EOFError, OSError):  # the pool closed: no job will come
        os._exit(0)
    job_conn.close()
    _set_name(WORKER_NAME)
    print(f"{WARM_LOG_LINE}: torch and the engine were imported {time.monotonic() - ready:.1f} s before "
          f"this job (imports took {ready - t0:.2f} s)" + (f"; not preloaded: {', '.join(failed)}" if failed else ""),
          flush=True)
    job_dict, artifact_dir, mem_limit, tmp_dir, hidden, caps = args
    _job_main(job_dict, conn, artifact_dir, mem_limit, parent_pid, tmp_dir, hidden, caps=caps)


def spawn_environment() -> tuple:
    """What a spawned worker inherits at its start: a spare serves a job only if it is unchanged.
    sys.path as the folders searched, in order: Streamlit inserts the app's folder again where
    ``python -m ui.launch``, which starts the first spare before Streamlit, had it already."""
    path = tuple(dict.fromkeys(os.path.abspath(p) for p in sys.path))
    return tuple(sorted(os.environ.items())), os.getcwd(), path, sys.executable


class _Spare:
    """A started spare: its process and the parent's ends of its three pipes."""

    def __init__(self, preload: tuple):
        ctx = mp.get_context("spawn")
        job_read, self.jobs = ctx.Pipe(duplex=False)
        self.answers, answer_write = ctx.Pipe(duplex=False)
        self.log, log_write = ctx.Pipe(duplex=False)
        self.environment = spawn_environment()
        self.started = time.monotonic()
        self.ready_s: float | None = None  # its imports' duration, once it said it is ready
        self.proc = ctx.Process(target=_spare_main, args=(job_read, answer_write, log_write, os.getpid(), preload),
                                daemon=False, name="torchscope-spare")
        try:
            with _main_script_hidden():
                self.proc.start()
        finally:
            job_read.close()
            answer_write.close()
            log_write.close()

    def close(self) -> None:
        """Kill it (it has no job: nothing below it) and close the pipes."""
        for c in (self.jobs, self.answers, self.log):
            try:
                c.close()
            except OSError:
                pass
        _kill(self.proc)


class SparePool:
    """Spare workers started ahead of their jobs by one long-lived thread of this process.

    The thread that starts a worker is its parent for PR_SET_PDEATHSIG, so spares come from a thread
    that lives as long as the process (the dashboard's session threads end when their line is empty).
    ``keep(n)`` asks for n spares; ``take()`` hands one out (or None); ``close()`` kills the waiting
    spares (a taken one runs its job to the end). The next spare is started only while no job of
    this process runs (``busy``), REFILL_DELAY_S after the last one ended: its imports would take a
    core from the job (and disturb a timed one's figures), or from drawing the job's result."""

    def __init__(self, preload: tuple = SPARE_PRELOAD):
        self.preload = preload
        self._cond = threading.Condition()
        self._spares: list[_Spare] = []
        self._size = 0
        self._thread: threading.Thread | None = None
        self._starting = False
        self._busy = 0  # jobs of this process running now (warm or cold)
        self._last_end = float("-inf")  # when the last of them ended (monotonic)
        self.taken = 0
        self._torch_threads: int | None = None  # torch's intra-op threads, as a spare reported them

    @property
    def size(self) -> int:
        return self._size

    def keep(self, n: int) -> None:
        with self._cond:
            self._size = max(0, min(int(n), MAX_SPARE_WORKERS))
            if self._size and self._thread is None:
                self._thread = threading.Thread(target=self._serve, daemon=True, name="torchscope-spares")
                self._thread.start()
            self._cond.notify_all()

    def take(self) -> _Spare | None:
        """A waiting spare started in this environment (it may still be importing), or None."""
        stale = []
        try:
            with self._cond:
                env = spawn_environment()
                while self._spares:
                    spare = self._spares.pop(0)
                    if spare.environment == env and spare.proc.is_alive():
                        self.taken += 1
                        return spare
                    stale.append(spare)  # the settings changed since it started, or it died
                return None
        finally:
            with self._cond:
                self._cond.notify_all()
            for spare in stale:
                spare.close()

    @contextmanager
    def busy(self):
        """Held by run_job while a job runs: no spare is started meanwhile."""
        with self._cond:
            self._busy += 1
        try:
            yield
        finally:
            with self._cond:
                self._busy -= 1
                self._last_end = time.monotonic()
                self._cond.notify_all()

    def pids(self) -> list[int]:
        """The waiting spares' process ids."""
        with self._cond:
            return [s.proc.pid for s in self._spares if s.proc.pid is not None]

    def wait_ready(self, timeout_s: float) -> bool:
        """Until ``size`` spares are waiting with their imports done (tests, benchmarks); False on timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._cond:
                spares = list(self._spares)
                if len(spares) >= self._size and not self._starting and \
                        all(s.ready_s is not None or self._poll_ready(s) for s in spares):
                    return True
            time.sleep(0.05)
        return False

    def _poll_ready(self, spare: _Spare) -> bool:
        try:
            if spare.answers.poll(0):
                msg = spare.answers.recv()
                spare.ready_s = msg[1]
                if msg[2] is not None:
                    self._torch_threads = msg[2]
                return True
        except (EOFError, OSError):
            pass
        return False

    def torch_threads(self) -> int | None:
        """torch's intra-op thread count in a worker, as the last spare that finished its imports said
        (None before any did): the dashboard's device panel shows it without importing torch."""
        with self._cond:
            for s in self._spares:
                if s.ready_s is None:
                    self._poll_ready(s)
            return self._torch_threads

    def close(self) -> None:
        """Stop keeping spares and kill the waiting ones (the thread stays, idle, for a later ``keep``)."""
        with self._cond:
            self._size = 0
            spares, self._spares = self._spares, []
            self._cond.notify_all()
        for spare in spares:
            spare.close()
        deadline = time.monotonic() + 10
        while self._starting and time.monotonic() < deadline:  # one being started now is killed by its starter
            time.sleep(0.02)

    def _serve(self) -> None:
        while True:
            with self._cond:
                while True:
                    calm = time.monotonic() - self._last_end
                    if len(self._spares) >= self._size or self._busy:
                        self._cond.wait()
                    elif calm < REFILL_DELAY_S:
                        self._cond.wait(REFILL_DELAY_S - calm)
                    else:
                        break
                self._starting = True
            spare = None
            try:
                spare = _Spare(self.preload)
            except Exception as e:  # cannot start processes now: jobs start cold meanwhile
                print(f"torchscope: a spare worker could not be started: {type(e).__name__}: {e}", file=sys.stderr)
                time.sleep(5)
            with self._cond:
                self._starting = False
                if spare is not None and len(self._spares) < self._size:
                    self._spares.append(spare)
                    spare = None
            if spare is not None:  # closed meanwhile
                spare.close()


_POOL = SparePool()
_POOL_ATEXIT = False


def spare_setting() -> int:
    """TORCHSCOPE_SPARE_WORKERS as a count (default SPARE_WORKERS, at most MAX_SPARE_WORKERS; 0 turns spares off)."""
    raw = os.environ.get(SPARES_ENV, "").strip()
    if not raw:
        return SPARE_WORKERS
    try:
        n = int(raw)
    except ValueError:
        n = -1
    if n < 0:
        raise TorchScopeError(f"the environment variable {SPARES_ENV}={raw!r} must be a whole number of spare "
                              f"workers from 0 (off) to {MAX_SPARE_WORKERS}")
    return min(n, MAX_SPARE_WORKERS)


def keep_spares(n: int | None = None) -> int:
    """Keep ``n`` spare workers (default: the TORCHSCOPE_SPARE_WORKERS setting) for the jobs this
    process runs from now on; they are killed at exit. The dashboard calls this; the CLI, which runs
    one job per process, does not. Returns the count kept."""
    global _POOL_ATEXIT
    n = spare_setting() if n is None else max(0, min(int(n), MAX_SPARE_WORKERS))
    _POOL.keep(n)
    if n and not _POOL_ATEXIT:
        import atexit
        import multiprocessing.util  # noqa: F401  its exit handler joins every child: registered first, it runs last

        atexit.register(_POOL.close)
        _POOL_ATEXIT = True
    return n


def spares() -> SparePool:
    """This process' pool of spare workers (empty unless ``keep_spares`` was called)."""
    return _POOL


def _open_log(path: Path) -> int:
    """worker.log, created for writing where only the runner writes (the run's folder, beside the
    job's): never through a link (O_NOFOLLOW), never waiting on a FIFO (O_NONBLOCK); whatever else
    has the name is replaced by a fresh file."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
        if stat_is_regular(fd):
            return fd
        os.close(fd)
    except OSError:
        pass
    try:
        os.unlink(path)
    except OSError:
        pass
    return os.open(path, flags | os.O_EXCL, 0o644)


def stat_is_regular(fd: int) -> bool:
    import stat

    return stat.S_ISREG(os.fstat(fd).st_mode)


class _LogDrain(threading.Thread):
    """Copy the worker's output into ``path``: the first ``head`` bytes, then only the last ``tail``.
    The last LOG_TAIL_CHARS-odd bytes are also kept in memory (``recent``): a failure's log tail."""

    def __init__(self, fd: int, path: Path, head: int = LOG_HEAD_BYTES, tail: int = LOG_TAIL_BYTES):
        super().__init__(daemon=True, name="torchscope-log-drain")
        self.fd, self.path, self.head, self.tail = fd, path, head, tail
        self.out = _open_log(path)  # opened now, before the job can run
        self.dropped = 0
        self._recent = bytearray()
        self._stop_at = threading.Event()

    def recent(self, n: int = LOG_TAIL_CHARS) -> str:
        """The last ``n`` characters of the output (from the pipe, not from any file)."""
        return bytes(self._recent).decode("utf-8", "replace")[-n:]

    def run(self) -> None:
        written, ring = 0, bytearray()
        with open(self.out, "wb", closefd=True) as out:
            while True:
                if self._stop_at.is_set():
                    # Stop was asked: take what is already in the pipe, without waiting for EOF
                    # (a grandchild of the worker may hold the pipe open).
                    ready = select.select([self.fd], [], [], 0)[0]
                else:
                    ready = select.select([self.fd], [], [], 0.2)[0]
                if not ready:
                    if self._stop_at.is_set():
                        break
                    continue
                try:
                    chunk = os.read(self.fd, 1 << 16)
                except OSError:
                    break
                if not chunk:
                    break
                self._recent += chunk
                if len(self._recent) > 8 * LOG_TAIL_CHARS:
                    del self._recent[: len(self._recent) - 4 * LOG_TAIL_CHARS]
                if written < self.head:
                    part = chunk[: self.head - written]
                    out.write(part)
                    out.flush()  # the head is readable while the job runs (to follow it, or find a pid)
                    written += len(part)
                    chunk = chunk[len(part):]
                if chunk:
                    ring += chunk
                    if len(ring) > 2 * self.tail:
                        self.dropped += len(ring) - self.tail
                        del ring[: len(ring) - self.tail]
            if len(ring) > self.tail:
                self.dropped += len(ring) - self.tail
                del ring[: len(ring) - self.tail]
            if self.dropped:
                out.write(f"\n[... {self.dropped:,} bytes of output dropped: worker.log keeps the first "
                          f"{self.head:,} and the last {self.tail:,} bytes ...]\n".encode())
            out.write(ring)
        os.close(self.fd)

    def finish(self, wait_s: float = 2.0) -> None:
        """Wait for EOF (the worker has ended); after ``wait_s`` take what is buffered and stop."""
        self.join(wait_s)
        if self.is_alive():
            self._stop_at.set()
            self.join(5)


def _memory_cap_bytes() -> int:
    mb = env_number(MEMORY_LIMIT_ENV, None)
    if mb is not None:
        return int(mb * 2**20)
    return int(psutil.virtual_memory().total * DEFAULT_MEMORY_SHARE)


#: What a fatal signal means to a user, by name.
_SIGNAL_MEANING = {
    "SIGSEGV": "a segmentation fault in native code",
    "SIGBUS": "a bus error in native code",
    "SIGABRT": "the process aborted (os.abort() or a failed native assertion)",
    "SIGFPE": "a floating-point exception in native code",
    "SIGILL": "an illegal instruction in native code",
    "SIGKILL": "killed from outside, probably by the system's out-of-memory killer",
}


def _signal_name(code: int | None) -> str:
    if code is None or code >= 0:
        return f"exit code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"
    meaning = _SIGNAL_MEANING.get(name)
    return f"{name}: {meaning}" if meaning else name


def _cancel_reason(cancel: threading.Event) -> str:
    """What to store for a run stopped through ``cancel``: its own ``reason`` if it has one."""
    return getattr(cancel, "reason", None) or CANCELLED_MESSAGE


@contextmanager
def device_queue(lock_dir: Path, device: str, on_wait: Callable[[], None] | None = None,
                 cancel: threading.Event | None = None, on_tick: Callable[[float], None] | None = None):
    """Hold an exclusive per-device lock (a file lock: works across sessions and processes)."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    path = lock_dir / f"{device.replace(':', '_')}.lock"
    with open(path, "w") as f:
        waited = False
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if cancel is not None and cancel.is_set():
                    raise JobError(_cancel_reason(cancel) + " (it was waiting for the device)") from None
                if not waited and on_wait is not None:
                    on_wait()
                waited = True
                if on_tick is not None:
                    on_tick(0.0)
                time.sleep(0.2)
        try:
            yield waited
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def run_job(job: Job, *, timeout_s: float | None = None, on_progress: ProgressFn | None = None,
            store=None, source: str = "app", cancel: threading.Event | None = None,
            memory_limit_mb: float | None = None, artifact_dir: Path | None = None,
            on_tick: Callable[[float], None] | None = None, on_partial: PartialFn | None = None) -> JobOutcome:
    """Run ``job`` in a spawned worker; record it in ``store`` (if given) from start to finish.

    ``on_progress(fraction, message)`` gets the analysis' progress (and "queued: ..." while an
    exclusive job waits for its device); ``on_partial(result)`` its partial results (ctx.partial); ``on_tick(elapsed_s)`` is called a few times a second while
    waiting, so a UI can show elapsed time. Setting ``cancel`` stops the job: the worker is killed
    and the run is stored as 'cancelled' (error: the event's ``reason`` attribute, if it has one, or
    CANCELLED_MESSAGE). Any exception raised by a callback or by the caller's thread (Ctrl-C) does
    the same and is re-raised. Every other failure comes back as a JobOutcome with a readable ``error``.
    """
    try:  # options and settings, checked before anything is stored (a bad value names itself)
        analysis = get_analysis(job.analysis)
        job = job.validated()
        timeout_s = float(timeout_s if timeout_s is not None else env_number(TIMEOUT_ENV, analysis.timeout_s))
        memory_limit_mb = memory_limit_mb or _memory_cap_bytes() / 2**20
        limits = jobfiles.Limits.from_env()
    except TorchScopeError as e:
        return JobOutcome("error", error=str(e), error_type=type(e).__name__)
    device = job.spec.device if job.spec is not None else "cpu"
    run_id = None
    if store is not None:
        try:
            run_id = store.create_run(job.analysis, spec=None if job.spec is None else job.spec.to_dict(),
                                      options=job.options, cache_key=job.key(),
                                      model_label=job.label(),
                                      device=device, source=source)
        except StoreError as e:  # read-only or full: said once, nothing run
            return JobOutcome("error", error=str(e), error_type="StoreError")
        artifact_dir = store.artifact_dir(run_id)
    elif artifact_dir is None:
        artifact_dir = Path(tempfile.mkdtemp(prefix="torchscope-job-"))
    artifact_dir = Path(artifact_dir)
    artifact_dir.mkdir(parents=True, exist_ok=True)
    progress = on_progress or (lambda f, m: None)

    def finish(outcome: JobOutcome) -> JobOutcome:
        outcome.run_id, outcome.artifact_dir = run_id, str(artifact_dir)
        if store is not None:
            try:
                store.finish_run(run_id, outcome.status, result=outcome.result, error=outcome.error,
                                 artifacts=jobfiles.listing(artifact_dir))
            except StoreError as e:  # the job ran; its run could not be stored (its row stays 'running')
                outcome.error = f"{e} (the job itself ended '{outcome.status}'; its run is not stored)"
                outcome.status, outcome.error_type = "error", "StoreError"
        return outcome

    lock_dir = (store.data_dir if store is not None else Path(artifact_dir).parent) / "locks"
    try:
        if analysis.exclusive:
            queue = device_queue(lock_dir, device, lambda: progress(0.0, f"queued: another job is timing {device}; "
                                                                           "waiting for it to finish"),
                                 cancel, on_tick)
        else:
            queue = _null()
        with queue, _POOL.busy():
            outcome = _run_worker(job, artifact_dir, timeout_s, progress, cancel, memory_limit_mb,
                                  store, run_id, on_tick, limits, on_partial)
    except JobError as e:
        outcome = JobOutcome("cancelled", error=str(e), error_type="JobError")
    except BaseException:
        # Interrupted in this thread (StopException/RerunException from a callback, KeyboardInterrupt,
        # GeneratorExit): _run_worker's finally has killed the worker. Record why, then let it go on.
        if store is not None:
            try:
                store.finish_run(run_id, "cancelled", error=INTERRUPTED_MESSAGE,
                                 artifacts=jobfiles.listing(artifact_dir))
            except Exception:  # never hide the original interruption
                pass
        raise
    return finish(outcome)


@contextmanager
def _null():
    yield False


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


#: How often the runner counts what a running job has put on disk (seconds).
DISK_CHECK_S = 1.0


def _run_worker(job, artifact_dir, timeout_s, progress, cancel, memory_limit_mb, store, run_id,
                on_tick, limits: jobfiles.Limits, on_partial=None) -> JobOutcome:
    log_path = artifact_dir / "worker.log"
    cap = int(memory_limit_mb * 2**20)
    as_limit = cap if (job.spec is None or job.spec.device == "cpu") else None  # CUDA needs a huge VA space
    # The job writes only its staging folder (worker.log, the runner's, sits beside it, out of reach)
    # and a private temp folder (TMPDIR, compiler caches); both are counted against the disk quota
    # while it runs, and once it is gone its regular files are moved into the run's folder and both
    # folders are removed.
    job_dir = artifact_dir / jobfiles.JOB_FOLDER
    jobfiles.remove_tree(job_dir)
    job_dir.mkdir(parents=True)
    tmp_dir = tempfile.mkdtemp(prefix="torchscope-job-tmp-")
    hidden = (str(store.data_dir),) if store is not None else ()  # the run store: out of the job's reach
    caps = {"disk_bytes": limits.disk_bytes, "shm_bytes": cap}
    t0 = time.monotonic()
    shm = _ShmCounter()
    proc, parent, drain = _warm_worker((job.to_dict(), str(job_dir), as_limit, tmp_dir, hidden, caps), log_path)
    if proc is None:  # no spare: a cold worker, started for this job
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe(duplex=False)
        log_read, log_write = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_worker_main, args=(job.to_dict(), child, log_write, str(job_dir), as_limit,
                                                      os.getpid(), tmp_dir, hidden, caps), daemon=False)
        # Not a daemon, so a job may start processes of its own (DataLoader workers, torchrun); the
        # worker still dies with this process (PR_SET_PDEATHSIG) and is killed with its children below.
        drain = _LogDrain(os.dup(log_read.fileno()), log_path)
        log_read.close()
        try:
            with _main_script_hidden():
                proc.start()
        finally:
            child.close()
            log_write.close()  # the worker holds the only write end: EOF when it ends
            drain.start()
    if store is not None:
        try:
            store.set_pid(run_id, proc.pid)
        except StoreError:  # the worker's pid is a note; a store that cannot take it fails at the end
            pass
    progress(0.0, "starting worker")
    last_mem_check = last_tick = last_disk_check = 0.0
    baseline_rss = None  # the worker's footprint once torch is loaded; it reports it before any user code
    collected: list[jobfiles.Collected] = []

    def gather() -> jobfiles.Collected:
        """The job is gone: move what it left into the run's folder, once."""
        if not collected:
            collected.append(jobfiles.collect(job_dir, artifact_dir, limits, links_from=_links_from(job)))
            jobfiles.remove_tree(job_dir)
            jobfiles.remove_tree(tmp_dir)
        return collected[0]

    def done(outcome: JobOutcome, extra_log: str = "") -> JobOutcome:
        _kill(proc)
        drain.finish()
        kept = gather()
        if outcome.result is not None:  # the paths it names: where the files are now
            outcome.result = jobfiles.relocate(outcome.result, str(job_dir), str(artifact_dir))
        if kept.over_limit and outcome.status == "ok":
            outcome.status, outcome.result, outcome.error_type = "error", None, "JobError"
            outcome.error = kept.over_limit + "; the files past the limit were not kept"
        note = kept.note()
        if note:
            _append_log(log_path, note)
        outcome.duration_s = time.monotonic() - t0
        outcome.log_tail = (extra_log + "\n" + drain.recent() + ("\n" + note if note else "")).strip()
        return outcome

    def stop(status: str, error: str) -> JobOutcome:
        return done(JobOutcome(status, error=error, error_type="JobError"))

    eof = False  # the worker's end of the pipe is closed: it died (or is dying) without an answer
    try:
        while True:
            # poll() is also true at EOF; recv() then raises EOFError
            if not eof and parent.poll(0.1):
                try:
                    msg = parent.recv()
                except EOFError:
                    eof, msg = True, None
                except Exception as e:  # a result the parent cannot unpickle
                    msg = ("error", type(e).__name__, f"the worker's result could not be read: {e}", "")
                if msg is not None and msg[0] == "progress":
                    progress(msg[1], msg[2])
                    continue
                if msg is not None and msg[0] == "partial":
                    if on_partial is not None:
                        on_partial(msg[1])
                    continue
                if msg is not None and msg[0] == "baseline":
                    baseline_rss = _baseline(proc.pid, msg[1])
                    continue
                if msg is not None and msg[0] == "ready":  # a spare's imports were done
                    if msg[2] is not None:
                        _POOL._torch_threads = msg[2]
                    continue
                if msg is not None:
                    proc.join(5)
                    if msg[0] == "ok":
                        return done(JobOutcome("ok", result=msg[1]))
                    return done(JobOutcome(msg[0], error=msg[2], error_type=msg[1]), extra_log=msg[3])
            elapsed = time.monotonic() - t0
            if on_tick is not None and elapsed - last_tick > 0.25:
                last_tick = elapsed
                on_tick(elapsed)
            if not eof and not proc.is_alive() and parent.poll(0):
                continue  # it exited: read what it left in the pipe (an answer, or EOF) first
            if eof or not proc.is_alive():
                proc.join(5)
                if proc.is_alive():  # it closed its pipe but lives on: nothing more will come from it
                    _kill(proc)
                return done(JobOutcome("crashed", error=f"the worker process died ({_signal_name(proc.exitcode)}) "
                                                         f"while running {job.analysis}; the dashboard is unaffected",
                                       error_type="JobError"))
            if elapsed > timeout_s:
                return stop("timeout", f"timed out after {timeout_s:g} s: the worker was stopped")
            if cancel is not None and cancel.is_set():
                return stop("cancelled", _cancel_reason(cancel))
            if baseline_rss is not None and elapsed - last_mem_check > 0.5:  # counted from the baseline
                last_mem_check = elapsed
                pids = _tree_pids(proc.pid)
                in_shm = shm.used(pids)
                used = _rss(pids) - baseline_rss + in_shm
                if used > cap:
                    where = f" ({in_shm / 2**30:.1f} GiB of it in /dev/shm)" if in_shm > 2**20 else ""
                    return stop("oom", f"ran out of memory: the job used {used / 2**30:.1f} GiB{where} beyond the "
                                       f"worker's start-up, over its cap of {cap / 2**30:.1f} GiB "
                                       f"(set {MEMORY_LIMIT_ENV})")
            if elapsed - last_disk_check > DISK_CHECK_S:
                last_disk_check = elapsed
                over = limits.exceeded(jobfiles.usage([job_dir, tmp_dir], stop_after=limits.files))
                if over:
                    return stop("error", over + ": the worker was stopped")
    finally:
        parent.close()
        if proc.is_alive():
            _kill(proc)
        if drain.is_alive():
            drain.finish(0.5)
        gather()


def _links_from(job: Job) -> tuple:
    """Where a kept file may have its other hard link: a trace job links its parsed columns from the
    parsed-trace cache (runner-owned; the sandbox lets a job link only files it may write)."""
    if job.analysis not in sandbox.TRACE_CACHE_ANALYSES:
        return ()
    from diagnostics.settings import trace_cache_dir

    return (trace_cache_dir(),)


def _append_log(path: Path, text: str) -> None:
    """A line of the runner's at the end of worker.log (its own file: never through a link)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return
    try:
        if stat_is_regular(fd):
            os.write(fd, ("\n" + text + "\n").encode(errors="replace"))
    finally:
        os.close(fd)


class _ShmCounter:
    """What a job holds in shared memory files: its private /dev/shm where it has one (seen through
    /proc/<pid>/root of its processes), else what the host's /dev/shm gained since the job started."""

    def __init__(self):
        self.host = self._stat("/dev/shm")
        self.host_used0 = self._used("/dev/shm")

    @staticmethod
    def _stat(path: str):
        try:
            return os.stat(path).st_dev
        except OSError:
            return None

    @staticmethod
    def _used(path: str) -> int:
        try:
            st = os.statvfs(path)
        except OSError:
            return 0
        return (st.f_blocks - st.f_bfree) * st.f_frsize

    def used(self, pids: list[int]) -> int:
        private: dict[int, int] = {}
        for pid in pids:
            path = f"/proc/{pid}/root/dev/shm"
            dev = self._stat(path)
            if dev is not None and dev != self.host and dev not in private:
                private[dev] = self._used(path)
        if private:
            return sum(private.values())
        return max(0, self._used("/dev/shm") - self.host_used0) if self.host is not None else 0


def _warm_worker(args: tuple, log_path: Path):
    """(process, answer pipe, log drain) of a spare given this job (``args`` of ``_job_main``), or
    (None, None, None) when no spare is waiting (or the one taken could not be given the job)."""
    spare = _POOL.take() if _POOL.size else None
    if spare is None:
        return None, None, None
    try:
        spare.jobs.send(args)
    except (OSError, ValueError):  # it died meanwhile: start a cold one
        spare.close()
        return None, None, None
    spare.jobs.close()
    drain = _LogDrain(os.dup(spare.log.fileno()), log_path)  # what it printed while waiting comes first
    spare.log.close()
    drain.start()
    return spare.proc, spare.answers, drain


def _tree_pids(pid: int) -> list[int]:
    """The worker and every process below it (the job's, DataLoader workers...)."""
    try:
        root = psutil.Process(pid)
        return [root.pid] + [p.pid for p in root.children(recursive=True)]
    except psutil.Error:
        return []


def _rss(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_info().rss
        except psutil.Error:
            pass
    return total


def _tree_rss(pid: int) -> int:
    """Resident memory of the worker and its children (e.g. DataLoader workers)."""
    return _rss(_tree_pids(pid))


def _baseline(pid: int, job_rss: int) -> int:
    """The footprint the memory cap counts from: the job process' own resident memory when it said
    so (``job_rss``), plus every other process of the tree now (the guardian and, in namespaces, the
    processes waiting above the job; they allocate nothing later). The job process is the deepest
    one at that moment: it has started nothing yet."""
    try:
        root = psutil.Process(pid)
        tree = [root] + root.children(recursive=True)
    except psutil.Error:
        return job_rss
    depth: dict[int, int] = {root.pid: 0}
    for p in tree[1:]:
        try:
            depth[p.pid] = depth.get(p.ppid(), 0) + 1
        except psutil.Error:
            pass
    job = max(depth, key=lambda q: depth[q]) if len(depth) > 1 else None
    return job_rss + _rss([q for q in depth if q != job])


def _kill(proc) -> None:
    """Kill the worker (the job's guardian), the job process and anything they started (DataLoader
    workers, subprocesses, their orphans): frozen first, so nothing forks away meanwhile."""
    if proc.is_alive():
        procs.kill_tree(proc.pid)
    proc.join(5)

