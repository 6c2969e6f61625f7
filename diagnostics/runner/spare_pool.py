"""Spare workers: started ahead of their jobs (torch and the engine imported, no job, no sandbox),
each taking one job and running it as a cold worker does (``_spare_main`` -> ``worker.job_main``). The
dashboard keeps them (``keep_spares``); ``warm_worker`` hands one a job."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import diagnostics.procs as procs
import diagnostics.sandbox as sandbox
from diagnostics.runner.channel import ChannelError, JobArgs, Ready, Sender, receive, receive_job, send_job
from diagnostics.runner.limits import kill_worker
from diagnostics.runner.logs import LogDrain
from diagnostics.runner.worker import job_main, main_script_hidden
from diagnostics.settings import env_number

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


def preload_modules(preload: tuple) -> list[str]:
    """Import ``preload`` and the registry's list of every analysis' declaration (made on first use: a job's
    get_analysis would otherwise import them after the preload); what failed, said, not raised (the job
    imports what it needs again, and reports the error then)."""
    import importlib

    failed = []
    for name in preload:
        try:
            importlib.import_module(name)
        except Exception as e:
            failed.append(f"{name} ({type(e).__name__}: {e})")
    try:
        from diagnostics.registry import ANALYSES  # noqa: F401
    except Exception as e:
        failed.append(f"diagnostics.registry ({type(e).__name__}: {e})")
    return failed


def _spare_main(job_conn, conn, log_conn, parent_pid: int, preload: tuple) -> None:
    """A spare: import ``preload`` (torch...), then wait for one job and run it as a cold worker does.

    No sandbox, no memory cap and no guardian yet: all three come with the job (``job_main``). It
    dies with the pool's thread (the dashboard's process), and exits when the pool closes its pipe."""
    sandbox.scrub_environment()  # first: nothing of the dashboard's environment reaches the job
    os.dup2(log_conn.fileno(), 1)
    os.dup2(log_conn.fileno(), 2)
    log_conn.close()
    conn = Sender(conn)  # the answers go as bytes (runner.channel); no Connection is left to pickle through
    procs.die_with_parent(parent_pid)
    _set_name(SPARE_NAME)
    t0 = time.monotonic()
    failed = preload_modules(preload)
    ready = time.monotonic()
    gc.collect()
    gc.freeze()  # what the job process shares with this one stays shared (no refcount writes by the GC)
    try:
        threads = sys.modules["torch"].get_num_threads() if "torch" in sys.modules else None
        conn.send(Ready(ready - t0, threads))
        args = receive_job(job_conn)
    except (EOFError, OSError):  # the pool closed: no job will come
        os._exit(0)
    job_conn.close()
    _set_name(WORKER_NAME)
    print(f"{WARM_LOG_LINE}: torch and the engine were imported {time.monotonic() - ready:.1f} s before "
          f"this job (imports took {ready - t0:.2f} s)" + (f"; not preloaded: {', '.join(failed)}" if failed else ""),
          flush=True)
    job_main(args.job, conn, args.artifact_dir, args.mem_limit, parent_pid, args.tmp_dir, args.hidden,
              caps=args.caps)


def ready_threads(msg: Ready) -> int | None:
    """The thread count a spare's Ready says, if it is one a process can have (a job can forge one)."""
    n = msg.torch_threads
    return n if n is not None and 1 <= n <= 4096 else None


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
            with main_script_hidden():
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
        kill_worker(self.proc)


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
                msg = receive(spare.answers)  # bytes against the schema: never unpickled
                if not isinstance(msg, Ready):  # it has no job yet: nothing else may come
                    raise ChannelError(f"a spare sent {type(msg).__name__} before its job")
                spare.ready_s = msg.import_s
                self._torch_threads = ready_threads(msg) or self._torch_threads
                return True
        except (EOFError, OSError, ChannelError):
            pass
        return False

    def heard_ready(self, msg: Ready) -> None:
        """A taken spare's Ready, read by the runner with its job's answers: the thread count it says."""
        with self._cond:
            self._torch_threads = ready_threads(msg) or self._torch_threads

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
    n = env_number(SPARES_ENV, SPARE_WORKERS, zero_ok=True,
                   whole=f"of spare workers from 0 (off) to {MAX_SPARE_WORKERS}")
    return min(int(n), MAX_SPARE_WORKERS)


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


def warm_worker(args: tuple, log_path: Path):
    """(process, answer pipe, log drain) of a spare given this job (``args`` of ``worker.job_main``), or
    (None, None, None) when no spare is waiting (or the one taken could not be given the job)."""
    spare = _POOL.take() if _POOL.size else None
    if spare is None:
        return None, None, None
    job, artifact_dir, mem_limit, tmp_dir, hidden, caps = args
    try:
        send_job(spare.jobs, JobArgs(job, artifact_dir, mem_limit, tmp_dir, tuple(hidden), dict(caps)))
    except (OSError, ValueError):  # it died meanwhile: start a cold one
        spare.close()
        return None, None, None
    spare.jobs.close()
    drain = LogDrain(os.dup(spare.log.fileno()), log_path)  # what it printed while waiting comes first
    spare.log.close()
    drain.start()
    return spare.proc, spare.answers, drain
