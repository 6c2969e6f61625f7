"""A cold session's Model page in a real browser: its summary comes from a warm spare worker.

A fresh dashboard (this module's own server and data folder), a new session on the Model page: the
summary appears, its run's worker.log says it ran in a spare (torch imported before the job came),
the spare ended with its job, and a new spare, waiting in the server's session (no job, no
guardian), serves the next job (Recompute). Behaviour only: the timings are in
bench/bench_cold_page.py and docs/BENCHMARKS.md ("Cold page").
"""

from __future__ import annotations

import os
import re

import psutil

from diagnostics.runner import SPARE_NAME, WARM_LOG_LINE
from test_browser import JOB_TIMEOUT_MS, _wait, page, runs, server  # noqa: F401  (fixtures)

SUMMARY = re.compile(r"^cnn \(sample\) · ")


def spares(server_pid: int) -> list[int]:
    """The server's spare workers: named so, and still in the server's session (no job's guardian)."""
    out = []
    for child in psutil.Process(server_pid).children(recursive=True):
        try:
            if child.name() == SPARE_NAME and os.getsid(child.pid) == server_pid:
                out.append(child.pid)
        except (psutil.Error, ProcessLookupError):
            pass
    return out


def summaries(data) -> list[dict]:
    return [r for r in runs(data) if r["analysis"] == "summary" and r["model_label"] == "cnn (sample)"]


def test_a_cold_model_page_shows_its_summary_computed_in_a_warm_spare(server, page):
    data, server_pid = server["data"], server["proc"].pid
    page.get_by_text(SUMMARY).wait_for(timeout=JOB_TIMEOUT_MS)
    first = summaries(data)
    assert [r["status"] for r in first] == ["ok"]
    log = (data / "artifacts" / first[0]["id"] / "worker.log").read_text(errors="replace")
    assert log.startswith(WARM_LOG_LINE), log[:500]
    # One job per process: the spare that ran it is gone; another one waits for the next job.
    _wait(lambda: not psutil.pid_exists(first[0]["pid"])
          or psutil.Process(first[0]["pid"]).status() == psutil.STATUS_ZOMBIE, 30, "the first worker to exit")
    waiting = _wait(lambda: spares(server_pid), 120, "a new spare worker")
    assert first[0]["pid"] not in waiting

    page.get_by_role("button", name="Recompute").click()
    second = _wait(lambda: [r for r in summaries(data)[1:] if r["status"] != "running"], JOB_TIMEOUT_MS / 1000,
                   "the recomputed summary")[0]
    assert second["status"] == "ok", second["error"]
    assert second["pid"] in waiting  # the spare that was waiting took it
    log = (data / "artifacts" / second["id"] / "worker.log").read_text(errors="replace")
    assert log.startswith(WARM_LOG_LINE), log[:500]
    page.get_by_text(SUMMARY).wait_for(timeout=JOB_TIMEOUT_MS)
