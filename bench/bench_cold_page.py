"""A cold session's Model page against a bare `python -c "import torch"`, in the same run.

Each round, in turn (so the machine's load hits all of them alike):

1. ``python -c "import torch"`` in a new process: its wall time;
2. for spare workers on (the default) and off (``TORCHSCOPE_SPARE_WORKERS=0``: a cold worker per
   job, as before), the dashboard started with a fresh data folder and a new headless-Chromium
   session opened on the Model page: the time from the navigation to the summary result on screen
   (the sample ``cnn``'s "cnn (sample) · ..." line); then History and back to Model: the time until
   the cached summary shows again. Two cases:
   * **running server**: an earlier visitor opened History (no job) and left; the new session comes
     once the server is idle again (the spare has finished its imports: its CPU time stopped growing;
     with spares off, after the same wait);
   * **first session**: the first visitor of a server just started (its spare starts with that
     visit, beside the server's first page).

A fresh server per measurement: the run store would otherwise serve the summary from an earlier
round. Reports medians and the ratio of medians; after each server is stopped, checks that none of
its processes (spares included) is left.

    .venv/bin/python bench/bench_cold_page.py [--rounds 4] [--port 8711] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
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
SECTION = "## Cold page"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SUMMARY = re.compile(r"^cnn \(sample\) · ")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def torch_import_s() -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    return time.perf_counter() - t


class Server:
    def __init__(self, port: int, spares: bool):
        self.data = Path(tempfile.mkdtemp(prefix="warm_bench_data_"))
        env = {**os.environ, "TORCHSCOPE_DATA_DIR": str(self.data), "PYTHONUNBUFFERED": "1",
               "TORCHSCOPE_SPARE_WORKERS": "1" if spares else "0"}
        self.log = open(self.data / "server.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port),
             "--server.headless", "true", "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false",
             "--server.fileWatcherType", "none"],
            cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
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
                raise RuntimeError("streamlit did not start:\n" + (self.data / "server.log").read_text()[-3000:])
            time.sleep(0.2)

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


def _settle(server: "Server", spares: bool, cap_s: float = 120.0) -> float:
    """Wait until the server's spare has finished its imports (its CPU time stops growing); returns
    the seconds waited. Without spares: nothing to wait for."""
    t = time.monotonic()
    if not spares:
        return 0.0
    last, still = None, 0
    while time.monotonic() - t < cap_s:
        try:
            kids = [c for c in psutil.Process(server.proc.pid).children(recursive=True) if c.name() == "tscope-spare"]
            cpu = sum(sum(c.cpu_times()[:2]) for c in kids) if kids else None
        except psutil.Error:
            cpu = None
        if cpu is not None and cpu == last:
            still += 1
            if still >= 4:  # 1 s without a tick of CPU: it waits for its job
                break
        else:
            still = 0
        last = cpu
        time.sleep(0.25)
    return time.monotonic() - t


def cold_page(browser, port: int, spares: bool, running: bool, settle_s: float = 0.0) -> tuple[float, float, int, float]:
    """(seconds to the summary on a new session's Model page, seconds to the cached summary after
    History -> Model, processes left after the server stopped, seconds the server was left idle)."""
    server = Server(port, spares)
    waited = 0.0
    try:
        if running:  # an earlier visitor, on a page that runs no job
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            page = context.new_page()
            page.set_default_timeout(180_000)
            page.goto(server.url + "/history")
            page.get_by_role("heading", name="History", exact=True).wait_for()
            context.close()
            waited = _settle(server, spares)
            if not spares:
                time.sleep(settle_s)
                waited = settle_s
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        page = context.new_page()
        page.set_default_timeout(180_000)
        t = time.perf_counter()
        page.goto(server.url, wait_until="commit")
        page.get_by_text(SUMMARY).wait_for()
        cold = time.perf_counter() - t
        page.locator('[data-testid="stSidebarNav"] a').filter(has_text="History").click()
        page.get_by_role("heading", name="History", exact=True).wait_for()
        page.wait_for_timeout(500)
        t = time.perf_counter()
        page.locator('[data-testid="stSidebarNav"] a').filter(has_text="Model").click()
        page.get_by_text(SUMMARY).wait_for()
        cached = time.perf_counter() - t
        context.close()
    finally:
        left = server.stop()
    return cold, cached, left, waited


CASES = (("run_on", True, True), ("run_off", False, True), ("first_on", True, False), ("first_off", False, False))


def run(rounds: int, port: int) -> dict:
    from playwright.sync_api import sync_playwright

    rows = {"torch": []}
    for name, _, _ in CASES:
        rows[name], rows[name + "_cached"], rows[name + "_idle"] = [], [], []
    left = 0
    loads = [load()]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            for r in range(rounds):
                rows["torch"].append(torch_import_s())
                settle = 0.0
                for name, spares, running in CASES:
                    c, cc, lf, waited = cold_page(browser, port, spares, running, settle)
                    if name == "run_on":
                        settle = waited  # the spares-off server idles as long
                    rows[name].append(c)
                    rows[name + "_cached"].append(cc)
                    rows[name + "_idle"].append(waited)
                    left += lf
                loads.append(load())
                print(f"round {r + 1}: import torch {rows['torch'][-1]:.2f} s · " + " · ".join(
                    f"{n} {rows[n][-1]:.2f} s (cached {rows[n + '_cached'][-1]:.2f} s)" for n, _, _ in CASES)
                    + f" · load {loads[-1]}", flush=True)
        finally:
            browser.close()
    med = {k: statistics.median(v) for k, v in rows.items()}
    return {"rounds": rounds, "samples": rows, "median": med,
            "ratio": {n: med[n] / med["torch"] for n, _, _ in CASES},
            "processes_left": left, "loads": loads, "cpus": os.cpu_count()}


LABELS = {"run_on": "new session on a running server, spare workers on (default)",
          "run_off": "new session on a running server, spare workers off (a cold worker per job, as before)",
          "first_on": "first session of a just-started server, spares on",
          "first_off": "first session of a just-started server, spares off"}


def table(res: dict) -> str:
    m, s = res["median"], res["samples"]

    def row(label, key, ratio=None, target=""):
        lo, hi = min(s[key]), max(s[key])
        r = f"{ratio:.2f}x" if ratio is not None else ""
        return f"| {label} | {m[key]:.2f} s | {lo:.2f}-{hi:.2f} s | {r} | {target} |"

    lines = ["| measurement | median | range | / bare import (medians) | goal |", "|---|---|---|---|---|",
             row('bare `python -c "import torch"`', "torch")]
    for n, _, _ in CASES:
        lines.append(row(f"cold Model page: {LABELS[n]}", n, res["ratio"][n], "<= 1.5x" if n == "run_on" else ""))
    for n, _, _ in CASES:
        lines.append(row(f"cached Model page after a page switch: {LABELS[n]}", n + "_cached", None, "< 0.5 s"))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--port", type=int, default=8711)
    ap.add_argument("--json", type=Path, help="also write the raw figures here")
    args = ap.parse_args(argv)
    res = run(args.rounds, args.port)
    print(table(res))
    print("ratios (cold page / bare import, medians): " + ", ".join(f"{n} {r:.2f}x" for n, r in res["ratio"].items())
          + f"; processes left after the servers stopped: {res['processes_left']}; server idle before the "
          f"running-server sessions: median {statistics.median(res['samples']['run_on_idle']):.1f} s; load averages "
          f"(1, 5, 15 min) before and after each round: {' | '.join(res['loads'])}")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
