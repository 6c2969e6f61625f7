"""Jobs that time a device wait their turn; the store survives concurrent writers and dead owners."""

import dataclasses
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from diagnostics import registry
from diagnostics.runner import Job, run_job
from diagnostics.store import Store
from reliability_helpers import model_file, python_spec

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]


def _sleepy_spec(folder: Path, log: Path, seconds: float):
    """A model whose forward records when it runs (wall clock, in the worker) and sleeps."""
    forward = f"""
        with open({str(log)!r}, "a") as f:
            f.write(f"start {{time.time()}}\\n")
        time.sleep({seconds})
        with open({str(log)!r}, "a") as f:
            f.write(f"end {{time.time()}}\\n")
        return self.lin(x)
    """
    return python_spec(model_file(folder, "sleepy.py", forward, "import time"))


def _intervals(log: Path) -> list[tuple[float, float]]:
    lines = [line.split() for line in log.read_text().splitlines()]
    starts = sorted(float(t) for k, t in lines if k == "start")
    ends = sorted(float(t) for k, t in lines if k == "end")
    return list(zip(starts, ends))


def _two_at_once(store, spec) -> list[tuple]:
    """Start two validate jobs from two threads (like two browser sessions); return (outcome, messages)."""
    results = [None, None]
    gate = threading.Barrier(2)

    def session(i):
        messages = []
        gate.wait()
        out = run_job(Job("validate", spec), store=store, timeout_s=60, on_progress=lambda f, m: messages.append(m))
        results[i] = (out, messages)

    threads = [threading.Thread(target=session, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    return results


def test_exclusive_jobs_take_turns_on_a_device_and_the_waiting_one_is_queued(tmp_path, monkeypatch):
    # The model logs its forward's wall clock to a file of the test's: outside what the job sandbox
    # lets a job write (tests/reliability/test_sandbox.py covers that), so the sandbox is off here.
    monkeypatch.setenv("TORCHSCOPE_SANDBOX", "0")
    # The parent decides exclusivity (the worker only looks the function up), so marking the
    # validate analysis exclusive here is enough to put it through the device queue.
    store = Store(tmp_path / "data")
    log = tmp_path / "forward.log"
    spec = _sleepy_spec(tmp_path, log, 1.5)

    # Control: not exclusive, the two forwards overlap in time.
    results = _two_at_once(store, spec)
    assert all(out.ok for out, _ in results), [out.error for out, _ in results]
    (s1, e1), (s2, e2) = _intervals(log)
    assert s2 < e1, "control failed: non-exclusive jobs did not run concurrently, so this test proves nothing"
    assert not any(m.startswith("queued") for _, msgs in results for m in msgs)

    log.unlink()
    monkeypatch.setitem(registry.ANALYSES, "validate", dataclasses.replace(registry.ANALYSES["validate"],
                                                                           exclusive=True))
    results = _two_at_once(store, spec)
    assert all(out.ok for out, _ in results), [out.error for out, _ in results]
    (s1, e1), (s2, e2) = _intervals(log)
    assert s2 >= e1, f"exclusive jobs overlapped: second started {e1 - s2:.2f} s before the first ended"
    queued = [msgs for _, msgs in results if any(m.startswith("queued: another job is timing cpu") for m in msgs)]
    assert len(queued) == 1, "exactly one session must have been told it is queued"
    assert all(store.get(out.run_id).status == "ok" for out, _ in results)


_WRITER = """
import sys
from diagnostics.store import Store
store = Store(sys.argv[1])
w = int(sys.argv[2])
for i in range(200):
    rid = store.create_run("summary", spec={"writer": w}, options={"i": i}, cache_key=f"{w}-{i}",
                           model_label=f"writer {w}", device="cpu", source="test")
    store.finish_run(rid, "ok", result={"metrics": {"i": i, "writer": w}, "rows": list(range(50))})
"""


def test_two_processes_writing_at_once_lose_nothing(tmp_path):
    Store(tmp_path)  # create the schema first, as a dashboard would
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path), str(w)], cwd=ROOT,
                              stderr=subprocess.PIPE, text=True) for w in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=90)
        assert p.returncode == 0, err
    store = Store(tmp_path)
    assert store.count() == 400
    runs = store.list(limit=1000)
    assert {r.status for r in runs} == {"ok"}
    seen = {(r.metrics["writer"], r.metrics["i"]) for r in runs}
    assert seen == {(w, i) for w in range(2) for i in range(200)}
    some = store.find_cached("1-137")
    assert some.result == {"metrics": {"i": 137, "writer": 1}, "rows": list(range(50))}


_DASHBOARD = """
import sys
from diagnostics import ModelSpec
from diagnostics.runner import Job, run_job
from diagnostics.store import Store
run_job(Job("validate", ModelSpec(source="python", name="sleepy.py", path=sys.argv[2])), store=Store(sys.argv[1]),
        timeout_s=120)
"""


def test_a_dashboard_killed_mid_job_leaves_a_row_that_the_next_start_marks_interrupted(tmp_path):
    data = tmp_path / "data"
    store = Store(data)
    spec = _sleepy_spec(tmp_path, tmp_path / "forward.log", 120)
    mine = store.create_run("summary", spec=None, options={}, cache_key=None, model_label=None, device="cpu")
    # sandbox off: the model logs to a file of the test's (see the queue test above)
    dash = subprocess.Popen([sys.executable, "-c", _DASHBOARD, str(data), spec.path], cwd=ROOT,
                            env=dict(os.environ, TORCHSCOPE_SANDBOX="0"))
    try:
        deadline = time.monotonic() + 60
        worker = None
        while time.monotonic() < deadline and worker is None:
            with sqlite3.connect(store.db_path) as db:
                row = db.execute("SELECT pid, owner_pid, id FROM runs WHERE id != ?", (mine,)).fetchone()
            if row and row[0] != row[1] and (tmp_path / "forward.log").exists():
                worker, owner, rid = row
            time.sleep(0.2)
        assert worker is not None, "the job never reached its forward pass"
        assert owner == dash.pid and psutil.pid_exists(worker)
        os.kill(dash.pid, signal.SIGKILL)
        dash.wait(10)
        # the worker dies with its dashboard (PR_SET_PDEATHSIG), not 120 s later
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and psutil.pid_exists(worker):
            time.sleep(0.1)
        assert not psutil.pid_exists(worker), "the worker outlived its dashboard"
        assert store.get(rid).status == "running"
        assert Store(data).mark_interrupted() == 1
        rec = store.get(rid)
        assert rec.status == "interrupted" and "stopped before it finished" in rec.error and rec.result is None
        assert store.get(mine).status == "running", "a run owned by a live process must be left alone"
    finally:
        if dash.poll() is None:
            dash.kill()


def test_a_reused_pid_does_not_keep_a_dead_run_alive(tmp_path):
    store = Store(tmp_path)
    boot = psutil.Process(1).create_time()
    # Both runs name pid 1 as owner. One "started" an hour before pid 1 existed: pid 1 is a reuse of
    # its dead owner's pid, so the run is stale. The other started now: pid 1 may well own it.
    stale = store.create_run("summary", spec=None, options={}, cache_key=None, model_label=None, device="cpu", pid=1)
    live = store.create_run("summary", spec=None, options={}, cache_key=None, model_label=None, device="cpu", pid=1)
    with sqlite3.connect(store.db_path) as db:
        db.execute("UPDATE runs SET started=? WHERE id=?", (boot - 3600, stale))
    assert store.mark_interrupted() == 1
    assert store.get(stale).status == "interrupted" and store.get(live).status == "running"


def test_an_old_store_without_owner_pid_is_upgraded(tmp_path):
    db_path = tmp_path / "runs.sqlite"
    with sqlite3.connect(db_path) as db:
        db.executescript("""CREATE TABLE runs (id TEXT PRIMARY KEY, analysis TEXT NOT NULL, status TEXT NOT NULL,
            cache_key TEXT, model_label TEXT, spec_json TEXT, options_json TEXT, device TEXT, source TEXT,
            pid INTEGER, started REAL NOT NULL, finished REAL, duration_s REAL, metrics_json TEXT,
            result_json TEXT, error TEXT, artifacts_json TEXT);""")
        db.execute("INSERT INTO runs (id, analysis, status, pid, started) VALUES ('old', 'summary', 'running', ?, ?)",
                   (2**22 + 7, time.time()))
    store = Store(tmp_path)
    assert store.mark_interrupted() == 1 and store.get("old").status == "interrupted"
    rid = store.create_run("summary", spec=None, options={}, cache_key=None, model_label=None, device="cpu")
    assert store.get(rid).status == "running"
