"""Jobs that outlive the page that started them: each session's jobs run in a server thread, in order.

A page's script run never runs a job itself: it submits it here and reads its record. A thread per
session with jobs waiting takes them one at a time, in the order they were submitted, and runs each
with ``diagnostics.runner.run_job`` (which owns the worker process and stores the run); progress
and the job's partial results (what it has measured so far) go into the job's record under a lock.
Leaving the page ends the script run, not the job, so a user may start a profile, open other pages
and come back to find it running or done. A job that times its device also waits for the runner's
device queue (across sessions and the CLI).

Cancel is explicit: ``cancel`` takes a waiting job out of its session's line, or sets a running
job's cancel event, which run_job honours by killing the worker and storing the run 'cancelled'.
A finished job stays here until its session collects it (``collect``), or for FINISHED_KEEP_S
when the session went away (its run is in the store either way). The threads are daemons; at
interpreter exit ``shutdown`` cancels every job, so no worker outlives the dashboard (the workers
also die with their thread: PR_SET_PDEATHSIG, and diagnostics.procs' guardian sweeps their children).

No streamlit here: ui.jobs draws the records; tests drive the manager directly.
"""

from __future__ import annotations

import atexit
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

from diagnostics.errors import TorchScopeError
from diagnostics.runner import Job, JobOutcome, keep_spares, run_job

QUEUED, RUNNING, DONE = "queued", "running", "done"
#: How long a finished job nobody collected (its session closed) is kept before it is dropped.
FINISHED_KEEP_S = 3600.0
#: Stored as the error of a job stopped because the dashboard shut down.
SHUTDOWN_MESSAGE = "cancelled: the dashboard shut down before the job finished"
#: The outcome of a job cancelled while it waited for its session's earlier jobs (never stored:
#: it had not started, so the run store has no row for it).
CANCELLED_BEFORE_START = "cancelled: stopped by the user before it started"


class CancelEvent(threading.Event):
    """run_job's cancel event, with the reason stored for the run (diagnostics.runner.job.cancel_reason)."""

    reason: str | None = None


@dataclass(frozen=True)
class Snapshot:
    """One consistent reading of a job's record, for a page to draw."""

    key: str
    title: str
    state: str  # queued | running | done
    fraction: float
    message: str
    elapsed_s: float  # since it started running (0 while queued)
    cancelling: bool
    outcome: JobOutcome | None
    partial: object = None  # the job's latest partial result (ctx.partial: its declared type), while it runs

    @property
    def done(self) -> bool:
        return self.state == DONE


class BackgroundJob:
    """One submitted job and its progress; written by its session's thread, read by any script run."""

    def __init__(self, session: str, job: Job, key: str, title: str, *, store=None,
                 timeout_s: float | None = None, replaceable: bool = False):
        self.session, self.job, self.key, self.title = session, job, key, title
        self.store, self.timeout_s, self.replaceable = store, timeout_s, replaceable
        self.cancel_event = CancelEvent()
        self._lock = threading.Lock()
        self._state, self._fraction, self._message = QUEUED, 0.0, ""
        self._partial: object = None
        self._started = self._finished = None
        self._outcome: JobOutcome | None = None

    # -- written by the session's thread --------------------------------------------------
    def _begin(self) -> None:
        with self._lock:
            self._state, self._started, self._message = RUNNING, time.monotonic(), "starting worker"

    def _progress(self, fraction: float, message: str) -> None:
        with self._lock:
            self._fraction, self._message = float(fraction), str(message)

    def _partial_result(self, result) -> None:
        with self._lock:
            self._partial = result

    def _finish(self, outcome: JobOutcome) -> None:
        with self._lock:
            self._state, self._outcome, self._finished = DONE, outcome, time.monotonic()

    # -- read by pages ------------------------------------------------------------------
    @property
    def done(self) -> bool:
        with self._lock:
            return self._state == DONE

    @property
    def outcome(self) -> JobOutcome | None:
        with self._lock:
            return self._outcome

    def finished_at(self) -> float | None:
        with self._lock:
            return self._finished

    def snapshot(self) -> Snapshot:
        with self._lock:
            elapsed = 0.0 if self._started is None else (self._finished or time.monotonic()) - self._started
            return Snapshot(self.key, self.title, self._state, self._fraction, self._message, elapsed,
                            self.cancel_event.is_set() and self._state != DONE, self._outcome,
                            self._partial if self._state == RUNNING else None)


class JobManager:
    """Background jobs by (session, job key); one thread per session with work, jobs in order."""

    def __init__(self, run: Callable[..., JobOutcome] = run_job):
        self._run = run
        self._lock = threading.Lock()
        self._jobs: dict[tuple[str, str], BackgroundJob] = {}  # the latest job per (session, key)
        self._lines: dict[str, deque[BackgroundJob]] = {}  # per session: jobs waiting, in order
        self._running: dict[str, BackgroundJob] = {}
        self._threads: dict[str, threading.Thread] = {}

    def submit(self, session: str, job: Job, *, title: str, store=None, timeout_s: float | None = None,
               replaceable: bool = False) -> BackgroundJob:
        """Queue ``job`` for ``session`` and return its record; the same job already queued or
        running is returned instead of a second one.

        ``replaceable``: a job the page started by itself (on opening it, or on a changed setting),
        not on a button press. Submitting one drops the session's replaceable jobs of the same
        analysis that are still waiting, so stepping a setting through ten values queues one job,
        not ten (a job already running goes on: its result is stored and found again)."""
        key = job.key()
        with self._lock:
            self._prune()
            current = self._jobs.get((session, key))
            if current is not None and not current.done:
                return current
            line = self._lines.setdefault(session, deque())
            if replaceable:
                for old in [j for j in line if j.replaceable and j.job.analysis == job.analysis]:
                    line.remove(old)
                    self._jobs.pop((session, old.key), None)
            bj = BackgroundJob(session, job, key, title, store=store, timeout_s=timeout_s, replaceable=replaceable)
            self._jobs[(session, key)] = bj
            line.append(bj)
            if session not in self._threads:
                thread = threading.Thread(target=self._serve, args=(session,), daemon=True,
                                          name=f"torchscope-jobs-{session[:8]}")
                self._threads[session] = thread
                thread.start()
        return bj

    def find(self, session: str, key: str) -> BackgroundJob | None:
        """The session's job for ``key``: waiting, running, or finished and not yet collected."""
        with self._lock:
            return self._jobs.get((session, key))

    def pending(self, session: str) -> list[BackgroundJob]:
        """The session's unfinished jobs: the running one first, then the waiting ones in order."""
        with self._lock:
            running = self._running.get(session)
            return ([running] if running is not None and not running.done else []) + list(self._lines.get(session, ()))

    def ahead_of(self, bj: BackgroundJob) -> list[BackgroundJob]:
        """The jobs of its session that run before ``bj`` (empty once it runs)."""
        line = self.pending(bj.session)
        return line[:line.index(bj)] if bj in line else []

    def collect(self, session: str) -> list[BackgroundJob]:
        """Take the session's finished jobs out of the manager (the page keeps their outcomes)."""
        with self._lock:
            done = [(k, bj) for k, bj in self._jobs.items() if k[0] == session and bj.done]
            for k, _ in done:
                del self._jobs[k]
        return [bj for _, bj in done]

    def cancel(self, session: str, key: str, reason: str | None = None) -> bool:
        """Stop the session's job for ``key``: a waiting one leaves the line (finished as cancelled,
        nothing stored), a running one has its worker killed by run_job. False if none is unfinished."""
        with self._lock:
            bj = self._jobs.get((session, key))
            if bj is None or bj.done:
                return False
            line = self._lines.get(session)
            if line is not None and bj in line:
                line.remove(bj)
                bj._finish(JobOutcome("cancelled", error=reason or CANCELLED_BEFORE_START, error_type="JobError"))
                return True
        bj.cancel_event.reason = reason
        bj.cancel_event.set()
        return True

    def wait(self, session: str, timeout_s: float) -> bool:
        """Block until the session has no unfinished job (tests, shutdown); False on timeout."""
        deadline = time.monotonic() + timeout_s
        while self.pending(session):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def shutdown(self, wait_s: float = 10.0) -> None:
        """Cancel every job (waiting ones are dropped, running ones killed and stored 'cancelled')."""
        with self._lock:
            waiting = [bj for line in self._lines.values() for bj in line]
            running = list(self._running.values())
            threads = list(self._threads.values())
        for bj in waiting + running:  # the waiting first: none of them starts meanwhile
            self.cancel(bj.session, bj.key, SHUTDOWN_MESSAGE)
        deadline = time.monotonic() + wait_s
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))

    # -- the session's thread -----------------------------------------------------------
    def _serve(self, session: str) -> None:
        while True:
            with self._lock:
                line = self._lines.get(session)
                if not line:  # decided under the lock: a submit now starts a new thread
                    self._lines.pop(session, None)
                    self._threads.pop(session, None)
                    self._running.pop(session, None)
                    return
                bj = line.popleft()
                self._running[session] = bj
                bj._begin()
            try:
                outcome = self._run(bj.job, store=bj.store, timeout_s=bj.timeout_s, on_progress=bj._progress,
                                    cancel=bj.cancel_event, on_partial=bj._partial_result)
            except Exception as e:  # never leave a record 'running' forever
                outcome = JobOutcome("error", error=f"the dashboard could not run the job: {type(e).__name__}: {e}",
                                     error_type=type(e).__name__)
            bj._finish(outcome)

    def _prune(self) -> None:
        """Drop finished jobs nobody collected for FINISHED_KEEP_S (their sessions are gone)."""
        now = time.monotonic()
        for k, bj in list(self._jobs.items()):
            at = bj.finished_at()
            if at is not None and now - at > FINISHED_KEEP_S:
                del self._jobs[k]


_MANAGER: JobManager | None = None
_MANAGER_LOCK = threading.Lock()


def manager() -> JobManager:
    """The server's one manager. A module global rather than st.cache_resource: clearing Streamlit's
    caches (the app menu's "Clear caches") must not lose track of running jobs."""
    global _MANAGER
    with _MANAGER_LOCK:
        if _MANAGER is None:
            _MANAGER = JobManager()
            atexit.register(_MANAGER.shutdown)
        return _MANAGER


_SPARES_STARTED = False


def start_spares() -> None:
    """Keep the runner's spare workers (TORCHSCOPE_SPARE_WORKERS, default runner.SPARE_WORKERS) for
    this server's jobs: called by app.py on every run, first thing, so the first spare imports torch
    while the server builds the first page. Idempotent; spares are killed when the server exits."""
    global _SPARES_STARTED
    with _MANAGER_LOCK:
        if _SPARES_STARTED:
            return
        _SPARES_STARTED = True
    try:
        keep_spares()
    except TorchScopeError as e:  # a malformed setting: jobs start cold, and the server log says why
        import sys

        print(f"torchscope: spare workers are off: {e}", file=sys.stderr)
