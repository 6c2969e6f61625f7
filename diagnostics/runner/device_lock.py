"""The per-device queue (``device_queue``): a job that times its device holds that device's file lock,
so two jobs (across sessions and processes) never time one device at once."""

from __future__ import annotations

import fcntl
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from diagnostics.errors import JobError
from diagnostics.runner.job import cancel_reason


@contextmanager
def device_queue(lock_dir: Path, device: str, on_wait: Callable[[], None] | None = None,
                 cancel: threading.Event | None = None, on_tick: Callable[[float], None] | None = None):
    """Hold an exclusive per-device lock (a file lock: works across sessions and processes)."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    path = lock_dir / f"{device.replace(':', '_')}.lock"
    with open(path, "w") as f:
        waited = False
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if cancel is not None and cancel.is_set():
                    raise JobError(cancel_reason(cancel) + " (it was waiting for the device)") from None
                if not waited and on_wait is not None:
                    on_wait()
                waited = True
                if on_tick is not None:
                    on_tick(0.0)
                time.sleep(0.2)
        try:
            yield waited
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
