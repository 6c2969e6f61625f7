"""A user's model may raise, return NaN, hang, abort, segfault, eat memory or flood stdout.

Each case: the job ends with a clear status and message, its run row is final (never left
'running', never half-written), every run stored before is unchanged, and the next job works.
The models are Python files run through the real runner (spawned worker) with a real store.
"""

import os
import re

import psutil
import pytest

from diagnostics.runner import LOG_HEAD_BYTES, LOG_TAIL_BYTES, Job, run_job
from diagnostics.store import Store
from reliability_helpers import assert_intact, good_spec, model_file, python_spec, snapshot

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """One store shared by the fault tests, seeded with a real successful run and a failed one."""
    folder = tmp_path_factory.mktemp("faults")
    store = Store(folder / "data")
    good = good_spec(folder)
    first = run_job(Job("validate", good), store=store, timeout_s=60)
    assert first.ok, first.error
    rid = store.create_run("summary", spec=None, options={"x": 1}, cache_key="k", model_label="old", device="cpu")
    store.finish_run(rid, "error", error="an old failure")
    return {"store": store, "good": good, "folder": folder}


def run_fault(world, forward: str, imports: str = "", name: str = "fault.py", check_next: bool = True, **kwargs):
    """Run validate on a model with this forward body; check the store and the next job around it."""
    store = world["store"]
    before = snapshot(store)
    spec = python_spec(model_file(world["folder"], name, forward, imports))
    outcome = run_job(Job("validate", spec), store=store, **{"timeout_s": 60, **kwargs})
    rec = store.get(outcome.run_id)
    assert rec.status == outcome.status, "the stored status differs from the outcome"
    assert rec.error == outcome.error
    if not outcome.ok:
        assert rec.result is None and rec.metrics == {}, "a failed run must not hold a partial result"
    assert rec.finished is not None and rec.duration_s is not None
    assert "worker.log" in rec.artifacts
    assert_intact(store, before)
    if not check_next:
        return outcome, rec
    nxt = run_job(Job("validate", world["good"]), store=store, timeout_s=60)
    assert nxt.ok, f"the next job failed after a fault: {nxt.error}"
    assert nxt.result.output_shape == [2, 3]
    return outcome, rec


def worker_gone(rec_pid: int) -> bool:
    try:
        return psutil.Process(rec_pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def stored_pid(store, run_id) -> int:
    import sqlite3

    with sqlite3.connect(store.db_path) as db:
        return db.execute("SELECT pid FROM runs WHERE id=?", (run_id,)).fetchone()[0]


def test_forward_that_raises(world):
    out, rec = run_fault(world, "raise ValueError('boom from forward')")
    assert out.status == "error"
    assert "ValueError: boom from forward" in out.error
    assert out.error.startswith("the model rejected its inputs ([2, 4] float32)")


def test_forward_that_returns_nan_completes_with_a_note(world):
    out, rec = run_fault(world, "y = self.lin(x) * float('nan')\ny[0, 0] = float('inf')\nreturn y")
    assert out.ok, out.error
    assert out.result.metrics.output_nan == 5 and out.result.metrics.output_inf == 1
    assert out.result.metrics.output_elements == 6
    assert len(out.result.notes) == 1
    assert out.result.notes[0].startswith("the output is not finite: 5 NaN and 1 infinite values out of 6")
    assert tuple(rec.result["notes"]) == out.result.notes  # the store's plain form


def test_hanging_forward_times_out_and_the_worker_is_killed(world, monkeypatch):
    monkeypatch.setenv("TORCHSCOPE_JOB_TIMEOUT_S", "3")  # replaces the analysis' default (120 s)
    out, rec = run_fault(world, "time.sleep(600)", "import time", timeout_s=None)
    assert out.status == "timeout"
    assert out.error == "timed out after 3 s: the worker was stopped"
    assert 3 <= out.duration_s < 20
    assert worker_gone(stored_pid(world["store"], out.run_id))


def test_os_abort_is_reported_as_a_crash(world):
    out, rec = run_fault(world, "os.abort()", "import os")
    assert out.status == "crashed"
    assert "SIGABRT" in out.error and "the dashboard is unaffected" in out.error


def test_segfault_is_reported_as_a_crash_with_a_traceback(world):
    out, rec = run_fault(world, "ctypes.string_at(0)", "import ctypes")
    assert out.status == "crashed"
    assert "SIGSEGV: a segmentation fault in native code" in out.error
    # faulthandler in the worker names the user's line in the log
    assert "Segmentation fault" in out.log_tail and "fault.py" in out.log_tail


def test_runaway_allocation_hits_the_memory_cap(world):
    # 20 GB in 100 MB chunks, touched; the worker's address space is capped at 1500 MB, so the
    # allocation fails inside the worker long before the machine notices.
    forward = """
        chunks = []
        for _ in range(200):
            chunks.append(torch.ones(25 * 2**20))
        return self.lin(x)
    """
    out, rec = run_fault(world, forward, memory_limit_mb=1500, check_next=False)
    assert out.status == "oom", (out.status, out.error)
    assert out.error.startswith("ran out of memory (the worker's cap is 1.5 GiB; set TORCHSCOPE_WORKER_MEMORY_MB)")
    assert "can't allocate memory" in out.error
    # plain Python allocations (26 GB of bytearrays) end as a MemoryError, or the watchdog sees the
    # worker's resident memory pass the cap first (the address-space cap counts from what torch
    # maps, more on a CUDA build): 'oom' either way, the cap named
    out, _ = run_fault(world, "b = [bytearray(2**26) for _ in range(400)]\nreturn self.lin(x)",
                       name="fault_bytes.py", memory_limit_mb=1500)
    assert out.status == "oom", (out.status, out.error)
    assert "MemoryError" in out.error or "over its cap of 1.5 GiB" in out.error, out.error


def _child_holding(mb: int) -> str:
    """A forward that starts a process holding ``mb`` MB resident for 2.5 s (no address-space cap
    reaches it: only the parent's watchdog, which counts the worker's whole process tree)."""
    code = f"import resource, time; resource.setrlimit(resource.RLIMIT_AS, (-1, -1)); b = b'x' * ({mb} * 2**20); time.sleep(2.5)"
    return f"subprocess.run([sys.executable, '-c', {code!r}], check=True)\nreturn self.lin(x)"


def test_the_watchdog_counts_from_the_workers_start_up(world):
    # torch alone makes the worker ~220 MB resident: with a 500 MB cap, 400 MB more is within it
    # (the watchdog once counted from zero and stopped this job at 630 MB) ...
    out, _ = run_fault(world, _child_holding(400), "import subprocess, sys", name="fault_child_ok.py",
                       memory_limit_mb=500, check_next=False)
    assert out.ok, out.error
    # ... and 900 MB more is not: the job is stopped and the message counts the job's own memory
    out, _ = run_fault(world, _child_holding(900), "import subprocess, sys", name="fault_child_big.py",
                       memory_limit_mb=500)
    assert out.status == "oom", (out.status, out.error)
    # (caught while the child is still filling its 900 MB: somewhere past 0.5 GiB)
    m = re.fullmatch(r"ran out of memory: the job used (\d\.\d) GiB beyond the worker's start-up, "
                     r"over its cap of 0\.5 GiB \(set TORCHSCOPE_WORKER_MEMORY_MB\)", out.error)
    assert m and 0.5 <= float(m[1]) <= 1.0, out.error


def test_a_gpu_out_of_memory_is_not_blamed_on_the_worker_cap(world):
    """torch's OutOfMemoryError is the device's allocator giving up (raised here by hand: no GPU)."""
    forward = 'raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")'
    out, rec = run_fault(world, forward, name="fault_gpu_oom.py")
    assert out.status == "oom"
    assert out.error == "the GPU ran out of memory: CUDA out of memory. Tried to allocate 20.00 GiB"


def test_megabytes_on_stdout_are_kept_bounded(world):
    # ~12 MB of output, first and last lines recognisable
    forward = """
        print("FIRST LINE", flush=True)
        line = "x" * 99 + "\\n"
        for _ in range(120_000):
            sys.stdout.write(line)
        print("LAST LINE", flush=True)
        return self.lin(x)
    """
    out, rec = run_fault(world, forward, "import sys")
    assert out.ok, out.error
    assert out.duration_s < 30
    log = rec.artifacts["worker.log"]
    size = os.path.getsize(log)
    assert size <= LOG_HEAD_BYTES + LOG_TAIL_BYTES + 300, size
    text = open(log, "rb").read().decode()
    mode, text = text.split("\n", 1)  # the worker's first line: the sandbox it runs in
    assert mode.startswith("sandbox: "), mode
    assert text.startswith("FIRST LINE\n")
    assert text.rstrip().endswith("LAST LINE")
    assert "bytes of output dropped" in text
    dropped = int(text.split("[... ")[1].split(" bytes")[0].replace(",", ""))
    total = len(mode) + 1 + len("FIRST LINE\n") + 120_000 * 100 + len("LAST LINE\n")
    assert dropped == total - LOG_HEAD_BYTES - LOG_TAIL_BYTES
    assert "LAST LINE" in out.log_tail


def test_worker_killed_from_outside_is_stored_with_the_reason(world):
    out, rec = run_fault(world, "os.kill(os.getpid(), signal.SIGKILL)", "import os, signal")
    assert out.status == "crashed" and "SIGKILL" in out.error and "out-of-memory killer" in out.error
    assert rec.error == out.error
