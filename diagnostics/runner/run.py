"""run_job: validate the job, store its run, wait for its device, and supervise its worker (a spare
or a cold one) to the end: progress and partial results, the timeout, cancellation, the memory cap
and the disk quota, then what it left moved into the run's folder and the run stored."""

from __future__ import annotations

import signal
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import diagnostics.jobfiles as jobfiles
import diagnostics.sandbox as sandbox
from diagnostics.errors import JobError, TorchScopeError
from diagnostics.registry import get_analysis
from diagnostics.results import ResultError, decode, decode_partial
from diagnostics.runner.channel import Baseline, ChannelError, Failed, Ok, Partial, Progress, Ready, receive
from diagnostics.runner.device_lock import device_queue
from diagnostics.runner.job import Job, JobOutcome, PartialFn, ProgressFn, cancel_reason
from diagnostics.runner.limits import MEMORY_LIMIT_ENV, MemoryWatch, kill_worker, memory_cap_bytes
from diagnostics.runner.logs import append_log
from diagnostics.runner.spare_pool import spares, warm_worker
from diagnostics.runner.worker import start_cold_worker
from diagnostics.settings import env_number
from diagnostics.store import StoreError

#: Overrides every analysis' default timeout (a caller's explicit timeout_s still wins).
TIMEOUT_ENV = "TORCHSCOPE_JOB_TIMEOUT_S"

#: Stored as the error of a run whose calling thread was interrupted mid-job (an exception from a
#: callback, KeyboardInterrupt in a notebook).
INTERRUPTED_MESSAGE = "cancelled: the process running the job was interrupted before it finished"

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
        memory_limit_mb = memory_limit_mb or memory_cap_bytes() / 2**20
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
            except StoreError as e:  # the job ran; its result could not be stored (its row ends 'error' if it can)
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
        with queue, spares().busy():
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


#: How often the runner counts what a running job has put on disk (seconds).
DISK_CHECK_S = 1.0


def _run_worker(job, artifact_dir, timeout_s, progress, cancel, memory_limit_mb, store, run_id,
                on_tick, limits: jobfiles.Limits, on_partial=None) -> JobOutcome:
    """Start the job's worker (a spare, else a cold one) and supervise it to its end."""
    worker = _Supervised(job, artifact_dir, memory_limit_mb, store, limits)
    try:
        if store is not None:
            try:
                store.set_pid(run_id, worker.proc.pid)
            except StoreError:  # the worker's pid is a note; a store that cannot take it fails at the end
                pass
        progress(0.0, "starting worker")
        return worker.supervise(timeout_s, progress, cancel, on_tick, on_partial)
    finally:
        worker.close()


#: What ``_Supervised.receive`` returns for a message that needs nothing more (progress, a partial result...).
_NEXT = object()


class _Supervised:
    """A job's worker under the runner's watch: its folders, its process and pipes, and its limits.

    The job writes only its staging folder (worker.log, the runner's, sits beside it, out of reach)
    and a private temp folder (TMPDIR, compiler caches); both are counted against the disk quota
    while it runs, and once it is gone its regular files are moved into the run's folder and both
    folders are removed (``gather``)."""

    def __init__(self, job: Job, artifact_dir: Path, memory_limit_mb: float, store, limits: jobfiles.Limits):
        self.job, self.artifact_dir, self.limits = job, artifact_dir, limits
        self.log_path = artifact_dir / "worker.log"
        self.cap = int(memory_limit_mb * 2**20)
        as_limit = self.cap if (job.spec is None or job.spec.device == "cpu") else None  # CUDA needs a huge VA space
        self.job_dir = artifact_dir / jobfiles.JOB_FOLDER
        jobfiles.remove_tree(self.job_dir)
        self.job_dir.mkdir(parents=True)
        self.tmp_dir = tempfile.mkdtemp(prefix="torchscope-job-tmp-")
        hidden = (str(store.data_dir),) if store is not None else ()  # the run store: out of the job's reach
        caps = {"disk_bytes": limits.disk_bytes, "shm_bytes": self.cap}
        self.t0 = time.monotonic()
        self.memory = MemoryWatch()
        args = (job.to_dict(), str(self.job_dir), as_limit, self.tmp_dir, hidden, caps)
        self.proc, self.parent, self.drain = warm_worker(args, self.log_path)
        if self.proc is None:  # no spare: a cold worker, started for this job
            self.proc, self.parent, self.drain = start_cold_worker(*args, self.log_path)
        self.eof = False  # the worker's end of the pipe is closed: it died (or is dying) without an answer
        self.last_mem_check = self.last_tick = self.last_disk_check = 0.0
        self._collected: list[jobfiles.Collected] = []

    def supervise(self, timeout_s: float, progress: ProgressFn, cancel, on_tick, on_partial) -> JobOutcome:
        """Read the worker's messages and watch its limits until it answers, dies or is stopped."""
        while True:
            # poll() is also true at EOF; receive() then raises EOFError
            # After every message too, the checks below: a job whose messages never stop (the pipe never
            # empty) must not hold off its timeout, a cancel or its limits.
            if not self.eof and self.parent.poll(0.1):
                got = self.receive(progress, on_partial)
                if got is not None and got is not _NEXT:
                    return got
            elapsed = time.monotonic() - self.t0
            if on_tick is not None and elapsed - self.last_tick > 0.25:
                self.last_tick = elapsed
                on_tick(elapsed)
            if not self.eof and not self.proc.is_alive() and self.parent.poll(0):
                continue  # it exited: read what it left in the pipe (an answer, or EOF) first
            if self.eof or not self.proc.is_alive():
                return self.crashed()
            ended = self.over_limits(elapsed, timeout_s, cancel)
            if ended is not None:
                return ended

    def receive(self, progress: ProgressFn, on_partial):
        """One message from the worker, acted on: the outcome when it ends the job, ``_NEXT`` when it
        needs nothing more, None at EOF.

        Bytes decoded against the channel's schema, never unpickled: the job's process runs the
        model's code, and whatever it sends is data (runner.channel)."""
        try:
            msg = receive(self.parent)
        except EOFError:
            self.eof = True
            return None
        except ChannelError as e:
            return self.stop("error", f"{e}: the worker was stopped")
        if isinstance(msg, Progress):
            progress(min(1.0, max(0.0, msg.fraction)), msg.message)
            return _NEXT
        if isinstance(msg, Partial):
            if on_partial is not None:  # checked in the worker already (execute)
                try:
                    partial = decode_partial(get_analysis(self.job.analysis), msg.result)
                except ResultError as e:
                    return self.stop("error", f"{e}: the worker was stopped")
                on_partial(partial)
            return _NEXT
        if isinstance(msg, Baseline):  # sent before any user code: only the first counts
            self.memory.start(self.proc.pid, msg.rss)
            return _NEXT
        if isinstance(msg, Ready):  # a spare's imports were done (before its job)
            if self.memory.baseline is None:
                spares().heard_ready(msg)
            return _NEXT
        self.proc.join(5)
        if isinstance(msg, Ok):
            return self.done(JobOutcome("ok", result=msg.result))  # decoded there, once relocated
        assert isinstance(msg, Failed)
        return self.done(JobOutcome(msg.status, error=msg.error, error_type=msg.error_type), extra_log=msg.log)

    def crashed(self) -> JobOutcome:
        """The worker ended (or closed its pipe) without an answer."""
        self.proc.join(5)
        if self.proc.is_alive():  # it closed its pipe but lives on: nothing more will come from it
            kill_worker(self.proc)
        return self.done(JobOutcome("crashed", error=f"the worker process died ({_signal_name(self.proc.exitcode)}) "
                                                     f"while running {self.job.analysis}; the dashboard is unaffected",
                                    error_type="JobError"))

    def over_limits(self, elapsed: float, timeout_s: float, cancel) -> JobOutcome | None:
        """The job stopped for its timeout, its cancel event, its memory cap or its disk quota; else None."""
        if elapsed > timeout_s:
            return self.stop("timeout", f"timed out after {timeout_s:g} s: the worker was stopped")
        if cancel is not None and cancel.is_set():
            return self.stop("cancelled", cancel_reason(cancel))
        if self.memory.baseline is not None and elapsed - self.last_mem_check > 0.5:  # counted from the baseline
            self.last_mem_check = elapsed
            used, in_shm = self.memory.used(self.proc.pid)
            if used > self.cap:
                where = f" ({in_shm / 2**30:.1f} GiB of it in /dev/shm)" if in_shm > 2**20 else ""
                return self.stop("oom", f"ran out of memory: the job used {used / 2**30:.1f} GiB{where} beyond the "
                                        f"worker's start-up, over its cap of {self.cap / 2**30:.1f} GiB "
                                        f"(set {MEMORY_LIMIT_ENV})")
        if elapsed - self.last_disk_check > DISK_CHECK_S:
            self.last_disk_check = elapsed
            over = self.limits.exceeded(jobfiles.usage([self.job_dir, self.tmp_dir], stop_after=self.limits.files))
            if over:
                return self.stop("error", over + ": the worker was stopped")
        return None

    def gather(self) -> jobfiles.Collected:
        """The job is gone: move what it left into the run's folder, once."""
        if not self._collected:
            self._collected.append(jobfiles.collect(self.job_dir, self.artifact_dir, self.limits,
                                                    links_from=_links_from(self.job)))
            jobfiles.remove_tree(self.job_dir)
            jobfiles.remove_tree(self.tmp_dir)
        return self._collected[0]

    def done(self, outcome: JobOutcome, extra_log: str = "") -> JobOutcome:
        """The job's end: the worker killed, its files kept, its plain result relocated and decoded."""
        kill_worker(self.proc)
        self.drain.finish()
        kept = self.gather()
        if outcome.result is not None:  # the plain result from the pipe: the paths it names where the files are now
            outcome.result = jobfiles.relocate(outcome.result, str(self.job_dir), str(self.artifact_dir))
            try:
                outcome.result = decode(get_analysis(self.job.analysis), outcome.result)
            except ResultError as e:
                outcome.status, outcome.result, outcome.error, outcome.error_type = "error", None, str(e), type(e).__name__
        if kept.over_limit and outcome.status == "ok":
            outcome.status, outcome.result, outcome.error_type = "error", None, "JobError"
            outcome.error = kept.over_limit + "; the files past the limit were not kept"
        note = kept.note()
        if note:
            append_log(self.log_path, note)
        outcome.duration_s = time.monotonic() - self.t0
        outcome.log_tail = (extra_log + "\n" + self.drain.recent() + ("\n" + note if note else "")).strip()
        return outcome

    def stop(self, status: str, error: str) -> JobOutcome:
        return self.done(JobOutcome(status, error=error, error_type="JobError"))

    def close(self) -> None:
        """Whatever happened (an interruption in the caller's thread too): pipe closed, worker killed, files kept."""
        self.parent.close()
        if self.proc.is_alive():
            kill_worker(self.proc)
        if self.drain.is_alive():
            self.drain.finish(0.5)
        self.gather()


def _links_from(job: Job) -> tuple:
    """Where a kept file may have its other hard link: a trace job links its parsed columns from the
    parsed-trace cache (runner-owned; the sandbox lets a job link only files it may write)."""
    if job.analysis not in sandbox.TRACE_CACHE_ANALYSES:
        return ()
    from diagnostics.settings import trace_cache_dir

    return (trace_cache_dir(),)
