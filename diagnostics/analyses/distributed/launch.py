"""Launch a DistJob with torchrun and wait for it, never longer than a timeout.

``torchrun_command`` builds ``python -m torch.distributed.run ... -m diagnostics.analyses.distributed.
rank_main --job FILE`` (standalone on one machine, or with a rendezvous endpoint for several).
``launch`` runs it in its own session (process group) so a timeout kills torchrun *and* every
rank; on Linux torchrun also gets SIGTERM if the process that launched it dies (the runner kills
its worker on timeout or cancel). When the run fails, ``failed_rank`` names the rank that caused
it: from the per-rank status files rank_main writes and the exit codes in torchrun's summary.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from diagnostics.analyses.distributed.dist_job import DistJob, DistributedError, DistributedInputError, status_path, trace_path

#: Seconds a run may take when the caller gives no timeout.
DEFAULT_LAUNCH_TIMEOUT_S = 300.0
#: After SIGTERM, seconds torchrun gets to stop its ranks before SIGKILL.
KILL_GRACE_S = 5.0
#: The folder holding the diagnostics package: torchrun's ranks import it from there.
REPO_ROOT = Path(__file__).resolve().parents[3]  # the checkout that holds the diagnostics package
LOG_NAME = "torchrun.log"
JOB_NAME = "job.json"
#: Exit codes of a rank that torchrun stopped itself (SIGTERM) after another rank failed.
_SIGTERM_EXITS = {-signal.SIGTERM, 128 + signal.SIGTERM}
#: What a signal that killed a rank from outside usually means. (Not the words "out of memory": the
#: runner reads those in an error as the *worker* running out of its memory cap.)
_SIGNAL_HINTS = {signal.SIGKILL: "the OOM killer, out of RAM?", signal.SIGSEGV: "a segmentation fault",
                 signal.SIGABRT: "aborted", signal.SIGBUS: "a bus error"}
# torchrun's failure summary: "rank      : 1 (local_rank: 1)" then "exitcode  : 3 (pid: 123)".
_SUMMARY_RE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)"
                         r"(?:\s*\(pid:\s*(\d+)\))?")
# torchrun closing its other ranks once one failed: SIGTERM, then SIGKILL for those that linger.
_CLOSED_RE = re.compile(r"Sending process (\d+) closing signal|Unable to shutdown process (\d+) via")
_ROOT_RE = re.compile(r"Root Cause \(first observed failure\):\s*\n\[\d+\]:\s*\n\s*time\s*:.*\n\s*host\s*:.*\n"
                      r"\s*rank\s*:\s*(\d+)")


def torchrun_command(job_file, nproc: int, *, nnodes: int = 1, rdzv_endpoint: str | None = None,
                     rdzv_backend: str = "c10d", rdzv_id: str = "torchscope",
                     python: str | None = None) -> list[str]:
    """The torchrun command line; without ``rdzv_endpoint`` a standalone single-machine run."""
    nproc = int(nproc)
    if not 1 <= nproc <= 4096:
        raise DistributedInputError(f"processes per node must be between 1 and 4096, got {nproc}")
    if int(nnodes) > 1 and not rdzv_endpoint:
        raise DistributedInputError(f"{nnodes} nodes need a rendezvous endpoint (HOST:PORT of node 0); without one "
                               "torchrun runs a single standalone node")
    cmd = [python or sys.executable, "-m", "torch.distributed.run"]
    if rdzv_endpoint:
        cmd += ["--nnodes", str(nnodes), "--rdzv_backend", rdzv_backend, "--rdzv_endpoint", rdzv_endpoint,
                "--rdzv_id", rdzv_id]
    else:
        cmd += ["--standalone", "--nnodes", "1"]
    cmd += ["--nproc_per_node", str(nproc), "--max_restarts", "0",
            "-m", "diagnostics.analyses.distributed.rank_main", "--job", str(job_file)]
    return cmd


@dataclass
class LaunchResult:
    out_dir: str
    world_size: int
    returncode: int
    duration_s: float
    log_tail: str = ""
    statuses: dict = field(default_factory=dict)  # rank -> status dict


def _die_with_parent() -> None:  # runs in the child before exec
    os.setsid()
    try:  # the ranks are processes of their own: lift the runner worker's address-space cap (its soft
        import resource  # limit; NCCL maps device memory into the address space and fails under it)

        resource.setrlimit(resource.RLIMIT_AS, (resource.getrlimit(resource.RLIMIT_AS)[1],) * 2)
    except (ImportError, ValueError, OSError):
        pass
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: torchrun gets SIGTERM if we die
    except (OSError, AttributeError):  # not Linux: the timeout still applies
        pass


def _kill_group(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            # torchrun is gone; its ranks share the group: make sure none outlives it.
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def read_statuses(out_dir, world_size: int) -> dict[int, dict]:
    import json

    out = {}
    for r in range(world_size):
        p = status_path(out_dir, r)
        try:
            out[r] = json.loads(p.read_text())
        except (OSError, ValueError):
            out[r] = {"rank": r, "state": "not started"}
    return out


def _tail(path: Path, n: int = 4000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-n:].decode("utf-8", "replace")


def exit_codes(log_text: str) -> dict[int, int]:
    """rank -> exit code, from torchrun's failure summary."""
    return {int(r): int(c) for r, c, _ in _SUMMARY_RE.findall(log_text)}


def _summary_pids(log_text: str) -> dict[int, int]:
    return {int(r): int(p) for r, _, p in _SUMMARY_RE.findall(log_text) if p}


def closed_pids(log_text: str) -> set[int]:
    """Pids of the ranks torchrun stopped itself (SIGTERM, then SIGKILL) because another rank failed."""
    return {int(a or b) for a, b in _CLOSED_RE.findall(log_text)}


def describe_exit(code: int) -> str:
    """'killed (SIGKILL, exit -9: the OOM killer, out of RAM?)' or 'died with exit code 3'."""
    if code < 0:
        try:
            sig = signal.Signals(-code)
        except ValueError:
            return f"was killed (signal {-code}, exit {code})"
        hint = _SIGNAL_HINTS.get(sig)
        return f"was killed ({sig.name}, exit {code}" + (f": {hint})" if hint else ")")
    return f"died with exit code {code}"


def failed_rank(statuses: dict[int, dict], codes: dict[int, int], log_text: str = "") -> tuple[int | None, str]:
    """(rank, why) of the rank that brought the run down, or (None, why) if it cannot be told.

    A rank that exited without reporting a Python error (a crash: os._exit, a signal, SIGKILL
    from the OOM killer) comes first, unless torchrun stopped it itself after another rank failed
    (it logs "Sending process PID closing signal SIGTERM" and, for a rank that lingers,
    "Unable to shutdown process PID ... SIGKILL"; a SIGTERM exit counts as stopped too). Then
    the rank whose Python error came first; then torchrun's own "root cause".
    """
    pids = _summary_pids(log_text)
    closed = closed_pids(log_text)

    def stopped_by_torchrun(r: int) -> bool:
        pid = statuses.get(r, {}).get("pid") or pids.get(r)
        return codes.get(r) in _SIGTERM_EXITS or (pid is not None and int(pid) in closed)

    m = _ROOT_RE.search(log_text)
    root = int(m.group(1)) if m else None
    crashed = [r for r, s in statuses.items()
               if s.get("state") in ("running", "dying") and codes.get(r, 0) != 0 and not stopped_by_torchrun(r)]
    errored = [r for r, s in statuses.items() if s.get("state") == "error"]
    if crashed:
        # torchrun's first observed failure first, then the rank that said it was dying first.
        r = min(crashed, key=lambda r: (r != root, statuses[r].get("state") != "dying", statuses[r].get("time", 0.0)))
        step = statuses[r].get("step")
        why = (f"rank {r} {describe_exit(codes[r])}" + (f" at step {step}" if step is not None else "")
               + " without reporting a Python error")
    elif errored:
        r = min(errored, key=lambda r: statuses[r].get("time", 0.0))
        why = f"rank {r} failed: {statuses[r].get('error', 'unknown error')}"
    elif root is not None:
        r = root
        code = codes.get(r)
        why = (f"rank {r} failed (exit code {'?' if code is None else code}, torchrun's first observed failure)"
               if code is None or code >= 0 else
               f"rank {r} {describe_exit(code)} (torchrun's first observed failure)")
    else:
        return None, "torchrun failed before any rank reported (see its log)"
    after = []
    for o in sorted(set(statuses) | set(codes)):
        if o == r:
            continue
        state = statuses.get(o, {}).get("state")
        if state == "error":
            after.append(f"rank {o} failed ({str(statuses[o].get('error', '')).split(':')[0] or 'error'})"
                         + (" and was stopped by torchrun" if stopped_by_torchrun(o) else ""))
        elif stopped_by_torchrun(o):
            after.append(f"rank {o} was stopped by torchrun")
    if after:
        why += "; then " + ", ".join(after)
    return r, why


def launch(job: DistJob, nproc: int, *, timeout_s: float = DEFAULT_LAUNCH_TIMEOUT_S,
           on_progress: Callable[[float, str], None] | None = None, env: dict | None = None) -> LaunchResult:
    """Run ``job`` on ``nproc`` local processes; raise DistributedError naming the failed rank."""
    out = Path(job.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for r in range(int(nproc)):
        for p in (status_path(out, r), trace_path(out, r)):
            p.unlink(missing_ok=True)
    job_file = out / JOB_NAME
    job_file.write_text(job.to_json())
    cmd = torchrun_command(job_file, nproc)
    run_env = {**os.environ, **(env or {})}
    run_env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + [p for p in [run_env.get("PYTHONPATH")] if p])
    run_env.setdefault("OMP_NUM_THREADS", str(max(1, int(job.threads))))
    log_path = out / LOG_NAME
    progress = on_progress or (lambda f, m: None)
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=str(REPO_ROOT), env=run_env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        try:
            last = -1
            while proc.poll() is None:
                elapsed = time.monotonic() - t0
                if elapsed > timeout_s:
                    _kill_group(proc)
                    statuses = read_statuses(out, nproc)
                    waiting = [r for r, s in statuses.items() if s.get("state") != "done"]
                    raise DistributedError(
                        f"the distributed run timed out after {timeout_s:g} s and was stopped; ranks not "
                        f"finished: {waiting} (states: "
                        + ", ".join(f"rank {r}: {statuses[r].get('state')}" for r in waiting) + ")")
                done = sum(1 for s in read_statuses(out, nproc).values() if s.get("state") == "done")
                if done != last:
                    last = done
                    progress(0.1 + 0.7 * done / nproc, f"torchrun: {done} of {nproc} ranks finished")
                time.sleep(0.1)
        finally:
            if proc.poll() is None:  # an exception (or cancel) on our side: leave nothing running
                _kill_group(proc)
    duration = time.monotonic() - t0
    log_text = log_path.read_text(errors="replace")
    statuses = read_statuses(out, nproc)
    result = LaunchResult(str(out), int(nproc), proc.returncode, duration, log_text[-4000:], statuses)
    if proc.returncode != 0:
        rank, why = failed_rank(statuses, exit_codes(log_text), log_text)
        if rank is None and proc.returncode < 0:
            why = f"torchrun itself {describe_exit(proc.returncode)} before any rank reported"
        raise DistributedError(f"the distributed run failed: {why} (torchrun exit code {proc.returncode}; "
                               f"log: {log_path})")
    missing = [r for r in range(nproc) if not trace_path(out, r).exists()]
    if missing:
        raise DistributedError(f"torchrun finished but ranks {missing} wrote no trace (log: {log_path})")
    return result
