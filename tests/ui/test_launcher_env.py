"""ui.launch without a server: the spare's environment is the one Streamlit leaves, and a change it
did not foresee replaces the early spare (the server itself: tests/e2e/test_launcher.py)."""

import os
import subprocess
import sys
from pathlib import Path

from diagnostics import runner
from ui import launch

ROOT = Path(__file__).resolve().parents[2]


def test_the_environment_set_before_the_spare_is_the_one_streamlit_leaves():
    """Importing Streamlit and preparing its server (what `streamlit run` does before a session) changes
    nothing the launcher did not set first."""
    code = ("import os, sys\n"
            "sys.path.insert(0, os.getcwd())\n"
            "from ui import launch\n"
            "from diagnostics.runner import spawn_environment\n"
            "import ui.background\n"
            "ui.background.start_spares = lambda: None\n"  # no spare here: only the environment is compared
            "expected = launch.start_spares_early()\n"
            "from streamlit.web import bootstrap, cli\n"
            "bootstrap._fix_sys_path(str(launch.APP))\n"
            "bootstrap.prepare_streamlit_environment(str(launch.APP))\n"
            "print(spawn_environment() == expected)\n")
    env = {k: v for k, v in os.environ.items() if k not in launch.STREAMLIT_ENV}
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip().splitlines()[-1] == "True"


class FakePool:
    size = 1

    def __init__(self):
        self.calls = []

    def close(self):
        self.calls.append("close")


def test_a_change_streamlit_made_after_the_spare_started_replaces_it(monkeypatch, capsys):
    pool = FakePool()
    monkeypatch.setattr(runner, "spares", lambda: pool)
    monkeypatch.setattr(runner, "keep_spares", lambda n: pool.calls.append(("keep", n)))
    expected = runner.spawn_environment()
    assert launch.check_spare_environment(expected) == [] and pool.calls == []
    monkeypatch.setenv("TORCHSCOPE_TEST_SECRET", "from secrets.toml")
    monkeypatch.setattr(sys, "path", sys.path + ["/nonexistent-folder"])
    assert launch.check_spare_environment(expected) == ["TORCHSCOPE_TEST_SECRET", "sys.path"]
    assert pool.calls == ["close", ("keep", 1)]
    assert "changed TORCHSCOPE_TEST_SECRET, sys.path after the spare worker started: it is replaced" \
           in capsys.readouterr().err
