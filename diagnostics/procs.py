"""No process outlives its job: a guardian above the job's process, and a freeze-then-kill sweep.

The spawned worker becomes the job's *guardian* (``guard``): a child subreaper
(PR_SET_CHILD_SUBREAPER, no privilege needed), so every process orphaned below it, a
``start_new_session`` or double-forked child included, is re-parented to it instead of to init
and stays in its tree; it leaves the dashboard's session (``setsid``) and forks the process that
runs the job. It runs no user code and waits:

* the job process ends (its answer sent, or a crash): the guardian ends everything left below it,
  then exits with the job process' status (a death by signal is passed on as the same signal, so
  the runner still reads SIGSEGV, SIGKILL...);
* the runner dies, even by SIGKILL: the kernel sends the guardian SIGTERM (PR_SET_PDEATHSIG) and it
  does the same;
* the runner stops the job (timeout, cancel, memory cap): the runner sweeps the guardian's tree
  with ``kill_tree``.

``kill_tree`` first stops (SIGSTOP) every process of the tree until no new one appears, then kills
them all: a process cannot fork between being found and being killed. The job process cannot
signal or ptrace the guardian or the runner (the sandbox scopes signals, Landlock ABI 6).

Fallback where prctl is missing (not Linux): no guardian, the worker runs the job itself, and the
runner's ``kill_tree`` sweeps what it finds below the worker while it lives.

An attached script (``python -m diagnostics run``) gets the same guardian as a program of its own
(``guarded(argv)``: this file run by path, ``python -E -P``, so the bootstrap the script's environment
carries never runs in it): a child subreaper that stays in the terminal's process group (the
terminal's Ctrl-C reaches the script as it would bare, and the guardian lets it pass), forks and execs
the command, passes on the SIGINT the tool sends it (Stop, --timeout), and exits as the command
did. When the tool dies, even by SIGKILL, the kernel sends the guardian SIGTERM (PR_SET_PDEATHSIG) and
it kills the script and everything below it, helpers and double-forked children included.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import psutil

_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36
#: Rounds of "find and stop" before the kill: each round stops what the previous one missed.
FREEZE_ROUNDS = 50
#: How often the guardian checks that the runner is still there (PR_SET_PDEATHSIG also tells it).
GUARD_POLL_S = 0.5


def _prctl(option: int, value: int) -> bool:
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def set_subreaper(on: bool = True) -> bool:
    """Make this process (or stop it being) the child subreaper of what it starts: orphans below it are
    re-parented to it, so they can still be found and stopped. False where prctl is missing."""
    return sys.platform == "linux" and _prctl(_PR_SET_CHILD_SUBREAPER, 1 if on else 0)


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def kill_tree(pid: int, include_root: bool = True, wait_s: float = 5.0, reap: bool = False) -> int:
    """Stop, then kill, ``pid`` (unless ``include_root`` is False) and every process below it, and
    wait until they are gone. Returns how many were killed. ``reap``: collect our own finished
    children meanwhile (the guardian does; the runner must not, it would take exit statuses that
    multiprocessing and subprocess objects wait for)."""
    found: dict[int, psutil.Process] = {}
    for _ in range(FREEZE_ROUNDS):
        procs = descendants(pid)
        if include_root:
            try:
                procs.insert(0, psutil.Process(pid))
            except psutil.Error:
                pass
        new = [p for p in procs if p.pid not in found]
        if not new:
            break
        for p in new:
            try:
                p.send_signal(signal.SIGSTOP)  # frozen: it can no longer fork
                found[p.pid] = p
            except psutil.Error:
                pass
    for p in found.values():
        try:
            p.kill()
        except psutil.Error:
            pass
    _wait_gone(list(found.values()), wait_s, reap)
    return len(found)


def gone(p: psutil.Process) -> bool:
    """Ended: no longer there, or a zombie waiting for its parent (or init) to collect it."""
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def _wait_gone(procs: list, wait_s: float, reap: bool) -> None:
    # Not psutil.wait_procs: it waits for a zombie that is not our child to disappear, which under a
    # container's init that never reaps would be the whole timeout.
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if reap:
            _reap()
        if all(gone(p) for p in procs):
            return
        time.sleep(0.01)


def _reap(job_pid: int | None = None):
    """Collect finished children (the guardian's re-parented orphans); the job process' status if seen."""
    status = None
    while True:
        try:
            pid, st = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return status
        if pid == 0:
            return status
        if pid == job_pid:
            status = st


def exit_as(status: int) -> None:
    """Exit the way the job process did: the same exit code, or death by the same signal."""
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        os._exit(code)
    sig = -code
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # passing on SIGSEGV must not dump the guardian's core
    except (ImportError, ValueError, OSError):
        pass
    try:
        signal.signal(sig, signal.SIG_DFL)
    except (OSError, ValueError, RuntimeError):  # SIGKILL and SIGSTOP have no handler to reset
        pass
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)


def die_with_parent(parent_pid: int, sig: int = signal.SIGKILL) -> None:
    """Linux: get ``sig`` when the thread that started us ends; exit now if it already has."""
    if _prctl(_PR_SET_PDEATHSIG, sig) and os.getppid() != parent_pid:
        os._exit(1)


def guard(parent_pid: int, close: tuple = ()) -> bool:
    """Become the job's guardian and fork the job process; returns (True) only in the job process.

    ``close``: connections only the job process may hold (the guardian closes its copies, so the
    parent sees EOF as soon as the job process dies). Returns False without forking where no
    subreaper can be had: this process then runs the job itself and dies with ``parent_pid``."""
    if sys.platform != "linux" or not _prctl(_PR_SET_CHILD_SUBREAPER, 1):
        die_with_parent(parent_pid)
        return False
    try:
        os.setsid()  # out of the dashboard's / terminal's process group: kill(0, ...) below cannot reach it
    except OSError:
        pass
    watched = {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    die_with_parent(parent_pid, signal.SIGTERM)
    me = os.getpid()
    job_pid = os.fork()
    if job_pid == 0:  # the job process
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        die_with_parent(me)  # a guardian killed from outside takes the job with it
        return True
    for c in close:
        c.close()
    _guard(job_pid, parent_pid, watched)
    return False  # not reached


def _guard(job_pid: int, parent_pid: int, watched: set) -> None:
    status = None
    while status is None:
        info = signal.sigtimedwait(watched, GUARD_POLL_S)
        if (info is not None and info.si_signo != signal.SIGCHLD) or os.getppid() != parent_pid:
            # The runner is gone (or asks us to stop): nothing may outlive it.
            kill_tree(os.getpid(), include_root=False, reap=True)
            os._exit(1)
        status = _reap(job_pid)
    # The job process ended: whatever it started goes with it.
    kill_tree(os.getpid(), include_root=False, reap=True)
    _reap()
    exit_as(status)


# ---------------------------------------------------------------------- a command's guardian
def guarded(argv: list[str]) -> list[str]:
    """``argv`` run below a guardian that dies with this process and takes the command's whole tree with
    it (``command_guard``); ``argv`` itself where there is no guardian to be had (not Linux)."""
    if sys.platform != "linux" or sys.version_info < (3, 11):  # -P is 3.11's
        return list(argv)
    # -E: not the script's PYTHONPATH (its bootstrap) nor PYTHON* settings; -P: not this file's folder
    # on sys.path (diagnostics/*.py must not shadow a module psutil imports); the user's site stays
    return [sys.executable, "-E", "-P", os.path.abspath(__file__), str(os.getpid()), "--", *argv]


def command_guard(parent_pid: int, argv: list[str]) -> None:
    """The guardian of ``argv`` (see the module's docstring); never returns."""
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    watched = {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT}
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    die_with_parent(parent_pid, signal.SIGTERM)
    me = os.getpid()
    job_pid = os.fork()
    if job_pid == 0:  # the command: the mask it would have had, dispositions untouched (SIG_IGN stays)
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        die_with_parent(me)  # a guardian killed from outside takes the command with it
        try:
            os.execvp(argv[0], argv)
        except OSError as e:
            os.write(2, f"torchscope: {argv[0]} could not start: {e.strerror}\n".encode())
        os._exit(127)
    status = None
    while status is None:
        info = signal.sigtimedwait(watched, GUARD_POLL_S)
        if os.getppid() != parent_pid or (info is not None and info.si_signo == signal.SIGTERM):
            # the tool is gone (or asks us to stop): nothing it started may outlive it
            kill_tree(me, include_root=False, reap=True)
            os._exit(1)
        if info is not None and info.si_signo == signal.SIGINT and info.si_pid == parent_pid:
            try:  # the tool's Stop or --timeout; the terminal's own Ctrl-C reached the command already
                os.kill(job_pid, signal.SIGINT)
            except OSError:
                pass
        status = _reap(job_pid)
    _reap()  # what the command left running is the tool's to sweep (and to count): it re-parents to it
    exit_as(status)


if __name__ == "__main__":  # python -E -P procs.py PARENT_PID -- ARGV...: see ``guarded``
    command_guard(int(sys.argv[1]), sys.argv[3:])
