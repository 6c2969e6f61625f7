"""`make run`'s launcher (ui/launch.py): before any session connects, the spare worker is importing
torch and the server has imported the pages' modules (without torch) and frozen them out of the
garbage collector's reach. That the first session's job then runs in that early spare (its
environment unchanged by Streamlit's start-up) is checked in a browser by test_cold_page.py, whose
server is started by the launcher too. Timings: bench/bench_cold_page.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request

import psutil
import pytest

from diagnostics.runner import SPARE_NAME
from test_browser import ROOT, _free_port, _wait
from ui.launch import WARM_LOG_LINE

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/_stcore/health", timeout=2) as r:
            return r.read().decode().strip() == "ok"
    except OSError:
        return False


def test_the_launcher_starts_the_spare_and_the_pages_imports_before_any_session(tmp_path):
    port = _free_port()
    log_path = tmp_path / "server.log"
    env = {**os.environ, "TORCHSCOPE_DATA_DIR": str(tmp_path / "data"), "PYTHONUNBUFFERED": "1"}
    env.pop("TORCHSCOPE_SPARE_WORKERS", None)
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "ui.launch", "--server.port", str(port), "--server.headless",
                                 "true", "--server.address", "127.0.0.1"],
                                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait(lambda: _healthy(f"http://127.0.0.1:{port}") or proc.poll() is not None, 120, "the server")
        assert proc.poll() is None, log_path.read_text()[-3000:]

        def spares():
            return [c for c in psutil.Process(proc.pid).children(recursive=True) if c.name() == SPARE_NAME]

        assert _wait(spares, 60, "a spare worker, with no session connected")
        line = _wait(lambda: next((l for l in log_path.read_text().splitlines() if l.startswith(WARM_LOG_LINE)), None),
                     120, "the warm-up's log line")
        assert "not imported" not in line, line
        assert "after the spare worker started" not in log_path.read_text()  # the early spare serves the jobs
        frozen = int(line.split("; ")[1].split()[0])
        assert frozen > 50_000, line  # streamlit, pandas and plotly's objects, at least
        # The pages' modules are imported, torch is not: the server never imports torch for a page.
        maps = " ".join(m.path for m in psutil.Process(proc.pid).memory_maps())
        assert "libtorch" not in maps and "pandas" in maps
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(20)
