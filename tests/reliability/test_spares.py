"""Spare workers (runner.keep_spares): started ahead with torch imported, one job each, confined as
a cold worker is, and none left behind.

Each test starts the pool itself (tests/conftest.py turns spares off for everything else), waits
until its spare has finished importing, and checks in the job's worker.log that the job ran in it.
"""

import ast
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from diagnostics import runner, sandbox
from diagnostics.errors import TorchScopeError
from diagnostics.runner import SPARE_NAME, WARM_LOG_LINE, Job, run_job
from diagnostics.store import Store
from reliability_helpers import good_spec, model_file, python_spec

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[2]
READY_S = 180  # a spare imports torch: slow on a busy machine


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(pids, timeout_s: float = 15) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


@pytest.fixture
def pool(monkeypatch):
    """One spare, ready; every spare killed after the test. Settings a test changes must be set
    before it asks for a spare (a spare serves only the environment it was started in)."""

    def start(n: int = 1):
        assert runner.keep_spares(n) == n
        assert runner.spares().wait_ready(READY_S), "the spare did not finish its imports"
        return runner.spares()

    yield start
    runner.spares().close()
    assert runner.spares().pids() == []


def stored_pid(store, run_id: str) -> int:
    import sqlite3

    with sqlite3.connect(store.db_path) as db:
        return db.execute("SELECT pid FROM runs WHERE id=?", (run_id,)).fetchone()[0]


def worker_log(outcome) -> str:
    return (Path(outcome.artifact_dir) / "worker.log").read_text(errors="replace")


def test_a_job_runs_in_the_waiting_spare_and_the_spare_ends_with_it(pool, tmp_path):
    store = Store(tmp_path / "data")
    spare = pool().pids()
    assert len(spare) == 1 and psutil.Process(spare[0]).name() == SPARE_NAME
    out = run_job(Job("validate", good_spec(tmp_path)), store=store, timeout_s=120)
    assert out.ok, out.error
    assert worker_log(out).startswith(WARM_LOG_LINE), worker_log(out)[:500]
    assert stored_pid(store, out.run_id) == spare[0]  # the run's worker is the spare that waited
    assert wait_gone(spare) == []  # one job per process: it exited after its job
    # The next job gets a new spare (started once no job ran), never the same process.
    assert runner.spares().wait_ready(READY_S)
    nxt = runner.spares().pids()
    assert len(nxt) == 1 and nxt[0] != spare[0]
    again = run_job(Job("validate", good_spec(tmp_path)), store=store, timeout_s=120)
    assert again.ok and stored_pid(store, again.run_id) == nxt[0]
    assert again.result == out.result  # the same answer as the first spare's


def test_a_spare_reports_torchs_thread_count_of_a_fresh_process(pool):
    pool()
    fresh = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                           capture_output=True, text=True, check=True, timeout=240)
    assert runner.spares().torch_threads() == int(fresh.stdout)


def test_the_result_is_the_one_a_cold_worker_gives(pool, tmp_path, monkeypatch):
    from diagnostics.spec import ModelSpec

    job = Job("summary", ModelSpec(source="sample", name="mlp"))
    cold = run_job(job, timeout_s=180)
    assert cold.ok and WARM_LOG_LINE not in worker_log(cold)
    pool()
    warm = run_job(job, timeout_s=180)
    assert warm.ok and worker_log(warm).startswith(WARM_LOG_LINE)
    assert warm.result.metrics == cold.result.metrics
    assert warm.result.layers == cold.result.layers


def test_a_spare_started_under_other_settings_is_not_used(pool, tmp_path, monkeypatch):
    old = pool().pids()
    monkeypatch.setenv("TORCHSCOPE_JOB_TIMEOUT_S", "77")  # anything in the environment
    out = run_job(Job("validate", good_spec(tmp_path)), timeout_s=120)
    assert out.ok and WARM_LOG_LINE not in worker_log(out)  # a cold worker ran it
    assert wait_gone(old) == []  # and the stale spare was killed


def test_a_spare_serves_the_same_search_path_written_twice_but_not_a_new_folder(pool, tmp_path, monkeypatch):
    """Streamlit inserts the app's folder into sys.path once more at start-up, after `make run`'s launcher
    started the first spare with that folder already first (python -m): the same folders, in the same
    order, so the spare serves the job. A folder added for real makes it stale."""
    spare = pool().pids()
    monkeypatch.setattr(sys, "path", [sys.path[0]] + sys.path)
    out = run_job(Job("validate", good_spec(tmp_path)), timeout_s=120)
    assert out.ok and worker_log(out).startswith(WARM_LOG_LINE), worker_log(out)[:500]
    assert wait_gone(spare) == []
    assert runner.spares().wait_ready(READY_S)
    monkeypatch.setattr(sys, "path", [str(tmp_path)] + sys.path)
    out = run_job(Job("validate", good_spec(tmp_path)), timeout_s=120)
    assert out.ok and WARM_LOG_LINE not in worker_log(out)  # a cold worker ran it


PRELOADED = """
import importlib, sys, tempfile
sys.path.insert(0, {root!r})
from diagnostics import ModelSpec
from diagnostics.runner import SPARE_PRELOAD, Job, execute
from diagnostics.runner.spare_pool import preload_modules
assert preload_modules(SPARE_PRELOAD) == []
before = set(sys.modules)
for analysis in ("summary", "validate"):
    execute(Job(analysis, ModelSpec(source="sample", name="cnn")), tempfile.mkdtemp())
print("NEW", *sorted(set(sys.modules) - before))
print("DYNAMO", "torch._dynamo" in sys.modules)
"""


@pytest.mark.slow
def test_the_model_pages_jobs_import_nothing_after_the_spares_preload(tmp_path):
    """What a spare imports while it waits is all the Model page's job and the upload check need, and
    torch._dynamo is not among it: torch's FLOP counter imported it at its first count (1-2 s, which the
    spare then preloaded and every first session waited for); our counter's mode leaves it unimported."""
    script = tmp_path / "preloaded.py"
    script.write_text(PRELOADED.format(root=str(ROOT)))
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=280)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split("NEW", 1)[1].split("DYNAMO")[0].split() == []
    assert p.stdout.split("DYNAMO", 1)[1].split() == ["False"]


SANDBOX_PROBES = """
import errno, os, socket
def attempt(fn):
    try:
        fn()
        return "allowed"
    except OSError as e:
        return "refused:" + errno.errorcode.get(e.errno, str(e.errno))
def write(path):
    with open(path, "w") as f:
        f.write("pwned")
report = {
    "read_passwd": attempt(lambda: open("/etc/passwd").read()),
    "write_outside": attempt(lambda: write(TARGET)),
    "read_store": attempt(lambda: open(STORE, "rb").read()),
    "udp_socket": attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).close()),
    "signal_guardian": attempt(lambda: os.kill(os.getppid(), 0)),
    "threads": len(os.listdir("/proc/self/task")),
}
raise RuntimeError("PROBE " + repr(report))
"""


@pytest.mark.skipif(not sandbox.probe().ok, reason=f"no job sandbox here: {sandbox.probe().reason}")
def test_a_job_in_a_spare_is_confined_as_in_a_cold_worker(pool, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHSCOPE_SANDBOX", "1")  # before the spare starts: it serves this environment
    store = Store(tmp_path / "data")
    target = tmp_path / "outside.txt"
    forward = SANDBOX_PROBES.replace("TARGET", repr(str(target))).replace("STORE", repr(str(store.db_path)))
    spec = python_spec(model_file(tmp_path, "probe.py", forward))
    reports = {}
    for kind in ("cold", "warm"):
        if kind == "warm":
            pool()
        out = run_job(Job("validate", spec), store=store, timeout_s=120)
        assert out.status == "error" and "PROBE " in out.error, out.error
        assert (WARM_LOG_LINE in worker_log(out)) == (kind == "warm")
        reports[kind] = ast.literal_eval(out.error.split("PROBE ", 1)[1])
    warm = reports["warm"]
    # Landlock says EACCES; in namespaces of its own the job does not even see /etc/passwd or the store
    # (ENOENT), and the folder above its model is the view's read-only root (EROFS)
    assert all(warm[k].startswith("refused:") for k in ("read_passwd", "write_outside", "read_store")), warm
    assert warm["udp_socket"] == "refused:EACCES"
    assert warm["signal_guardian"] == "refused:EPERM" or sandbox.probe().landlock_abi < 6
    assert not target.exists()
    assert {k: v for k, v in warm.items() if k != "threads"} == {k: v for k, v in reports["cold"].items()
                                                              if k != "threads"}


def test_a_crash_in_a_job_on_a_spare_is_reported_as_a_crash(pool, tmp_path):
    spec = python_spec(model_file(tmp_path, "segv.py", "import ctypes\nctypes.string_at(0)\nreturn self.lin(x)"))
    pool()
    out = run_job(Job("validate", spec), timeout_s=120)
    assert out.status == "crashed", (out.status, out.error)
    assert "SIGSEGV" in out.error and "the dashboard is unaffected" in out.error
    assert worker_log(out).startswith(WARM_LOG_LINE)
    assert "Fatal Python error: Segmentation fault" in out.log_tail  # faulthandler, as in a cold worker


def test_a_runaway_allocation_on_a_spare_hits_the_memory_cap(pool, tmp_path):
    spec = python_spec(model_file(tmp_path, "hog.py", "hog = [bytearray(64 << 20) for _ in range(10_000)]\n"
                                                      "return self.lin(x)"))
    pool()
    out = run_job(Job("validate", spec), timeout_s=120, memory_limit_mb=256)
    assert out.status == "oom", (out.status, out.error)
    assert "0.2 GiB" in out.error or "0.3 GiB" in out.error  # 256 MiB beyond the worker's start-up
    assert worker_log(out).startswith(WARM_LOG_LINE)


def test_a_models_children_are_gone_after_its_job_on_a_spare(pool, tmp_path):
    import re

    token = f"{os.getpid() % 10**6:06d}"  # in the children's command lines: the pids a job sees are its namespace's
    forward = f"""
plain = subprocess.Popen(["sleep", "300.{token}"])
session = subprocess.Popen(["sleep", "301.{token}"], start_new_session=True)
print(f"CHILDREN {{plain.pid}} {{session.pid}}", flush=True)
time.sleep(1)
return self.lin(x)
"""
    spec = python_spec(model_file(tmp_path, "leaky.py", forward, "import subprocess, time"))
    pool()
    seen = []

    def watch():  # the children, found by their command lines while the job runs
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(seen) < 2:
            seen[:] = [p.pid for p in psutil.process_iter(["cmdline"])
                       if any(a.endswith("." + token) for a in (p.info["cmdline"] or []))]
            time.sleep(0.05)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    out = run_job(Job("validate", spec), timeout_s=120)
    t.join(5)
    assert out.ok, out.error
    log = worker_log(out)
    assert log.startswith(WARM_LOG_LINE) and re.search(r"CHILDREN (\d+) (\d+)", log)
    assert len(seen) >= 2 and wait_gone(seen) == []


def test_close_kills_the_waiting_spares(pool):
    pids = pool(2).pids()
    assert len(pids) == 2 and all(alive(p) for p in pids)
    runner.spares().close()
    assert wait_gone(pids, 5) == []
    assert runner.spares().pids() == []


EXITING = """
import os, sys, time
sys.path.insert(0, {root!r})
from diagnostics import runner
runner.keep_spares(1)
assert runner.spares().wait_ready(240)
print("SPARES", *runner.spares().pids(), flush=True)
if sys.argv[1] == "kill":
    os.kill(os.getpid(), 9)
"""


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_no_spare_outlives_the_process_that_kept_it(tmp_path, how):
    """At a normal exit (atexit closes the pool) and at a SIGKILL (PR_SET_PDEATHSIG kills the spare)."""
    script = tmp_path / "keeper.py"
    script.write_text(EXITING.format(root=str(ROOT)))
    env = {**os.environ, "TORCHSCOPE_SPARE_WORKERS": "1"}
    p = subprocess.run([sys.executable, str(script), how], capture_output=True, text=True, timeout=280, env=env)
    assert p.returncode == (-signal.SIGKILL if how == "kill" else 0), p.stderr[-2000:]
    pids = [int(x) for x in p.stdout.split("SPARES", 1)[1].split()]
    assert len(pids) == 1
    assert wait_gone(pids) == []


def test_the_setting_turns_spares_off_and_a_bad_value_names_itself(monkeypatch):
    monkeypatch.setenv("TORCHSCOPE_SPARE_WORKERS", "0")
    assert runner.keep_spares() == 0 and runner.spares().pids() == []
    monkeypatch.setenv("TORCHSCOPE_SPARE_WORKERS", "99")
    assert runner.spare_setting() == runner.MAX_SPARE_WORKERS
    monkeypatch.setenv("TORCHSCOPE_SPARE_WORKERS", "some")
    with pytest.raises(TorchScopeError, match=r"TORCHSCOPE_SPARE_WORKERS='some' must be a whole number"):
        runner.keep_spares()
