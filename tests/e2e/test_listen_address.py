"""Where the dashboard listens (issue 45, item 7): `make run`'s launcher serves 127.0.0.1 unless told
otherwise, and on another address without an access token it starts in server-safe mode and says so.
The rule itself, the token check and the launcher's arguments: tests/ui/test_access.py."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request

import psutil
import pytest

from test_browser import ROOT, _free_port, _wait

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/_stcore/health", timeout=2) as r:
            return r.read().decode().strip() == "ok"
    except OSError:
        return False


def _listening(pid: int, port: int) -> set[str]:
    """The addresses the server's process listens on at ``port``."""
    return {c.laddr.ip for c in psutil.Process(pid).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port}


def _serve(tmp_path, *args):
    port = _free_port()
    log_path = tmp_path / f"server-{port}.log"
    env = {**os.environ, "TORCHSCOPE_DATA_DIR": str(tmp_path / "data"), "PYTHONUNBUFFERED": "1",
           "TORCHSCOPE_SPARE_WORKERS": "0"}
    for name in ("TORCHSCOPE_SAFE_MODE", "TORCHSCOPE_TOKEN", "STREAMLIT_SERVER_ADDRESS"):
        env.pop(name, None)
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "ui.launch", "--server.port", str(port), "--server.headless",
                                 "true", *args], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        _wait(lambda: _healthy(f"http://127.0.0.1:{port}") or proc.poll() is not None, 120, "the server")
        assert proc.poll() is None, log_path.read_text()[-3000:]
        return _listening(proc.pid, port), log_path.read_text()
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(20)


def test_the_launcher_listens_on_this_machine_only_by_default_and_safe_elsewhere(tmp_path):
    where, log = _serve(tmp_path)
    assert where == {"127.0.0.1"}, where  # Streamlit's own default is every interface
    assert "server-safe mode" not in log
    where, log = _serve(tmp_path, "--server.address", "0.0.0.0")
    assert where == {"0.0.0.0"}, where
    assert "serving 0.0.0.0 without an access token: started in server-safe mode" in log, log[-2000:]
