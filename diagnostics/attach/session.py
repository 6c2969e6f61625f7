"""One attached run from start to stored result: the run is written to the store ('running'), the
user's command starts with the bootstrap in its environment (same argv, working folder, stdin,
stdout and stderr: its output passes through live), the live phase is followed, Stop / Ctrl-C /
a timeout stop the whole process tree, and whatever the outcome, the run folder is analysed and the
run finished in the store with its result.

Stopping: a first Ctrl-C reaches the script from the terminal as it would bare (the script and
this process share the terminal's process group); SIGTERM, ``stop``, a timeout, or a Ctrl-C that
did not come from the terminal send the script SIGINT. If it has not ended STOP_GRACE_S later (or
at a second Ctrl-C) its whole tree is stopped and killed (diagnostics.procs). This process is the
subreaper of what the script starts, so nothing it leaves behind (DataLoader workers, torchrun's
ranks, double-forked helpers) outlives the run; the script runs below a guardian
(``procs.guarded``) that ends its whole tree when this process dies, even by SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import psutil

from diagnostics import procs
from diagnostics.analyses.attach.protocol import (
    LIVE_PHASES, META, PROC_PREFIX, STATUS, AttachConfig, raw_trace_name, read_json,
)
from diagnostics.analyses.attach.result import AttachResult
from diagnostics.attach.command import Command, child_environment
from diagnostics.errors import TorchScopeError
from diagnostics.jobfiles import open_regular

#: Seconds a stopped script gets to end on its own (KeyboardInterrupt: its finally blocks, our export)
#: before its tree is killed.
STOP_GRACE_S = 10.0


def exit_error(code: int) -> str:
    """A run's stored error when the script only exited non-zero (the result's view says that code itself)."""
    return f"the script exited with code {code}"


def only_exit_code(error: str | None) -> bool:
    """Whether a stored run's error says nothing but a non-zero exit code (``exit_error``'s sentence)."""
    return bool(error) and re.fullmatch(r"the script exited with code -?\d+", error) is not None

#: How often the live status is read and the process tree looked at (seconds).
POLL_S = 0.2


@dataclass
class Live:
    """The run's live state, for a progress line or the dashboard: phase (LIVE_PHASES), the step the
    furthest process has completed, the profiled window, the processes that stepped."""

    phase: str = "starting"
    step: int = 0
    window: list | None = None
    processes: int = 0
    elapsed_s: float = 0.0
    stopping: str = ""

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Outcome:
    run_id: str | None
    run_dir: str
    exit_code: int | None  # the script's, as a shell reports it (128 + N after signal N); None: never started
    interrupted: bool
    duration_s: float
    result: AttachResult | None = None
    error: str | None = None  # our failure to analyse (the script's own failure is in exit_code)
    stop_reason: str = ""
    leftovers_killed: int = 0
    notes: list = field(default_factory=list)


def read_live(run_dir: Path) -> Live:
    """The live state from every process' status file."""
    live = Live()
    order = {p: i for i, p in enumerate(LIVE_PHASES)}
    for d in Path(run_dir).glob(f"{PROC_PREFIX}*"):
        st = read_json(str(d / STATUS), None)
        if not st:
            continue
        live.processes += 1
        if st.get("step", 0) >= live.step:
            live.step = st.get("step", 0)
        if order.get(st.get("phase"), -1) > order.get(live.phase, -1) or live.phase == "starting":
            live.phase = st.get("phase") or live.phase
        if st.get("window"):
            live.window = st["window"]
    return live


#: How often, once a window has started, the processes' meta files are read for a trace to gzip (seconds).
TRACE_POLL_S = 1.0
#: The gzip level of the traces (the level changes the file's size, never what it holds). 3, not zlib's default 6:
#: the gzip runs beside the script, on the cores it uses (an 8.4 MB dcgan trace: 89 ms and 611 kB at 3, 216 ms and
#: 485 kB at 6; reading it back is as fast either way).
TRACE_GZIP_LEVEL = 3


def gzip_trace(run_dir, raw: str, name: str) -> None:
    """The run folder's ``raw`` trace (a regular file, opened as jobfiles.open_regular opens a job's files:
    never a link followed or a FIFO waited on, else ArtifactError) gzipped into ``name`` (written whole, then
    renamed into place), and ``raw`` removed. Both are plain file names."""
    import gzip

    for n in (raw, name):
        if not n or os.path.basename(n) != n or n in (".", ".."):
            raise ValueError(f"{n!r} is not a file name of the run folder")
    src, dst = os.path.join(run_dir, raw), os.path.join(run_dir, name)
    with os.fdopen(open_regular(src, max_bytes=None, within=run_dir), "rb") as f:
        tmp = f"{dst}.tmp{os.getpid()}"
        try:
            with open(tmp, "xb") as out, gzip.GzipFile(fileobj=out, mode="wb", compresslevel=TRACE_GZIP_LEVEL) as gz:
                while chunk := f.read(1 << 20):
                    gz.write(chunk)
            os.replace(tmp, dst)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    os.unlink(src)


class TraceGzip:
    """The profiled windows' traces: each process' agent exports its window raw (kineto's own JSON writer,
    fast) and names it in its meta file (``exports.trace_raw``); here, beside the script that runs on, it is
    gzipped into its final name (``exports.trace``). ``finish()`` gzips what is left (a window that ended with
    the script) and waits for the rest. Each trace gzipped is then parsed for this process' analysis of the run
    (analyses.attach.job.read_ahead): beside the script, not after its end."""

    def __init__(self, run_dir, read_ahead: bool = True):
        self.run_dir = str(run_dir)
        self.read_ahead = read_ahead
        self.started: set[str] = set()
        self.threads: list[threading.Thread] = []
        self.errors: list[str] = []
        self.last = 0.0

    def poll(self, now: float | None = None) -> None:
        if now is not None:
            if now - self.last < TRACE_POLL_S:
                return
            self.last = now
        for d in sorted(Path(self.run_dir).glob(f"{PROC_PREFIX}*")):
            exports = (read_json(str(d / META), None) or {}).get("exports") or {}
            raw, name = exports.get("trace_raw"), exports.get("trace")
            if not isinstance(name, str) or raw != raw_trace_name(name) or raw in self.started:
                continue
            if not os.path.lexists(os.path.join(self.run_dir, raw)):
                continue
            self.started.add(raw)
            t = threading.Thread(target=self._gzip, args=(raw, name), daemon=True, name="torchscope-trace-gzip")
            t.start()
            self.threads.append(t)

    def _gzip(self, raw: str, name: str) -> None:
        yield_to_the_script()
        try:
            gzip_trace(self.run_dir, raw, name)
        except Exception as e:  # the analysis reads the raw trace then (job.py), and says nothing is lost
            self.errors.append(f"the trace {raw} was not gzipped ({type(e).__name__}: {e}): kept as it is")
            return
        if self.read_ahead:  # parsed now, beside the script, not after its end (job.read_ahead)
            from diagnostics.analyses.attach.job import read_ahead

            read_ahead(os.path.join(self.run_dir, name))

    def finish(self) -> list[str]:
        self.poll()
        for t in self.threads:
            t.join()
        return self.errors


#: Looks for orphans re-parented to us after a run's tree was killed, ORPHAN_WAIT_S apart.
ORPHAN_TRIES, ORPHAN_WAIT_S = 10, 0.1


class Session:
    """Run ``command`` attached. ``store``: a diagnostics.store.Store (None: a temporary run folder,
    nothing recorded); ``on_live(Live)`` is called when the phase or step changes; ``stop`` ends the
    run as Stop does; ``timeout_s`` likewise after that long."""

    def __init__(self, command: Command, config: AttachConfig, *, store=None, source: str = "cli",
                 on_live: Callable[[Live], None] | None = None, stop: threading.Event | None = None,
                 timeout_s: float | None = None, run_dir: str | None = None, sigterm_reason: str | None = None):
        self.command, self.config, self.store, self.source = command, config, store, source
        if sigterm_reason:
            self.sigterm_reason = sigterm_reason
        self.on_live = on_live or (lambda live: None)
        self.stop_event = stop or threading.Event()
        self.timeout_s = timeout_s
        self.run_id = None
        self._run_dir = run_dir
        self._interrupts = 0
        self._stop_reason = ""
        self._stop_at: float | None = None  # when the grace period ends
        self._kill_now = False
        self._seen: dict[int, float] = {}  # pid -> create time of every process seen below the script

    # ------------------------------------------------------------------ the run
    def start_record(self) -> Path:
        """The run's row ('running') and folder; the config the bootstrap reads."""
        if self.store is not None:
            self.run_id = self.store.create_run(
                "attach", spec=None, options={"command": list(self.command.argv), "cwd": self.command.cwd,
                                              "steps": self.config.steps, "at": self.config.at},
                cache_key=None, model_label=self.command.label, device=None, source=self.source)
            run_dir = self.store.artifact_dir(self.run_id)
        else:
            import tempfile

            run_dir = Path(self._run_dir or tempfile.mkdtemp(prefix="torchscope-attach-"))
        run_dir.mkdir(parents=True, exist_ok=True)
        self.config.write(str(run_dir))
        self.run_dir = run_dir
        self._traces = TraceGzip(run_dir)
        return run_dir

    def run(self) -> Outcome:
        import subprocess

        run_dir = self.start_record()
        env = child_environment(str(run_dir))
        in_main = threading.current_thread() is threading.main_thread()
        previous = {}
        if in_main:
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, self._on_signal)
        reaper = procs.set_subreaper(True)
        t0 = time.monotonic()
        self._t_wall = time.time()
        proc = None
        try:
            try:
                # below a guardian: kill -9 of this process still ends the script's whole tree
                proc = subprocess.Popen(procs.guarded(list(self.command.argv)), cwd=self.command.cwd, env=env,
                                        **self._stdio())
            except OSError as e:
                return self._finish(Outcome(self.run_id, str(run_dir), None, False, 0.0,
                                            error=f"the command could not start: {e.strerror or e}"))
            # the analysis' modules load while the script runs, not after it (a fixed cost of every run)
            threading.Thread(target=_preload_analysis, daemon=True, name="torchscope-preload").start()
            code = self._wait(proc, t0)
        finally:
            killed = self._sweep(proc)
            if reaper:
                procs.set_subreaper(False)
            if in_main:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
        out = Outcome(self.run_id, str(run_dir), code, bool(self._stop_reason), time.monotonic() - t0,
                      stop_reason=self._stop_reason, leftovers_killed=killed)
        return self._finish(out)

    def _stdio(self) -> dict:
        """Popen's stdin / stdout / stderr (hook point, issue 40: a fix trial sends the script's output to a file)."""
        return {}

    def _wait(self, proc, t0: float) -> int:
        with _ExitWatch(proc) as exited:
            return self._wait_loop(proc, t0, exited)

    def _wait_loop(self, proc, t0: float, exited) -> int:
        last = None
        while True:
            rc = exited(POLL_S)
            if rc is not None:
                break
            now = time.monotonic()
            try:  # ours: whatever happens to our files or the live view, the script runs on and is waited for
                self._track(proc.pid)
                live = read_live(self.run_dir)
                if live.window:
                    self._traces.poll(now)
                live.elapsed_s = now - t0
                live.stopping = self._stop_reason
                key = (live.phase, live.step, live.stopping)
                if key != last:
                    last = key
                    self.on_live(live)
            except Exception as e:
                if not self._live_error:
                    self._live_error = f"the live view failed ({type(e).__name__}: {e}); the script ran on"

            if self.stop_event.is_set() and not self._stop_reason:
                self._request_stop(proc, "stopped by the user")
            if self.timeout_s is not None and now - t0 > self.timeout_s and not self._stop_reason:
                self._request_stop(proc, f"stopped after the --timeout of {self.timeout_s:g} s")
            if self._pending_signal:
                self._request_stop(proc, self._pending_signal)
            if self._kill_now or (self._stop_at is not None and now > self._stop_at):
                if not self._stop_reason:
                    self._stop_reason = self._pending_signal or "stopped"
                procs.kill_tree(proc.pid)
                self._stop_at, self._kill_now = None, False
        return rc if rc >= 0 else 128 - rc  # killed by signal N: 128 + N, as a shell reports it

    # ------------------------------------------------------------------ stopping
    _pending_signal = ""
    _live_error = ""
    #: The reason given when SIGTERM reaches us: the dashboard's Stop sends it (Session(sigterm_reason=...)).
    sigterm_reason = "stopped (SIGTERM)"

    _forward = True

    def _on_signal(self, signum, frame) -> None:
        self._interrupts += 1
        if self._interrupts > 1:  # a second Ctrl-C: no more waiting
            self._kill_now = True
            return
        # The terminal's Ctrl-C reached the script itself (one process group): it is not sent twice.
        self._forward = not (signum == signal.SIGINT and _terminal_owns_us())
        self._pending_signal = "interrupted (Ctrl-C)" if signum == signal.SIGINT else self.sigterm_reason

    def _request_stop(self, proc, reason: str) -> None:
        self._pending_signal = ""
        if self._stop_reason:
            return
        self._stop_reason = reason
        if self._forward:
            try:
                proc.send_signal(signal.SIGINT)  # the script's KeyboardInterrupt: its own cleanup, our export
            except OSError:
                pass
        self._forward = True
        self._stop_at = time.monotonic() + STOP_GRACE_S

    # ------------------------------------------------------------------ nothing left behind
    def _track(self, pid: int) -> None:
        for p in procs.descendants(pid):
            try:
                self._seen.setdefault(p.pid, p.create_time())
            except psutil.Error:
                pass

    def _sweep(self, proc) -> int:
        """Kill every process the script left: those seen below it, and orphans re-parented to us."""
        if proc is None:
            return 0
        if proc.poll() is None:
            procs.kill_tree(proc.pid)
            proc.wait()
        me = os.getpid()
        left = []
        for pid, created in self._seen.items():
            try:
                p = psutil.Process(pid)
                if abs(p.create_time() - created) < 1e-3 and not procs.gone(p):
                    left.append(p)
            except psutil.Error:
                pass
        killed = 0
        for attempt in range(ORPHAN_TRIES):
            for p in procs.descendants(me):  # orphans re-parented to us (we are their subreaper)
                try:
                    mine = p.pid in self._seen or p.create_time() >= self._t_wall - 0.05
                except psutil.Error:
                    continue
                if p.pid != proc.pid and p.pid not in {q.pid for q in left} and mine:
                    left.append(p)
            if not left:
                break
            for p in left:
                killed += procs.kill_tree(p.pid)
                try:
                    os.waitpid(p.pid, os.WNOHANG)  # an orphan re-parented to us: collect it
                except (ChildProcessError, OSError):
                    pass
            # a grandchild (a DataLoader worker) reaches us only once the guardian above it has died: look again
            left = []
            time.sleep(ORPHAN_WAIT_S)
        return killed

    # ------------------------------------------------------------------ the result
    def _finish(self, out: Outcome) -> Outcome:
        from diagnostics.analyses.attach.job import analyse_run

        gzip_notes = self._traces.finish()
        try:
            result = analyse_run(out.run_dir, exit_code=out.exit_code, command=list(self.command.argv),
                                 cwd=self.command.cwd, duration_s=out.duration_s, interrupted=out.interrupted,
                                 run_id=self.run_id)
            notes = list(result.notes)
            if out.stop_reason:
                notes.insert(0, f"the run was {out.stop_reason}: what was measured until then is kept")
            if out.leftovers_killed:
                notes.append(f"{out.leftovers_killed} process(es) the script left running were stopped")
            notes += [*self.command.notes, *gzip_notes]
            out.result = result.with_notes(notes)
        except Exception as e:  # ours: say so, keep the script's exit code
            import traceback

            out.error = f"the run folder could not be analysed: {type(e).__name__}: {e}"
            out.notes.append(traceback.format_exc(limit=6))
        if self._live_error:
            out.notes.append(self._live_error)
            if out.result is not None:
                out.result = out.result.with_notes([*out.result.notes, self._live_error])
        if self.store is not None:
            self._finish_row(out)
        return out

    def _finish_row(self, out: Outcome) -> None:
        """The History row ends with a status and a reason, whatever happened to the run folder: the
        script's exit code first, our own failure as the reason."""
        try:
            artifacts = {p.name: str(p) for p in sorted(Path(out.run_dir).iterdir())
                         if p.is_file() and not p.is_symlink()}  # a link the script left is no artifact
        except OSError as e:
            artifacts = {}
            out.notes.append(f"the run folder could not be read ({type(e).__name__}: {e})")
        if out.exit_code is None and out.error:
            status, error = "error", out.error
        elif out.interrupted:
            status, error = "cancelled", f"the script was {out.stop_reason}" + (
                f" (exit code {out.exit_code})" if out.exit_code is not None else "")
        elif out.exit_code not in (0, None):
            status, error = "error", exit_error(out.exit_code)
        elif out.error:
            status, error = "error", f"the script exited with code 0, but {out.error}"
        else:
            status, error = "ok", None
        try:
            self.store.finish_run(self.run_id, status, result=out.result, error=error, artifacts=artifacts)
        except Exception as e:  # the result could not be stored (a full disk...): the row still ends, with why
            out.notes.append(f"the result could not be stored ({type(e).__name__}: {e})")
            try:
                self.store.finish_run(self.run_id, status, result=None, artifacts=artifacts,
                                      error=f"{error + '; ' if error else ''}the result could not be stored: {e}")
            except TorchScopeError as again:  # the store itself ended the row 'error', saying why
                out.error = str(again)


class _ExitWatch:
    """``exited(timeout)``: the process' return code once it has ended, else None after at most ``timeout``
    seconds. On Linux it waits on a pidfd, so the script's end is seen at once (Popen.wait(timeout) polls,
    its sleeps growing to 50 ms: on average 25 ms of every run's wall after the script had ended)."""

    def __init__(self, proc):
        self.proc, self.fd = proc, None

    def __enter__(self):
        try:
            self.fd = os.pidfd_open(self.proc.pid)
        except (AttributeError, OSError):  # not Linux 5.3+, or the process has already been reaped
            self.fd = None
        return self.exited

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)

    def exited(self, timeout: float) -> int | None:
        if self.fd is None:
            try:
                return self.proc.wait(timeout=timeout)
            except Exception:  # subprocess.TimeoutExpired: still running
                return None
        import select

        select.select([self.fd], [], [], timeout)  # readable once the process has ended (EINTR: retried)
        return self.proc.poll()


def yield_to_the_script() -> None:
    """The calling thread (the launcher's work beside the running script: imports, gzip, a trace's parse)
    takes a core only when the script leaves one: 10 nicer, for this thread alone (Linux schedules threads, so
    the launcher's main thread and the script keep their priority). Where the system refuses, as it was."""
    with contextlib.suppress(AttributeError, OSError):
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + BESIDE_THE_SCRIPT_NICE))


#: How much nicer than the launcher its threads that work beside the script are (yield_to_the_script).
BESIDE_THE_SCRIPT_NICE = 10


def _preload_analysis() -> None:
    """The analysis' modules, the trace layer's (pandas: about a second) with them, imported on this side while
    the script runs, so that the run's analysis after the script's end only reads its files."""
    yield_to_the_script()
    try:
        import diagnostics.analyses.attach.job  # noqa: F401
        import diagnostics.trace.breakdowns  # noqa: F401  (job._trace_figures' imports)
        import diagnostics.trace.comm  # noqa: F401
        import diagnostics.trace.ingest  # noqa: F401
    except Exception:  # imported again (and failing visibly) when the run is analysed
        pass


def _terminal_owns_us() -> bool:
    """True when a terminal's foreground process group is ours: its Ctrl-C reached the script too."""
    for stream in (sys.stdin, sys.stderr, sys.stdout):
        try:
            return os.tcgetpgrp(stream.fileno()) == os.getpgrp()
        except (OSError, ValueError, AttributeError):
            continue
    return False
