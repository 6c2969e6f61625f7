"""Runs are never lost and a deliberate stop reads as a stop: the dashboard's status folder deleted while
the script runs (the script's exit code wins, the History row ends with a status and a reason), Stop
from the page (exit code 130 noted, the partial result kept, shown as a stop, not an error). Real
processes: slow."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import pytest

from diagnostics.store import Store
from tests.attach.harness import SCRIPTS, env_for

pytestmark = pytest.mark.slow


def _wait(cond, timeout=120.0):
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.2)
    return cond()


def test_the_status_folder_deleted_mid_run_loses_nothing_the_script_exit_code_wins(tmp_path):
    import subprocess

    folder = tmp_path / "status"
    folder.mkdir()
    status = folder / "status.json"
    env = env_for(tmp_path, {"STEPS": "400"})
    p = subprocess.Popen([sys.executable, "-m", "diagnostics", "run", "--json", "--no-report", "--status-file",
                          str(status), "--", sys.executable, str(SCRIPTS / "host_bound.py")], cwd=tmp_path, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert _wait(status.exists), "no live status"
    run_id = json.loads(status.read_text())["run_id"]
    shutil.rmtree(folder)  # the dashboard's temporary folder, gone while the script runs
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]  # the script's exit code, not ours
    assert "Traceback" not in err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["exit_code"] == 0 and result["status"] == "ok" and result["steps"] > 0
    assert json.loads(status.read_text())["done"] is True  # written again at the end, where the page reads it
    rec = Store(str(tmp_path / "store")).get(run_id)
    assert rec.status == "ok" and rec.result["steps"] == result["steps"]


def test_the_run_folder_deleted_mid_run_still_ends_the_row_with_a_reason(tmp_path):
    import subprocess

    env = env_for(tmp_path, {"STEPS": "400"})
    p = subprocess.Popen([sys.executable, "-m", "diagnostics", "run", "--json", "--no-report", "--status-file",
                          str(tmp_path / "status.json"), "--", sys.executable, str(SCRIPTS / "crash.py")],
                         cwd=tmp_path, env={**env, "CRASH_AT": "100000"}, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert _wait(lambda: (tmp_path / "status.json").exists() and json.loads(
        (tmp_path / "status.json").read_text()).get("step", 0) > 3)
    st = json.loads((tmp_path / "status.json").read_text())
    shutil.rmtree(st["run_dir"])
    p.send_signal(2)  # Ctrl-C not from a terminal: the script gets SIGINT and dies of it
    out, err = p.communicate(timeout=300)
    result = json.loads(out.strip().splitlines()[-1])
    assert p.returncode == result["exit_code"] and p.returncode != 0
    rec = Store(str(tmp_path / "store")).get(st["run_id"])
    assert rec.status == "cancelled" and "interrupted (Ctrl-C)" in rec.error
    assert f"exit code {p.returncode}" in rec.error


def test_stop_from_the_page_is_a_stop_with_its_exit_code_and_the_partial_result(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from diagnostics.attach.background import BackgroundRun

    for k, v in env_for(tmp_path).items():
        monkeypatch.setenv(k, v)
    run = BackgroundRun(f"{sys.executable} {SCRIPTS / 'forever.py'}", str(tmp_path), steps=3, at=4,
                        data_dir=str(tmp_path / "store"))
    assert _wait(lambda: run.status().get("step", 0) >= 8, 180), run.log_tail()
    run.stop()
    assert _wait(lambda: run.done, 60)
    st = run.status()
    assert st["tool_exit_code"] == 130  # the script's: it ended on the SIGINT it was sent
    rec = Store(str(tmp_path / "store")).get(st["run_id"])
    assert rec.status == "cancelled" and rec.error == "the script was stopped by the user (Stop) (exit code 130)"
    assert rec.result["status"] == "interrupted" and rec.result["steps"] >= 8 and rec.result["profiled_steps"]
    assert "SIGTERM" not in json.dumps(rec.result["notes"])

    def page(result):
        from ui import views

        views.show_stored("attach", result)

    at = AppTest.from_function(page, default_timeout=60, kwargs={"result": rec.result}).run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error and not at.warning
    assert any("The run was stopped (exit code 130)" in i.value for i in at.info)
