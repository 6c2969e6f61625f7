"""Execute a job (spec + analysis + options) in a worker process and return plain data.

The worker is a fresh ``spawn`` process: a crash, hang, abort or runaway allocation in user code
ends the worker, never the dashboard. The parent enforces the timeout, a memory cap (RLIMIT_AS on
CPU jobs, an RSS watchdog on all), cancellation, and a per-device queue for jobs that time the
device, so two sessions do not distort each other's figures. The worker's stdout/stderr go to a
log file in the run's artifact folder, so a model that prints megabytes cannot block a pipe.
"""

from __future__ import annotations

import fcntl
import multiprocessing as mp
import os
import signal
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import psutil

from diagnostics.errors import JobError, TorchScopeError
from diagnostics.registry import get_analysis
from diagnostics.spec import ModelSpec, cache_key

MEMORY_LIMIT_ENV = "TORCHSCOPE_WORKER_MEMORY_MB"
#: Default worker memory cap: this share of physical memory.
DEFAULT_MEMORY_SHARE = 0.6
LOG_TAIL_CHARS = 2000

ProgressFn = Callable[[float, str], None]


@dataclass(frozen=True)
class Job:
    analysis: str
    spec: ModelSpec | None
    options: dict = field(default_factory=dict)

    def key(self) -> str:
        return cache_key(self.spec or ModelSpec(), self.analysis, self.options)

    def to_dict(self) -> dict:
        return {"analysis": self.analysis, "spec": None if self.spec is None else self.spec.to_dict(),
                "options": self.options}

    @classmethod
    def from_dict(cls, d: dict) -> "Job":
        return cls(d["analysis"], None if d["spec"] is None else ModelSpec.from_dict(d["spec"]), d["options"])


@dataclass
class JobOutcome:
    status: str  # ok | error | timeout | crashed | oom | cancelled
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


class AnalysisContext:
    """What an analysis sees: the loaded model (lazily), options, progress and an artifact folder."""

    def __init__(self, job: Job, artifact_dir: Path, progress: ProgressFn | None = None):
        self.job = job
        self.spec = job.spec
        self.options = job.options
        self.artifact_dir = Path(artifact_dir)
        self._progress = progress
        self._loaded = None

    @property
    def loaded(self):
        if self._loaded is None:
            from diagnostics.intake import load_model

            self.progress(0.0, "loading model")
            self._loaded = load_model(self.spec)
        return self._loaded

    def progress(self, fraction: float, message: str = "") -> None:
        if self._progress is not None:
            self._progress(max(0.0, min(1.0, float(fraction))), message)


def execute(job: Job, artifact_dir: Path, progress: ProgressFn | None = None) -> dict:
    """Run the analysis in this process (the worker calls this; tests and notebooks may too)."""
    analysis = get_analysis(job.analysis)
    Path(artifact_dir).mkdir(parents=True, exist_ok=True)
    ctx = AnalysisContext(job, artifact_dir, progress)
    return analysis.load()(ctx, dict(job.options))


# ----------------------------------------------------------------------------- the worker
def _worker_main(job_dict: dict, conn, artifact_dir: str, log_path: str, mem_limit: int | None) -> None:
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    if mem_limit:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (mem_limit, mem_limit))
    try:
        job = Job.from_dict(job_dict)
        result = execute(job, Path(artifact_dir), lambda f, m: conn.send(("progress", f, m)))
        conn.send(("ok", result))
    except TorchScopeError as e:
        conn.send(("error", type(e).__name__, str(e), ""))
    except MemoryError as e:
        conn.send(("oom", type(e).__name__, f"ran out of memory: {e}", ""))
    except BaseException as e:  # the user's code: anything can come out
        text = f"{type(e).__name__}: {e}"
        kind = "oom" if ("out of memory" in str(e).lower() or "can't allocate memory" in str(e).lower()) else "error"
        conn.send((kind, type(e).__name__, text, traceback.format_exc(limit=8)))
    finally:
        conn.close()


def _memory_cap_bytes() -> int:
    env = os.environ.get(MEMORY_LIMIT_ENV)
    if env:
        return int(float(env) * 2**20)
    return int(psutil.virtual_memory().total * DEFAULT_MEMORY_SHARE)


def _tail(path: Path, n: int = LOG_TAIL_CHARS) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - n))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _signal_name(code: int | None) -> str:
    if code is None or code >= 0:
        return f"exit code {code}"
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


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
                    raise JobError("cancelled while queued") from None
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
            on_tick: Callable[[float], None] | None = None) -> JobOutcome:
    """Run ``job`` in a spawned worker; record it in ``store`` (if given) from start to finish.

    ``on_progress(fraction, message)`` gets the analysis' progress; ``on_tick(elapsed_s)`` is called
    a few times a second while waiting, so a UI can show elapsed time (and notice a cancel).
    """
    analysis = get_analysis(job.analysis)
    timeout_s = analysis.default_timeout_s if timeout_s is None else float(timeout_s)
    device = job.spec.device if job.spec is not None else "cpu"
    run_id = None
    if store is not None:
        run_id = store.create_run(job.analysis, spec=None if job.spec is None else job.spec.to_dict(),
                                  options=job.options, cache_key=job.key(),
                                  model_label=None if job.spec is None else job.spec.label,
                                  device=device, source=source)
        artifact_dir = store.artifact_dir(run_id)
    elif artifact_dir is None:
        import tempfile

        artifact_dir = Path(tempfile.mkdtemp(prefix="torchscope-job-"))
    artifact_dir = Path(artifact_dir)
    artifact_dir.mkdir(parents=True, exist_ok=True)
    progress = on_progress or (lambda f, m: None)

    def finish(outcome: JobOutcome) -> JobOutcome:
        outcome.run_id, outcome.artifact_dir = run_id, str(artifact_dir)
        if store is not None:
            error = outcome.error if outcome.ok else f"{outcome.error}"
            store.finish_run(run_id, outcome.status, result=outcome.result, error=error,
                             artifacts=_list_artifacts(artifact_dir))
        return outcome

    lock_dir = (store.data_dir if store is not None else Path(artifact_dir).parent) / "locks"
    try:
        if analysis.exclusive:
            queue = device_queue(lock_dir, device, lambda: progress(0.0, f"queued: another job is timing {device}; "
                                                                           "waiting for it to finish"),
                                 cancel, on_tick)
        else:
            queue = _null()
        with queue:
            return finish(_run_worker(job, artifact_dir, timeout_s, progress, cancel, memory_limit_mb,
                                      store, run_id, on_tick))
    except JobError as e:
        return finish(JobOutcome("cancelled", error=str(e), error_type="JobError"))


@contextmanager
def _null():
    yield False


def _run_worker(job, artifact_dir, timeout_s, progress, cancel, memory_limit_mb, store, run_id,
                on_tick) -> JobOutcome:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    log_path = artifact_dir / "worker.log"
    cap = int(memory_limit_mb * 2**20) if memory_limit_mb else _memory_cap_bytes()
    as_limit = cap if (job.spec is None or job.spec.device == "cpu") else None  # CUDA needs a huge VA space
    proc = ctx.Process(target=_worker_main, args=(job.to_dict(), child, str(artifact_dir), str(log_path), as_limit),
                       daemon=True)
    t0 = time.monotonic()
    proc.start()
    child.close()
    if store is not None:
        store.set_pid(run_id, proc.pid)
    ps = psutil.Process(proc.pid)
    progress(0.0, "starting worker")
    last_mem_check = last_tick = 0.0

    def stop(status: str, error: str) -> JobOutcome:
        _kill(proc)
        return JobOutcome(status, error=error, error_type="JobError", duration_s=time.monotonic() - t0,
                          log_tail=_tail(log_path))

    try:
        while True:
            if parent.poll(0.1):
                try:
                    msg = parent.recv()
                except EOFError:
                    msg = None
                if msg is not None and msg[0] == "progress":
                    progress(msg[1], msg[2])
                    continue
                if msg is not None:
                    proc.join(5)
                    _kill(proc)
                    dt = time.monotonic() - t0
                    if msg[0] == "ok":
                        return JobOutcome("ok", result=msg[1], duration_s=dt, log_tail=_tail(log_path))
                    return JobOutcome(msg[0], error=msg[2], error_type=msg[1], duration_s=dt,
                                      log_tail=(msg[3] + "\n" + _tail(log_path)).strip())
            elapsed = time.monotonic() - t0
            if on_tick is not None and elapsed - last_tick > 0.25:
                last_tick = elapsed
                on_tick(elapsed)
            if not proc.is_alive() and not parent.poll(0):
                proc.join()
                why = _signal_name(proc.exitcode)
                hint = " (killed: probably out of memory)" if proc.exitcode == -signal.SIGKILL else ""
                return JobOutcome("crashed", error=f"the worker process died ({why}){hint} while running "
                                                   f"{job.analysis}; the dashboard is unaffected",
                                  error_type="JobError", duration_s=elapsed, log_tail=_tail(log_path))
            if elapsed > timeout_s:
                return stop("timeout", f"timed out after {timeout_s:g} s: the worker was stopped")
            if cancel is not None and cancel.is_set():
                return stop("cancelled", "cancelled by the user")
            if elapsed - last_mem_check > 0.5:
                last_mem_check = elapsed
                try:
                    rss = ps.memory_info().rss
                except psutil.Error:
                    rss = 0
                if rss > cap:
                    return stop("oom", f"ran out of memory: the worker used {rss / 2**30:.1f} GiB, over its cap of "
                                       f"{cap / 2**30:.1f} GiB (set {MEMORY_LIMIT_ENV})")
    finally:
        parent.close()
        if proc.is_alive():
            _kill(proc)


def _kill(proc) -> None:
    if proc.is_alive():
        proc.kill()
    proc.join(5)


def _list_artifacts(artifact_dir: Path) -> dict:
    return {p.name: str(p) for p in sorted(Path(artifact_dir).iterdir()) if p.is_file()} if Path(artifact_dir).exists() else {}
