"""End to end in a real browser: the dashboard as `make run` starts it (`python -m ui.launch`, which is
`streamlit run app.py` started warm) driven by headless Chromium (Playwright).

Path: pick a sample model -> the Model page shows its parameters -> run a profile -> the charts
are drawn -> download the Chrome trace and parse it -> History lists the runs. A second test
uploads a Python-file model that hangs, presses Cancel and checks that the worker is gone, the
run is stored as 'cancelled' and the page offers "Run again" instead of restarting the job. A third
starts a profile, opens History while it runs and comes back to the finished profile (leaving a page
does not cancel its job).
Screenshots of each page go to test-artifacts/screenshots/. Uses Debian's /usr/bin/chromium
(never `playwright install`); without it the tests skip, except under CI (env CI set): fail.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from playwright.sync_api import expect

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
SHOTS = ROOT / "test-artifacts" / "screenshots"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
JOB_TIMEOUT_MS = 300_000  # the machine running the tests may be busy

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]


def _need_chromium() -> None:
    if not Path(CHROMIUM).exists():
        message = f"{CHROMIUM} is missing: install Debian's chromium (make chromium)"
        if os.environ.get("CI"):
            pytest.fail(message + "; CI must run the browser test")
        pytest.skip(message)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real dashboard on a free port, with its own data folder; killed (with its workers) after."""
    _need_chromium()
    data = tmp_path_factory.mktemp("e2e-data")
    port = _free_port()
    log = open(data / "server.log", "w")
    env = {**os.environ, "TORCHSCOPE_DATA_DIR": str(data), "PYTHONUNBUFFERED": "1"}
    env.pop("TORCHSCOPE_SAFE_MODE", None)
    env.pop("TORCHSCOPE_SPARE_WORKERS", None)  # the dashboard's default: a spare worker waits for each job
    proc = subprocess.Popen(
        [sys.executable, "-m", "ui.launch", "--server.port", str(port), "--server.headless", "true",  # make run's way
         "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false",
         "--server.fileWatcherType", "none"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(url + "/_stcore/health", timeout=2) as r:
                    if r.read().decode().strip() == "ok":
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"streamlit did not start:\n{(data / 'server.log').read_text()[-3000:]}")
            time.sleep(0.3)
        yield {"url": url, "data": data, "proc": proc}
    finally:
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    pass
                try:
                    proc.wait(wait)
                except subprocess.TimeoutExpired:
                    pass
        log.close()


@pytest.fixture
def page(server, request):
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
            pg = context.new_page()
            pg.set_default_timeout(120_000)
            pg.goto(server["url"])
            yield pg
            if getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed:
                shot(pg, f"failed-{request.node.name}")
        finally:
            browser.close()


def shot(page, name: str) -> None:
    page.wait_for_timeout(500)  # let charts finish their transition
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def choose(page, label: str, option: str) -> None:
    """Pick ``option`` in the Streamlit selectbox labelled ``label``."""
    page.get_by_role("combobox", name=label, exact=True).click()
    page.get_by_role("option", name=option, exact=True).click()


def wait_idle(page, timeout_s: float = 120) -> None:
    """Until the script run in progress (the toolbar's running icon) has finished."""
    page.wait_for_timeout(300)
    page.locator('[data-testid="stStatusWidgetRunningIcon"]').wait_for(state="detached", timeout=timeout_s * 1000)


def upload(page, path: Path) -> None:
    """Put a file into the sidebar's model uploader; retried when a rerun swallowed the upload."""
    for _ in range(3):
        wait_idle(page)
        page.locator('[data-testid="stFileUploaderDropzoneInput"]').first.set_input_files(str(path))
        try:
            page.locator('[data-testid="stSidebar"]').get_by_text(path.name, exact=True).wait_for(timeout=20_000)
            return
        except Exception as e:  # playwright's TimeoutError; imported lazily like the rest of playwright
            if type(e).__name__ != "TimeoutError":
                raise
            continue
    raise AssertionError(f"the uploader never showed {path.name}")


def open_page(page, title: str) -> None:
    page.locator('[data-testid="stSidebarNav"] a').filter(has_text=title).click()
    page.get_by_role("heading", name=title, exact=True).wait_for()


def runs(data: Path) -> list[dict]:
    db = data / "runs.sqlite"
    if not db.exists():
        return []
    with sqlite3.connect(db) as c:
        c.row_factory = sqlite3.Row
        return [dict(r) for r in c.execute("SELECT * FROM runs ORDER BY started")]


def live_workers(server_pid: int) -> list[psutil.Process]:
    out = []
    for child in psutil.Process(server_pid).children(recursive=True):
        try:
            # A job's processes left the server's session (its guardian calls setsid); a spare
            # worker waiting for the next job has not, and runs none.
            if "spawn_main" in " ".join(child.cmdline()) and child.status() != psutil.STATUS_ZOMBIE \
                    and os.getsid(child.pid) != server_pid:
                out.append(child)
        except (psutil.Error, ProcessLookupError):
            pass
    return out


def test_sample_model_profile_and_trace_download(server, page, tmp_path):
    from diagnostics.units import human_count

    # Pick a sample other than the default, so the pick itself is what the page shows.
    choose(page, "Sample model", "mlp")
    page.get_by_text(re.compile(r"^mlp \(sample\) · MLP · inputs")).wait_for(timeout=JOB_TIMEOUT_MS)
    page.locator('[data-testid="stDataFrame"]').first.wait_for()
    values = page.locator('[data-testid="stMetricValue"]').all_inner_texts()
    params = 64 * 128 + 128 + 128 * 128 + 128 + 128 * 10 + 10
    assert values[0].strip() == human_count(params), values
    shot(page, "01-model")

    open_page(page, "Profiler")
    page.get_by_role("button", name=re.compile("Run profile")).click()
    page.locator(".js-plotly-plot").first.wait_for(timeout=JOB_TIMEOUT_MS)
    page.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length > 0")
    assert not page.locator('[data-testid="stException"]').count()
    shot(page, "02-profiler")

    page.get_by_role("tab", name="Trace files").click()
    button = page.locator('[data-testid="stDownloadButton"] button').filter(has_text="Chrome trace (.json) ·")
    button.wait_for()
    shot(page, "03-profiler-trace-files")
    with page.expect_download() as info:
        button.click()
    path = tmp_path / "trace.json"
    info.value.save_as(path)
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    assert isinstance(events, list) and len(events) > 10
    assert any(e.get("ph") == "X" and e.get("cat") == "cpu_op" for e in events)

    open_page(page, "History")
    page.locator('[data-testid="stDataFrame"]').first.wait_for()
    shot(page, "04-history")
    stored = {(r["analysis"], r["status"]) for r in runs(server["data"]) if r["model_label"] == "mlp (sample)"}
    assert {("summary", "ok"), ("profile", "ok")} <= stored


def test_every_page_renders_in_the_frame_and_is_screenshotted(server, page):
    """Each page of the navigation opens inside app.py's frame without an exception; the pages that
    compute on open (Memory, Gradient flow, Trace explorer) draw their charts; the Checklist runs."""
    page.locator('[data-testid="stDataFrame"]').first.wait_for(timeout=JOB_TIMEOUT_MS)  # Model, default sample
    for n, (title, ready) in enumerate([
        ("Memory", "What holds the training-step peak"),
        ("Gradient flow", "Layers flagged"),
        ("Checklist", "No checklist yet"),
        ("Optimize", "Run trials"),
        ("Trace explorer", "Open from"),
        ("Distributed", "Launch with torchrun"),
        ("Run a script", "Give the command and press Run"),
    ], start=7):
        open_page(page, title)
        page.get_by_text(ready).first.wait_for(timeout=JOB_TIMEOUT_MS)
        wait_idle(page, JOB_TIMEOUT_MS / 1000)
        if title == "Checklist":
            page.get_by_role("button", name=re.compile("Run checklist")).click()
            page.get_by_text("Checklist score").first.wait_for(timeout=JOB_TIMEOUT_MS)
            wait_idle(page, JOB_TIMEOUT_MS / 1000)
        assert not page.locator('[data-testid="stException"]').count(), title
        assert page.locator('[data-testid="stSidebar"]').get_by_text("Sample model").count()  # the shared frame
        shot(page, f"{n:02d}-{title.lower().replace(' ', '-')}")


HANGING_MODEL = """
import time
import torch
from torch import nn

class Sleepy(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        if torch.is_grad_enabled():  # the summary's training step; the load check runs without grad
            print("SLEEPY-FORWARD", flush=True)  # into the run's worker.log: the sandbox lets a job write no other file
            time.sleep(300)
        return self.lin(x)


def build_model():
    return Sleepy()


def example_inputs():
    return (torch.ones(2, 4),)
"""


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_cancel_stops_the_worker_and_the_page_offers_run_again(server, page, tmp_path):
    model = tmp_path / "sleepy_model.py"
    model.write_text(HANGING_MODEL)
    data = server["data"]

    def forwards() -> int:
        """Forward passes the model reported, over every run's worker.log."""
        return sum(p.read_text(errors="replace").count("SLEEPY-FORWARD")
                   for p in (data / "artifacts").glob("*/worker.log"))

    page.get_by_text("Upload a file", exact=True).click()
    choose(page, "File kind", "Python file with build_model() and example_inputs()")
    upload(page, model)
    page.get_by_role("button", name="Load model").click()
    page.get_by_text("Loaded sleepy_model.py").wait_for(timeout=JOB_TIMEOUT_MS)

    def running_summary():
        rows = [r for r in runs(data) if r["analysis"] == "summary" and r["model_label"]
                and "sleepy_model.py" in r["model_label"] and r["status"] == "running"]
        return rows[-1] if rows and rows[-1]["pid"] != rows[-1]["owner_pid"] else None

    for attempt in range(2):  # Cancel, then Run again, then Cancel again
        row = _wait(running_summary, 120, "the summary job to start its worker")
        _wait(lambda: forwards() == attempt + 1, 120, "the model's forward pass")
        worker = row["pid"]
        assert psutil.pid_exists(worker)
        page.get_by_text("Model summary: running").wait_for()
        if attempt == 0:
            shot(page, "05-model-running")
        page.get_by_role("button", name="Cancel").click()

        page.get_by_text("Model summary: cancelled").wait_for(timeout=JOB_TIMEOUT_MS)
        page.get_by_text("you cancelled this job").wait_for()
        final = _wait(lambda: [r for r in runs(data) if r["id"] == row["id"] and r["status"] != "running"], 60,
                      "the run to be finished in the store")[0]
        assert final["status"] == "cancelled" and final["error"].startswith("cancelled:")
        _wait(lambda: not psutil.pid_exists(worker) or psutil.Process(worker).status() == psutil.STATUS_ZOMBIE,
              30, "the worker to exit")
        assert not live_workers(server["proc"].pid), "a worker process is still running after Cancel"
        # The rerun shows "cancelled"; it does not start the same job again by itself.
        page.wait_for_timeout(2000)
        assert running_summary() is None and forwards() == attempt + 1
        if attempt == 0:
            shot(page, "06-model-cancelled")
            page.get_by_role("button", name="Run again").click()
    assert [r["status"] for r in runs(data) if r["analysis"] == "summary"
            and "sleepy_model.py" in (r["model_label"] or "")] == ["cancelled", "cancelled"]


def test_a_profile_runs_on_while_another_page_is_open(server, page):
    """Leaving a page does not cancel its job: start a profile, open another page, come back to the
    finished profile; the store has it as 'ok', never 'cancelled'."""
    data = server["data"]
    choose(page, "Sample model", "cnn")
    page.get_by_text(re.compile(r"^cnn \(sample\) · ")).wait_for(timeout=JOB_TIMEOUT_MS)  # the Model page's summary
    open_page(page, "Profiler")
    page.get_by_role("spinbutton", name="Latency timed iterations").fill("300")  # long enough to leave it running
    page.keyboard.press("Enter")
    wait_idle(page)
    page.get_by_role("button", name=re.compile("Run profile")).click()
    page.get_by_text(re.compile(r"^Profiler: (starting|running)")).wait_for()
    page.get_by_text("you may open other pages and come back").wait_for()

    def profiles() -> list[dict]:
        return [r for r in runs(data) if r["analysis"] == "profile" and r["model_label"] == "cnn (sample)"]

    row = _wait(lambda: [r for r in profiles() if r["status"] == "running"], 60, "the profile to be running")[0]
    shot(page, "20-profile-running")

    open_page(page, "History")  # the Profiler's script run ends here; its job goes on
    shot(page, "21-history-while-profiling")
    done = _wait(lambda: [r for r in profiles() if r["id"] == row["id"] and r["status"] != "running"],
                 JOB_TIMEOUT_MS / 1000, "the profile to finish while its page is closed")[0]
    assert done["status"] == "ok", done["error"]

    open_page(page, "Profiler")
    # kept (read once the page's rerun has drawn it: on a loaded machine the first paint may still be going)
    expect(page.get_by_role("spinbutton", name="Latency timed iterations")).to_have_value("300", timeout=60_000)
    page.locator(".js-plotly-plot").first.wait_for(timeout=JOB_TIMEOUT_MS)
    assert page.locator('[data-testid="stMetricLabel"]').filter(has_text="Median latency").count()
    assert not page.get_by_text("No profile yet").count()
    assert not page.locator('[data-testid="stException"]').count()
    shot(page, "22-profile-back-and-done")
    assert [r["status"] for r in profiles()] == ["ok"]
