"""Server settings from the environment. A malformed value is an error that names the variable,
and server-safe mode decides which files a job may read."""

from __future__ import annotations

import os
from pathlib import Path

from diagnostics.errors import TorchScopeError

SAFE_MODE_ENV = "TORCHSCOPE_SAFE_MODE"
#: The folder in the data folder where parsed traces are kept for instant reopening (diagnostics.trace.cache).
TRACE_CACHE_DIR = "trace_cache"


def safe_mode() -> bool:
    """Server-safe mode: no Python-file uploads, no pickled modules, no reading of arbitrary server paths."""
    return os.environ.get(SAFE_MODE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def env_number(name: str, default: float | None, *, zero_ok: bool = False, whole: str | None = None) -> float | None:
    """float($name), or ``default`` when it is unset or empty: the one reading of a number from the
    environment. It must be above 0 (0 or more with ``zero_ok``); ``whole``: it must be a whole number,
    and an error says so followed by ``whole`` ("of spare workers from 0 (off) to 4"). A value that is
    none of these is an error naming the variable and what it holds."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = None
    if whole is not None and (value is None or not value.is_integer() or value < 0):
        raise TorchScopeError(f"the environment variable {name}={raw!r} must be a whole number {whole}")
    if value is None:
        raise TorchScopeError(f"the environment variable {name}={raw!r} is not a number") from None
    if not (value >= 0 if zero_ok else value > 0):
        raise TorchScopeError(f"the environment variable {name}={raw!r} must be {'0 or more' if zero_ok else 'above 0'}")
    return value


def trace_cache_dir() -> Path:
    """Where trace jobs keep parsed traces: <data folder>/trace_cache ($TORCHSCOPE_DATA_DIR or ~/.torchscope)."""
    from diagnostics.store import default_data_dir

    return default_data_dir() / TRACE_CACHE_DIR


def check_server_path(path: str | Path, what: str = "file") -> Path:
    """A path typed into the dashboard, resolved. In server-safe mode only files inside the data
    folder (uploads, stored runs) may be read: a remote user must not probe the server's disk."""
    p = Path(path).expanduser().resolve()
    if safe_mode():
        from diagnostics.store import default_data_dir

        root = default_data_dir().resolve()
        if not p.is_relative_to(root):
            raise TorchScopeError(f"reading a {what} from a path on the server is disabled in server-safe mode; "
                                  "upload it instead")
    return p
