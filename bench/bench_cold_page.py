"""The Model page in a real browser against a bare `python -c "import torch"`, in the same run.

Each round runs, in an order that turns by one place per round (so the machine's load hits all
alike): the reference (a bare ``python -c "import torch"``, twice: the second is the A/A control
that says how far two runs of the same thing differ), and three dashboards, each with a fresh data
folder (the run store cannot serve the summary) and a new headless-Chromium session:

* **first session, `make run`**: ``python -m ui.launch`` (the launcher ``make run`` uses: the spare
  worker starts with the server); the browser opens the Model page the moment the server answers
  its health check;
* **new session on a running server, `make run`**: the same launcher; an earlier visitor opened
  History (no job) and left, and the new session comes once the server is idle (the spare's CPU time
  stopped growing);
* **first session, plain `streamlit run app.py`** (no launcher: the spare starts with the first
  session, the server imports the pages then): what the launcher saves, in the same rounds.

The cold page is the time from the navigation to the summary's "cnn (sample) · ..." line on
screen. Then, on that session, SWITCHES cached page switches: History, then a click on Model in the
sidebar; each is timed in the page itself, from the click event to the first animation frame that
shows the Model page's summary (title "Model", no "History" title, the summary's caption), and to
the frame after which the script run has ended (all of the page drawn). The driver's time for the
same click (Playwright's click with its actionability waits, then its polling for the caption under
the Model title) is kept beside it: earlier versions of this benchmark reported that, and it
matched the caption of the summary that History itself shows.

After each server stopped, none of its processes (spares included) may be left. Prints the table;
``--write`` also puts it into docs/BENCHMARKS.md ("Cold page", between its markers), with the
command, the machine and the load averages.

    .venv/bin/python bench/bench_cold_page.py [--rounds 4] [--switches 4] [--write] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "BENCHMARKS.md"
BEGIN, END = "<!-- bench_cold_page: begin -->", "<!-- bench_cold_page: end -->"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SUMMARY = re.compile(r"^cnn \(sample\) · ")
SPARE_NAME = "tscope-spare"  # diagnostics.runner.SPARE_NAME (not imported: this process stays torch-free)
STREAMLIT_ARGS = ["--server.headless", "true", "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false",
                  "--server.fileWatcherType", "none"]

# Installed before the click: times it in the page, from the click event on the Model link to the
# first animation frame showing the Model page's summary, then to the first with the run ended.
WATCH_SWITCH = r"""() => {
  const w = window.__switch = {t0: null, shown: null, done: null};
  document.addEventListener('click', (e) => {
    if (w.t0 === null && e.target.closest('[data-testid="stSidebarNav"] a')) w.t0 = performance.now();
  }, {capture: true});
  const shown = () => {
    const h1 = [...document.querySelectorAll('h1')].map(h => h.innerText.trim());
    if (!h1.includes('Model') || h1.includes('History')) return false;
    return [...document.querySelectorAll('[data-testid="stCaptionContainer"]')]
      .some(e => e.innerText.startsWith('cnn (sample) · '));
  };
  const tick = () => {
    const now = performance.now();
    if (w.t0 !== null && w.shown === null && shown()) w.shown = now;
    if (w.shown !== null) {
      const app = document.querySelector('[data-testid="stApp"]');
      if (app && app.getAttribute('data-test-script-state') !== 'running') { w.done = now; return; }
    }
    requestAnimationFrame(tick);
  };
  requestAnimationFrame(tick);
}"""


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def torch_import_s() -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    return time.perf_counter() - t


class Server:
    """A dashboard on ``port`` with a fresh data folder: ``launcher`` = ``python -m ui.launch`` (make run),
    else ``streamlit run app.py``. Ready once its health check answers."""

    def __init__(self, port: int, launcher: bool):
        self.data = Path(tempfile.mkdtemp(prefix="cold_page_bench_"))
        env = {**os.environ, "TORCHSCOPE_DATA_DIR": str(self.data), "PYTHONUNBUFFERED": "1"}
        env.pop("TORCHSCOPE_SPARE_WORKERS", None)
        self.log_path = self.data / "server.log"
        self.log = open(self.log_path, "w")
        cmd = ([sys.executable, "-m", "ui.launch"] if launcher else [sys.executable, "-m", "streamlit", "run", "app.py"])
        self.proc = subprocess.Popen(cmd + ["--server.port", str(port)] + STREAMLIT_ARGS, cwd=ROOT, env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(self.url + "/_stcore/health", timeout=2) as r:
                    if r.read().decode().strip() == "ok":
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the dashboard did not start:\n" + self.log_path.read_text()[-3000:])
            time.sleep(0.05)

    def spare_import_s(self) -> float | None:
        """The first job's worker.log says how long its spare's imports took (None: not a warm spare)."""
        logs = sorted((self.data / "artifacts").glob("*/worker.log"), key=lambda p: p.stat().st_mtime)
        for path in logs[:1]:
            m = re.search(r"imports took ([0-9.]+) s", path.read_text(errors="replace")[:600])
            if m:
                return float(m.group(1))
        return None

    def settle(self, cap_s: float = 120.0) -> float:
        """Wait until the spare has finished its imports (its CPU time stops growing for 1 s); returns
        the seconds waited."""
        t = time.monotonic()
        last, still = None, 0
        while time.monotonic() - t < cap_s:
            try:
                kids = [c for c in psutil.Process(self.proc.pid).children(recursive=True) if c.name() == SPARE_NAME]
                cpu = sum(sum(c.cpu_times()[:2]) for c in kids) if kids else None
            except psutil.Error:
                cpu = None
            if cpu is not None and cpu == last:
                still += 1
                if still >= 4:
                    break
            else:
                still = 0
            last = cpu
            time.sleep(0.25)
        return time.monotonic() - t

    def stop(self) -> int:
        """Stop the server; returns how many of its processes were still alive 5 s later (should be 0)."""
        try:
            tree = [psutil.Process(self.proc.pid)] + psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            tree = []
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            if self.proc.poll() is None:
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    pass
                try:
                    self.proc.wait(wait)
                except subprocess.TimeoutExpired:
                    pass
        self.log.close()
        deadline = time.monotonic() + 5
        while True:
            left = [p for p in tree if _alive(p)]
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        shutil.rmtree(self.data, ignore_errors=True)
        return len(left)


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _nav(page, name: str):
    return page.locator('[data-testid="stSidebarNav"] a').filter(has_text=name)


def cached_switches(page, n: int) -> list[tuple[float, float, float]]:
    """``n`` times: History, then Model; (shown, complete, driver) seconds each."""
    out = []
    for _ in range(n):
        _nav(page, "History").click()
        page.get_by_role("heading", name="History", exact=True).wait_for()
        page.wait_for_function("() => document.querySelector('[data-testid=\"stApp\"]')"
                               ".getAttribute('data-test-script-state') !== 'running'")
        page.wait_for_timeout(500)
        page.evaluate(WATCH_SWITCH)
        t = time.perf_counter()
        _nav(page, "Model").click()
        page.get_by_role("heading", name="Model", exact=True, level=1).wait_for()
        page.get_by_text(SUMMARY).wait_for()
        driver = time.perf_counter() - t
        page.wait_for_function("() => window.__switch.done !== null", timeout=60_000)
        w = page.evaluate("() => window.__switch")
        out.append(((w["shown"] - w["t0"]) / 1000, (w["done"] - w["t0"]) / 1000, driver))
    return out


def one_case(browser, port: int, launcher: bool, running: bool, switches: int) -> dict:
    server = Server(port, launcher)
    row = {"idle_s": 0.0}
    try:
        if running:  # an earlier visitor, on a page that runs no job
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            page = context.new_page()
            page.set_default_timeout(180_000)
            page.goto(server.url + "/history")
            page.get_by_role("heading", name="History", exact=True).wait_for()
            context.close()
            row["idle_s"] = server.settle()
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        page = context.new_page()
        page.set_default_timeout(180_000)
        t = time.perf_counter()
        page.goto(server.url, wait_until="commit")
        page.get_by_text(SUMMARY).wait_for()
        row["cold_s"] = time.perf_counter() - t
        row["spare_import_s"] = server.spare_import_s()
        row["switches"] = cached_switches(page, switches)
        context.close()
    finally:
        row["left"] = server.stop()
    return row


CASES = {  # name: (launcher, running server)
    "first_launch": (True, False),
    "running_launch": (True, True),
    "first_plain": (False, False),
}
LABELS = {
    "first_launch": "first session of a just-started server, `make run` (python -m ui.launch)",
    "running_launch": "new session on a running server, `make run`",
    "first_plain": "first session of a just-started server, plain `streamlit run app.py` (before)",
}
REFS = ("torch", "torch_aa")


def run(rounds: int, switches: int, port: int) -> dict:
    from playwright.sync_api import sync_playwright

    order = list(REFS) + list(CASES)
    rows: dict[str, list] = {k: [] for k in order}
    loads = [load()]
    left = 0
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            for r in range(rounds):
                turn = order[r % len(order):] + order[:r % len(order)]
                for name in turn:
                    if name in REFS:
                        rows[name].append(torch_import_s())
                    else:
                        res = one_case(browser, port, *CASES[name], switches)
                        left += res["left"]
                        rows[name].append(res)
                loads.append(load())
                print(f"round {r + 1}: import torch {rows['torch'][-1]:.2f} s (A/A {rows['torch_aa'][-1]:.2f} s) · "
                      + " · ".join(f"{n} {rows[n][-1]['cold_s']:.2f} s (switch shown "
                                   f"{statistics.median(s[0] for s in rows[n][-1]['switches']):.2f} s)" for n in CASES)
                      + f" · load {loads[-1]}", flush=True)
        finally:
            browser.close()
    return summarize(rows, loads, left, rounds, switches)


def _q(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summarize(rows: dict, loads: list[str], left: int, rounds: int, switches: int) -> dict:
    torch_med = statistics.median(rows["torch"])
    out = {"rounds": rounds, "switches_per_session": switches, "raw": rows, "loads": loads, "processes_left": left,
           "cpus": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version(),
           "torch": _q(rows["torch"]), "torch_aa": _q(rows["torch_aa"]),
           "aa_ratio": statistics.median(rows["torch_aa"]) / torch_med, "cases": {}}
    for name in CASES:
        res = rows[name]
        cold = [r["cold_s"] for r in res]
        sw = [s for r in res for s in r["switches"]]
        spare = [r["spare_import_s"] for r in res if r["spare_import_s"] is not None]
        out["cases"][name] = {
            "cold": _q(cold), "ratio": statistics.median(cold) / torch_med,
            "ratio_per_round": [c / t for c, t in zip(cold, rows["torch"])],
            "shown": _q([s[0] for s in sw]), "complete": _q([s[1] for s in sw]), "driver": _q([s[2] for s in sw]),
            "spare_import": _q(spare) if spare else None,
            "idle": _q([r["idle_s"] for r in res]),
        }
    return out


def table(res: dict) -> str:
    def cell(q: dict | None) -> str:
        return "" if not q else f"{q['median']:.2f} s ({q['min']:.2f}-{q['max']:.2f})"

    torch_med = res["torch"]["median"]
    lines = ["| cold Model page | median (range) | / bare import | its spare's imports | / bare import | goal |",
             "|---|---|---|---|---|---|",
             f"| bare `python -c \"import torch\"` (the reference) | {cell(res['torch'])} |  |  |  |  |",
             f"| the same again (A/A control) | {cell(res['torch_aa'])} | {res['aa_ratio']:.2f}x |  |  | 1.00x |"]
    for name, c in res["cases"].items():
        spare = c["spare_import"]
        lines.append(f"| {LABELS[name]} | {cell(c['cold'])} | **{c['ratio']:.2f}x** | {cell(spare)} | "
                     + (f"{spare['median'] / torch_med:.2f}x" if spare else "not a warm spare")
                     + f" | {'' if name == 'first_plain' else '<= 1.5x'} |")
    lines += ["", "| cached switch History -> Model, same sessions | summary shown | whole page drawn | "
                  "driver's time (Playwright) | goal |", "|---|---|---|---|---|"]
    for name, c in res["cases"].items():
        lines.append(f"| {LABELS[name]} | **{cell(c['shown'])}** | {cell(c['complete'])} | {cell(c['driver'])} | "
                     f"< 0.5 s (shown) |")
    return "\n".join(lines)


def report(res: dict) -> str:
    cmd = f".venv/bin/python bench/bench_cold_page.py --rounds {res['rounds']} --switches {res['switches_per_session']}"
    return (f"Command: `{cmd}`, {time.strftime('%Y-%m-%d %H:%M')}; {res['machine']}, {res['cpus']} cores, "
            f"Python {res['python']}; {res['rounds']} rounds, {res['switches_per_session']} cached switches per "
            f"session. Load averages (1, 5, 15 min) before and after each round: {' | '.join(res['loads'])}. "
            f"Processes left after the servers stopped: {res['processes_left']}.\n\n" + table(res) + "\n")


def write_doc(text: str) -> None:
    doc = DOC.read_text()
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"{DOC} has no {BEGIN} ... {END} block to replace")
    head, rest = doc.split(BEGIN, 1)
    DOC.write_text(head + BEGIN + "\n" + text + rest[rest.index(END):])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--switches", type=int, default=4, help="cached page switches per session")
    ap.add_argument("--port", type=int, default=8711)
    ap.add_argument("--json", type=Path, help="also write the raw figures here")
    ap.add_argument("--write", action="store_true", help=f"write the results into {DOC.name} (between its markers)")
    args = ap.parse_args(argv)
    res = run(args.rounds, args.switches, args.port)
    text = report(res)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    if args.write:
        write_doc(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
