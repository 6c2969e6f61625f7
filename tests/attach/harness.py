"""Running the test scripts (tests/attach/scripts) bare and under ``python -m diagnostics run``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"
#: Lines on stderr that are not the script's: ours, and torch.profiler's own while the window runs.
# Our own lines; and c10's one-time warning when the window's memory profiling sees a block freed that was
# allocated before it started (c10 reads its log level once, at import: it cannot be quieted for the window).
# Kineto's "USDT:" / "STAGE:" lines are not here: the window starts Kineto quiet (agent._quiet_kineto).
NOT_THE_SCRIPTS = ("[torchscope]", "Memory block of unknown size")


class Ran:
    def __init__(self, proc: subprocess.CompletedProcess, timing_path: Path):
        self.proc = proc
        self.code = proc.returncode
        self.stdout, self.stderr = proc.stdout, proc.stderr
        lines = proc.stdout.strip().splitlines()
        self.result = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None
        self.script_stdout = "\n".join(lines[:-1] if self.result is not None else lines)
        self.self_timing = json.loads(timing_path.read_text()) if timing_path.exists() else None

    @property
    def script_stderr(self) -> str:
        return "\n".join(line for line in self.stderr.splitlines() if not any(m in line for m in NOT_THE_SCRIPTS))


def env_for(tmp_path: Path, extra: dict | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TORCHSCOPE_DATA_DIR": str(tmp_path / "store"),
           "SELF_TIMING": str(tmp_path / "self.json"), "OMP_NUM_THREADS": "1"}
    env.update(extra or {})
    return env


def run_attached(tmp_path: Path, script: str, *script_args, options=(), env=None, stdin: str | None = None,
                 command=None, timeout: float = 300, cwd: Path | None = None) -> Ran:
    """``python -m diagnostics run --json --no-report OPTIONS -- python SCRIPT ARGS`` from ``cwd``."""
    cmd = command or [sys.executable, str(SCRIPTS / script), *script_args]
    p = subprocess.run([sys.executable, "-m", "diagnostics", "run", "--json", "--no-report", *options, "--", *cmd],
                       cwd=cwd or tmp_path, env=env_for(tmp_path, env), capture_output=True, text=True,
                       timeout=timeout, input=stdin if stdin is not None else "")
    return Ran(p, tmp_path / "self.json")


def run_bare(tmp_path: Path, script: str, *script_args, env=None, stdin: str | None = None,
             cwd: Path | None = None, timeout: float = 300) -> Ran:
    p = subprocess.run([sys.executable, str(SCRIPTS / script), *script_args], cwd=cwd or tmp_path,
                       env=env_for(tmp_path, env), capture_output=True, text=True, timeout=timeout,
                       input=stdin if stdin is not None else "")
    return Ran(p, tmp_path / "self.json")


def near_check(measured, independent, rel=0.25, abs_ms=2.0):
    """|measured - independent| within rel x independent + abs_ms."""
    assert measured is not None and abs(measured - independent) <= rel * independent + abs_ms, \
        (measured, independent)
