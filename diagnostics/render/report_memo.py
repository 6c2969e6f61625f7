"""The body of an HTML report kept for a result seen before (issue #42: a trace reopen rebuilt every chart of the
same stored result, ~2 s of its ~2.6 s): read back when the same analysis' result, as its JSON, and the same
code come again; else built and kept. The header (time, run id) is never kept.

Kept in one folder (the CLI: <data folder>/report_memo), a file per key, at most MAX_FILES and MAX_BYTES
(oldest removed first). A kept body is HTML (with the charts' scripts) that this tool wrote: it is read back only
from a regular file of bounded size (diagnostics.jobfiles) that this user owns and nobody else may write (the
files are written 0600), so another account cannot put a script into a report; anything else is a miss.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import stat

from diagnostics.jobfiles import ArtifactError, open_regular

#: Bodies kept, at most (the newest), and their total size.
MAX_FILES = 8
MAX_BYTES = 256 * 2**20
#: The folder's name under the data folder.
MEMO_DIR = "report_memo"
_SUFFIX = ".body.html"
_CODE: list = []


def code_stamp() -> str:
    """The source a body comes from: every module of the diagnostics package (path, size, mtime) and plotly's
    version. A change to any of them is a miss (the charts, labels and layouts live across the package)."""
    if not _CODE:
        root = Path(__file__).resolve().parents[1]
        h = hashlib.sha256()
        for f in sorted(root.rglob("*.py")):
            st = f.stat()
            h.update(f"{f.relative_to(root).as_posix()}:{st.st_size}:{st.st_mtime_ns}\n".encode())
        try:
            from importlib.metadata import version

            h.update(version("plotly").encode())
        except Exception:  # noqa: BLE001  no distribution metadata: the sources alone
            pass
        _CODE.append(h.hexdigest()[:16])
    return _CODE[0]


def key(analysis: str, result_json: str) -> str:
    h = hashlib.sha256(f"{analysis}\n{code_stamp()}\n".encode())
    h.update(result_json.encode())
    return h.hexdigest()[:32]


def read(folder: Path, k: str) -> str | None:
    """The body kept under ``k``, or None."""
    path = Path(folder) / (k + _SUFFIX)
    try:
        fd = open_regular(path, MAX_BYTES)
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                return None
            data = f.read()
        os.utime(path)   # recently used: pruned last
        return data.decode("utf-8")
    except (ArtifactError, OSError, UnicodeDecodeError):
        return None


def write(folder: Path, k: str, body: str) -> None:
    """Keep ``body`` under ``k`` (atomically), then remove the oldest beyond MAX_FILES / MAX_BYTES. A folder
    that cannot be written is no error: the report is written all the same."""
    folder = Path(folder)
    data = body.encode("utf-8")
    if len(data) > MAX_BYTES:
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, folder / (k + _SUFFIX))
        kept = sorted((p for p in folder.iterdir() if p.name.endswith(_SUFFIX) and p.is_file()),
                      key=lambda p: p.stat().st_mtime_ns, reverse=True)
        total = 0
        for n, p in enumerate(kept):
            total += p.stat().st_size
            if n >= MAX_FILES or total > MAX_BYTES:
                p.unlink(missing_ok=True)
    except OSError:
        return
