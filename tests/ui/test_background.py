"""ui.background: jobs run in a server thread, outlive the code that started them, cancel on request,
and a session's jobs run one at a time, in order."""

import textwrap
import threading
import time

import psutil

from diagnostics import ModelSpec
from diagnostics.runner import CANCELLED_MESSAGE, Job, JobOutcome
from diagnostics.store import Store
from ui.background import CANCELLED_BEFORE_START, SHUTDOWN_MESSAGE, JobManager

HANGING_MODEL = """
import time, torch
from torch import nn
class Hang(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)
    def forward(self, x):
        if torch.is_grad_enabled():  # the summary's training step
            print("HANG-FORWARD", flush=True)
            time.sleep(600)
        return self.lin(x)
def build_model(): return Hang()
def example_inputs(): return (torch.zeros(1, 2),)
"""


def _until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _hanging_job(tmp_path) -> Job:
    py = tmp_path / "hang.py"
    py.write_text(textwrap.dedent(HANGING_MODEL))
    return Job("summary", ModelSpec(source="python", name="hang.py", path=str(py)))


def test_a_job_outlives_the_thread_that_started_it_and_is_stored(tmp_path):
    """What leaving a page does to a job: the script run that submitted it ends; the job goes on."""
    store, mgr = Store(tmp_path / "data"), JobManager()
    submitted = []
    script_run = threading.Thread(target=lambda: submitted.append(
        mgr.submit("s1", Job("summary", ModelSpec(name="mlp")), title="Model summary", store=store)))
    script_run.start()
    script_run.join()
    assert not script_run.is_alive()
    bj = submitted[0]
    assert not bj.done  # submit returned at once; the job runs in the manager's thread
    assert mgr.wait("s1", 120)
    out = bj.outcome
    assert out.ok, out.error
    assert out.result.metrics.params_total == 64 * 128 + 128 + 128 * 128 + 128 + 128 * 10 + 10
    assert store.get(out.run_id).status == "ok"
    assert [j.key for j in mgr.collect("s1")] == [bj.key]
    assert mgr.find("s1", bj.key) is None and mgr.collect("s1") == []  # collected once


def test_progress_is_readable_while_running_and_cancel_kills_the_worker(tmp_path):
    store, mgr = Store(tmp_path / "data"), JobManager()
    bj = mgr.submit("s1", _hanging_job(tmp_path), title="Model summary", store=store)
    assert mgr.submit("s1", _hanging_job(tmp_path), title="again", store=store) is bj  # no second job

    def forward_started():
        rows = [r for r in store.list(analysis="summary") if r.status == "running"]
        logs = list((tmp_path / "data" / "artifacts").glob("*/worker.log"))
        return rows and logs and "HANG-FORWARD" in logs[0].read_text(errors="replace")

    _until(forward_started, 120, "the model's forward pass")
    # The worker's progress, read from the record: the summary's last report before the training
    # step's forward pass, which hangs (it comes through a pipe: wait for it a moment).
    _until(lambda: bj.snapshot().message == "forward + backward FLOPs", 10, "the last progress report")
    snap = bj.snapshot()
    assert snap.state == "running" and not snap.done and snap.elapsed_s > 0 and snap.fraction == 0.6
    run = store.list(analysis="summary")[0]
    worker = __import__("sqlite3").connect(store.db_path).execute("SELECT pid FROM runs WHERE id=?",
                                                                   (run.id,)).fetchone()[0]
    assert psutil.pid_exists(worker)

    assert mgr.cancel("s1", bj.key)
    assert bj.snapshot().cancelling
    _until(lambda: bj.done, 30, "the cancelled job to end")
    out = bj.outcome
    assert out.status == "cancelled" and out.error == CANCELLED_MESSAGE
    rec = store.get(run.id)
    assert rec.status == "cancelled" and rec.error == CANCELLED_MESSAGE
    _until(lambda: not psutil.pid_exists(worker) or psutil.Process(worker).status() == psutil.STATUS_ZOMBIE,
           30, "the worker to exit")
    assert not mgr.cancel("s1", bj.key)  # nothing left to cancel


class FakeRun:
    """run_job's stand-in: each job blocks until released (or cancelled); records the order of events."""

    def __init__(self):
        self.events: list[str] = []
        self.release: dict[str, threading.Event] = {}
        self.lock = threading.Lock()

    def gate(self, name: str) -> threading.Event:
        with self.lock:
            return self.release.setdefault(name, threading.Event())

    def __call__(self, job, *, store, timeout_s, on_progress, cancel, on_partial):
        name = job.options["name"]
        self.events.append(f"start {name}")
        on_progress(0.5, f"halfway through {name}")
        on_partial({"rows": [f"first row of {name}"]})
        while not self.gate(name).wait(0.02):
            if cancel.is_set():
                self.events.append(f"cancel {name}")
                return JobOutcome("cancelled", error=getattr(cancel, "reason", None) or CANCELLED_MESSAGE)
        self.events.append(f"end {name}")
        return JobOutcome("ok", result={"name": name})


def _job(name: str, analysis: str = "trace") -> Job:
    return Job(analysis, None, {"name": name})


def test_a_sessions_jobs_queue_and_run_one_at_a_time_in_order():
    run = FakeRun()
    mgr = JobManager(run)
    a = mgr.submit("s1", _job("a"), title="A")
    b = mgr.submit("s1", _job("b"), title="B")
    c = mgr.submit("s1", _job("c"), title="C")
    other = mgr.submit("s2", _job("x"), title="X")  # another session: its own line, not behind A
    _until(lambda: a.snapshot().state == "running" and other.snapshot().state == "running", 5, "A and X to start")
    assert a.snapshot().message == "halfway through a"
    # what a running job measured so far is in its record (ctx.partial through run_job's on_partial)
    _until(lambda: a.snapshot().partial is not None, 5, "A's partial result")
    assert a.snapshot().partial == {"rows": ["first row of a"]}
    assert b.snapshot().state == c.snapshot().state == "queued" and b.snapshot().partial is None
    assert mgr.ahead_of(b) == [a] and mgr.ahead_of(c) == [a, b]
    assert mgr.pending("s1") == [a, b, c]

    assert mgr.cancel("s1", b.key)  # waiting: it leaves the line and never runs
    assert b.done and b.outcome.status == "cancelled" and b.outcome.error == CANCELLED_BEFORE_START
    for name in ("a", "c", "x"):
        run.gate(name).set()
    assert mgr.wait("s1", 5) and mgr.wait("s2", 5)
    mine = [e for e in run.events if not e.endswith("x")]
    assert mine == ["start a", "end a", "start c", "end c"]
    assert c.outcome.result == {"name": "c"}
    assert a.snapshot().partial is None  # done: the outcome, not the partial, is what is shown
    assert {j.key for j in mgr.collect("s1")} == {a.key, b.key, c.key}


def test_a_page_started_job_replaces_the_same_analysis_still_waiting():
    """Stepping a setting through several values on a page that computes on its own queues one job."""
    run = FakeRun()
    mgr = JobManager(run)
    first = mgr.submit("s1", _job("first", "profile"), title="Profile")  # running: goes on
    _until(lambda: first.snapshot().state == "running", 5, "the first job to start")
    waiting = [mgr.submit("s1", _job(f"m{i}", "memory"), title="Memory", replaceable=True) for i in range(3)]
    pressed = mgr.submit("s1", _job("pressed", "memory"), title="Memory")  # a button press: kept
    last = mgr.submit("s1", _job("m9", "memory"), title="Memory", replaceable=True)
    assert mgr.pending("s1") == [first, pressed, last]
    assert all(mgr.find("s1", j.key) is None for j in waiting)
    for name in ("first", "pressed", "m9"):
        run.gate(name).set()
    assert mgr.wait("s1", 5)
    assert run.events == ["start first", "end first", "start pressed", "end pressed", "start m9", "end m9"]


def test_shutdown_cancels_running_and_waiting_jobs_with_its_reason():
    run = FakeRun()
    mgr = JobManager(run)
    running = mgr.submit("s1", _job("a"), title="A")
    waiting = mgr.submit("s1", _job("b"), title="B")
    _until(lambda: running.snapshot().state == "running", 5, "A to start")
    mgr.shutdown(wait_s=5)
    assert running.outcome.status == "cancelled" and running.outcome.error == SHUTDOWN_MESSAGE
    assert waiting.outcome.status == "cancelled" and waiting.outcome.error == SHUTDOWN_MESSAGE
    assert run.events == ["start a", "cancel a"]


def test_a_job_whose_runner_raises_ends_as_an_error_not_running_forever():
    def broken(job, **kwargs):
        raise RuntimeError("disk on fire")

    mgr = JobManager(broken)
    bj = mgr.submit("s1", _job("a"), title="A")
    assert mgr.wait("s1", 5)
    assert bj.outcome.status == "error" and "disk on fire" in bj.outcome.error


def test_the_cancel_reason_reaches_the_stored_run(tmp_path):
    """diagnostics.runner stores the cancel event's reason (the dashboard's shutdown has its own)."""
    reason = SHUTDOWN_MESSAGE
    store, mgr = Store(tmp_path / "data"), JobManager()
    bj = mgr.submit("s1", _hanging_job(tmp_path), title="Model summary", store=store)
    _until(lambda: any("HANG-FORWARD" in p.read_text(errors="replace")
                       for p in (tmp_path / "data" / "artifacts").glob("*/worker.log")), 120, "the forward pass")
    mgr.cancel("s1", bj.key, reason)
    assert mgr.wait("s1", 30)
    assert store.get(bj.outcome.run_id).error == reason
