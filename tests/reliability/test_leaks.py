"""No process outlives its job: a model's children are gone after the job ends, crashes, times out,
is cancelled, and after the CLI running it is killed with SIGKILL.

The model starts three ``sleep`` processes from its forward: a plain child, one in a new session
(``start_new_session``: out of the worker's process group), and an orphan (started by a shell that
exits at once, so it is re-parented). Their command lines carry a token of the test's, by which the
tests find them among the machine's processes (in a PID namespace of its own, the pids a job sees
are not the machine's); it also says on its log that they started.
"""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from diagnostics.runner import Job, run_job
from diagnostics.store import Store
from reliability_helpers import model_file, python_spec

pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parents[2]

SPAWN = """
plain = subprocess.Popen(["sleep", "300.TOKEN"])
session = subprocess.Popen(["sleep", "301.TOKEN"], start_new_session=True)
shell = subprocess.Popen(["sh", "-c", "sleep 302.TOKEN >/dev/null 2>&1 & echo $!"], stdout=subprocess.PIPE)
orphan = int(shell.stdout.readline())
shell.wait()
print(f"CHILDREN {plain.pid} {session.pid} {orphan}", flush=True)
"""
THEN = {
    "return": "return self.lin(x)",
    "crash": "os.kill(os.getpid(), signal.SIGKILL)",
    "hang": "time.sleep(600)",
}


TOKEN = str(os.getpid()).zfill(6)[-6:]  # in the children's command lines: sleep 300.<token>


def leaky_model(folder: Path, then: str) -> Path:
    return model_file(folder, f"leaky_{then}.py", SPAWN.replace("TOKEN", TOKEN) + THEN[then],
                      "import os, signal, subprocess, time")


def child_pids(text: str) -> list[int]:
    """The machine's pids of the model's children, once it said they started (an analysis may run
    its forward more than once: every child carries the token)."""
    assert "CHILDREN " in text, f"the model did not report its children: {text[-2000:]}"
    return marked()


def marked() -> list[int]:
    """Live processes whose command line carries this run's token."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(a.endswith("." + TOKEN) for a in (p.info["cmdline"] or [])) and alive(p.pid):
                found.append(p.pid)
        except psutil.Error:
            pass
    return found


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def assert_gone(pids: list[int], within_s: float = 0.0) -> None:
    deadline = time.monotonic() + within_s
    while any(alive(p) for p in pids + marked()) and time.monotonic() < deadline:
        time.sleep(0.1)
    survivors = [(p, psutil.Process(p).cmdline()) for p in set(pids + marked()) if alive(p)]
    for p, _ in survivors:  # do not leak them into the rest of the test run
        os.kill(p, signal.SIGKILL)
    assert not survivors, f"processes outlived their job: {survivors}"


@pytest.mark.parametrize("then", ["return", "crash"])
def test_children_are_gone_when_the_job_ends(tmp_path, then):
    out = run_job(Job("validate", python_spec(leaky_model(tmp_path, then))), store=Store(tmp_path / "data"),
                  timeout_s=120)
    assert out.status == ("ok" if then == "return" else "crashed"), out.error
    assert_gone(child_pids(out.log_tail))  # at once: run_job has returned


def test_children_are_gone_after_a_timeout(tmp_path):
    out = run_job(Job("validate", python_spec(leaky_model(tmp_path, "hang"))), store=Store(tmp_path / "data"),
                  timeout_s=15)
    assert out.status == "timeout"
    assert_gone(child_pids(out.log_tail))


def test_children_are_gone_after_a_cancel(tmp_path):
    store = Store(tmp_path / "data")
    cancel = threading.Event()
    seen: list[int] = []

    def watch():  # cancel once the children are running
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not seen:
            for log in (tmp_path / "data" / "artifacts").glob("*/worker.log"):
                if "CHILDREN" in log.read_text(errors="replace"):
                    seen.extend(child_pids(log.read_text(errors="replace")))
            time.sleep(0.2)
        assert all(alive(p) for p in seen), "control: the children were running before the cancel"
        cancel.set()

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    out = run_job(Job("validate", python_spec(leaky_model(tmp_path, "hang"))), store=store, timeout_s=150,
                  cancel=cancel)
    t.join(5)
    assert out.status == "cancelled" and seen
    assert_gone(seen)


def test_children_are_gone_after_the_cli_is_killed_with_sigkill(tmp_path):
    data = tmp_path / "data"
    model = leaky_model(tmp_path, "hang")
    cli = subprocess.Popen([sys.executable, "-m", "diagnostics", "summary", "--model", str(model), "--data-dir",
                            str(data), "-q", "--no-report"], cwd=ROOT, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)})
    pids, worker = [], None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not pids:
        for log in data.glob("artifacts/*/worker.log"):
            text = log.read_text(errors="replace")
            if "CHILDREN" in text:
                pids = child_pids(text)
        time.sleep(0.2)
    assert pids, "the job never started its children"
    workers = [p.pid for p in psutil.Process(cli.pid).children(recursive=True)]
    assert workers and all(alive(p) for p in pids), "control: the job and its children run before the kill"
    cli.send_signal(signal.SIGKILL)
    cli.wait(10)
    assert_gone(pids + workers, within_s=10)
