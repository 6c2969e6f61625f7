"""An attached run started from the dashboard: ``python -m diagnostics run`` in a process of its own
(its own session: no terminal, no Ctrl-C from the server's), its output into a log file, its live
state from the status file it rewrites, Stop as SIGTERM (the run then stops the script's whole tree
and keeps what was measured). The run dies with the dashboard (PR_SET_PDEATHSIG). No streamlit.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from diagnostics.analyses.attach.protocol import read_json
from diagnostics.attach.command import check_command

ROOT = Path(__file__).resolve().parents[2]
#: Bytes of the script's output shown live (its tail).
LOG_TAIL_BYTES = 16 << 10


class BackgroundRun:
    """``python -m diagnostics run`` for ``command_line`` (a shell-like string) in ``cwd``."""

    def __init__(self, command_line: str, cwd: str, *, steps: int = 5, at: int | None = None,
                 timeout_s: float | None = None, data_dir: str | None = None, try_fixes: str | None = None,
                 rounds: int | None = None, plan: str | None = None):
        try:
            argv = shlex.split(command_line)
        except ValueError as e:
            from diagnostics.attach.command import UsageError

            raise UsageError(f"the command line cannot be read: {e}") from None
        self.command = check_command(argv, cwd)  # bad input: UsageError before anything starts
        if try_fixes:
            from diagnostics.analyses.trials.protocol import parse_fixes
            from diagnostics.attach.command import UsageError

            try:
                try_fixes = ",".join(parse_fixes(try_fixes))
            except ValueError as e:
                raise UsageError(str(e)) from None
        if plan is not None:  # run --plan: its rows checked here, before anything starts
            from diagnostics.analyses.plan.attached import parse_spec
            from diagnostics.attach.command import UsageError
            from diagnostics.declare import OptionError

            try:
                parse_spec(plan)
            except OptionError as e:
                raise UsageError(str(e)) from None
        self.folder = Path(tempfile.mkdtemp(prefix="torchscope-run-"))
        self.status_file = self.folder / "status.json"
        self.log_file = self.folder / "output.log"
        args = [sys.executable, "-m", "diagnostics", "run", "--status-file", str(self.status_file), "--no-report",
                "--die-with-parent", "--steps", str(int(steps)), "--cwd", self.command.cwd]
        if at is not None:
            args += ["--at", str(int(at))]
        self.trials = bool(try_fixes)  # fix trials (issue 40): --try instead of a profiled run
        if try_fixes:
            args += ["--try", str(try_fixes)] + (["--rounds", str(int(rounds))] if rounds else [])
        if plan is not None and not try_fixes:
            args += [f"--plan={plan}"] if plan else ["--plan"]
        if timeout_s:
            args += ["--timeout", str(float(timeout_s))]
        if data_dir:
            args += ["--data-dir", str(data_dir)]
        args += ["--", *argv]
        self.started = time.time()
        with open(self.log_file, "wb") as log:
            # From the repository root, so `-m diagnostics` is found without touching the script's PYTHONPATH.
            self.proc = subprocess.Popen(args, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.stop_requested = False
        self._last: dict | None = None

    def status(self) -> dict:
        """The live state (phase, step, window, run_id...), with done / exit_code once it ended."""
        st = read_json(str(self.status_file), None)
        if st is None:  # not written yet, or its folder deleted: the last one read (its run id stays known)
            st = dict(self._last) if self._last else {"phase": "starting", "step": 0}
        else:
            self._last = dict(st)
        code = self.proc.poll()
        st["elapsed_s"] = time.time() - self.started
        st["stopping"] = self.stop_requested and code is None
        if code is not None:
            st["done"] = True
            st["tool_exit_code"] = code
        return st

    def stop(self) -> None:
        """Stop the script (SIGINT to it, its tree killed after a grace period); measured data is kept."""
        if self.proc.poll() is None:
            self.stop_requested = True
            try:
                self.proc.send_signal(signal.SIGTERM)
            except OSError:
                pass

    def log_tail(self, n_bytes: int = LOG_TAIL_BYTES) -> str:
        try:
            with open(self.log_file, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - n_bytes))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    @property
    def done(self) -> bool:
        return self.proc.poll() is not None
