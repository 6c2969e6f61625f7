"""Where a CLI command writes its report folder, shared by ``python -m diagnostics`` and its
``distributed`` commands: ``--out DIR``, ``--no-report``, else ``./torchscope-report/<analysis>-<time>``.

An ``--out`` that cannot become a folder is refused before the job runs (UsageError, exit 2), so
a long run never ends in "could not write".
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from diagnostics.cli.model_args import UsageError

DEFAULT_REPORT_ROOT = "torchscope-report"


def add_report_args(parser, analysis: str) -> None:
    parser.add_argument("--out", "-o", metavar="DIR", help=f"report folder (default ./{DEFAULT_REPORT_ROOT}/"
                                                          f"{analysis}-<time>)")
    parser.add_argument("--no-report", action="store_true", help="write no report folder")


def report_dir(out: str | None, no_report: bool, analysis: str) -> Path | None:
    """The report folder for these arguments: none with --no-report, --out DIR (checked), else the default."""
    if no_report:
        return None
    if not out:
        return default_report_dir(analysis)
    path = Path(out)
    check_report_folder(path)
    return path


def default_report_dir(analysis: str) -> Path:
    base = Path.cwd() / DEFAULT_REPORT_ROOT / f"{analysis}-{time.strftime('%Y%m%d-%H%M%S')}"
    out, n = base, 1
    while out.exists():
        n += 1
        out = base.with_name(f"{base.name}-{n}")
    return out


def check_report_folder(out: Path) -> None:
    """Refuse an --out that cannot become a report folder: a file in the way, or no write permission."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"cannot write the report folder {out}: it is a file")
    parent = out
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"cannot write the report folder {out}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write the report folder {out}: {parent} is not writable")


def write_report(analysis: str, result: dict, out_dir: Path, artifacts: dict, *, title: str,
                 run_id: str, memo_dir: Path | None = None, memo_text: str | None = None) -> dict | None:
    """diagnostics.render.html.write_report_folder for a CLI run; None after saying on stderr why the
    folder could not be written (a full disk, say: --out itself was checked before the job). ``memo_dir``,
    ``memo_text``: the report body kept for the same result (diagnostics.render.report_memo)."""
    from diagnostics.render.html import write_report_folder

    try:
        return write_report_folder(analysis, result, out_dir, artifacts, title=title,
                                   meta={"run": run_id, "source": "cli"}, memo_dir=memo_dir, memo_text=memo_text)
    except OSError as e:
        sys.stderr.write(f"error: could not write the report folder {out_dir}: {e}\n")
        sys.stderr.flush()
        return None
