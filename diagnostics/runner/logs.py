"""worker.log: opened where only the runner writes (never through a link, never waiting on a FIFO),
filled by a thread draining the worker's output pipe (its first LOG_HEAD_BYTES and last
LOG_TAIL_BYTES; the last LOG_TAIL_CHARS also kept in memory for a failure's log tail), and the
runner's own notes appended at its end."""

from __future__ import annotations

import os
import re
import select
import threading
from pathlib import Path

LOG_TAIL_CHARS = 2000
#: worker.log keeps the first and the last bytes of the worker's output; the middle is dropped.
LOG_HEAD_BYTES = 1 << 20
LOG_TAIL_BYTES = 256 << 10


def _open_log(path: Path) -> int:
    """worker.log, created for writing where only the runner writes (the run's folder, beside the
    job's): never through a link (O_NOFOLLOW), never waiting on a FIFO (O_NONBLOCK); whatever else
    has the name is replaced by a fresh file."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
        if stat_is_regular(fd):
            return fd
        os.close(fd)
    except OSError:
        pass
    try:
        os.unlink(path)
    except OSError:
        pass
    return os.open(path, flags | os.O_EXCL, 0o644)


def stat_is_regular(fd: int) -> bool:
    import stat

    return stat.S_ISREG(os.fstat(fd).st_mode)


class LogDrain(threading.Thread):
    """Copy the worker's output into ``path``: the first ``head`` bytes, then only the last ``tail``.
    The last LOG_TAIL_CHARS-odd bytes are also kept in memory (``recent``): a failure's log tail."""

    def __init__(self, fd: int, path: Path, head: int = LOG_HEAD_BYTES, tail: int = LOG_TAIL_BYTES):
        super().__init__(daemon=True, name="torchscope-log-drain")
        self.fd, self.path, self.head, self.tail = fd, path, head, tail
        self.out = _open_log(path)  # opened now, before the job can run
        self.dropped = 0
        self._recent = bytearray()
        self._stop_at = threading.Event()

    def recent(self, n: int = LOG_TAIL_CHARS) -> str:
        """The last ``n`` characters of the output (from the pipe, not from any file); for a native crash,
        ``fatal_report``'s part of it."""
        text = bytes(self._recent).decode("utf-8", "replace")
        return fatal_report(text, n) or text[-n:]

    def run(self) -> None:
        written, ring = 0, bytearray()
        with open(self.out, "wb", closefd=True) as out:
            while True:
                if self._stop_at.is_set():
                    # Stop was asked: take what is already in the pipe, without waiting for EOF
                    # (a grandchild of the worker may hold the pipe open).
                    ready = select.select([self.fd], [], [], 0)[0]
                else:
                    ready = select.select([self.fd], [], [], 0.2)[0]
                if not ready:
                    if self._stop_at.is_set():
                        break
                    continue
                try:
                    chunk = os.read(self.fd, 1 << 16)
                except OSError:
                    break
                if not chunk:
                    break
                self._recent += chunk
                if len(self._recent) > 8 * LOG_TAIL_CHARS:
                    del self._recent[: len(self._recent) - 4 * LOG_TAIL_CHARS]
                if written < self.head:
                    part = chunk[: self.head - written]
                    out.write(part)
                    out.flush()  # the head is readable while the job runs (to follow it, or find a pid)
                    written += len(part)
                    chunk = chunk[len(part):]
                if chunk:
                    ring += chunk
                    if len(ring) > 2 * self.tail:
                        self.dropped += len(ring) - self.tail
                        del ring[: len(ring) - self.tail]
            if len(ring) > self.tail:
                self.dropped += len(ring) - self.tail
                del ring[: len(ring) - self.tail]
            if self.dropped:
                out.write(f"\n[... {self.dropped:,} bytes of output dropped: worker.log keeps the first "
                          f"{self.head:,} and the last {self.tail:,} bytes ...]\n".encode())
            out.write(ring)
        os.close(self.fd)

    def finish(self, wait_s: float = 2.0) -> None:
        """Wait for EOF (the worker has ended); after ``wait_s`` take what is buffered and stop."""
        self.join(wait_s)
        if self.is_alive():
            self._stop_at.set()
            self.join(5)


def append_log(path: Path, text: str) -> None:
    """A line of the runner's at the end of worker.log (its own file: never through a link)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return
    try:
        if stat_is_regular(fd):
            os.write(fd, ("\n" + text + "\n").encode(errors="replace"))
    finally:
        os.close(fd)


_EXTENSIONS = re.compile(r"^Extension modules: .*?\(total: (\d+)\)\s*$", re.M)


def fatal_report(text: str, n: int = LOG_TAIL_CHARS) -> str:
    """faulthandler's report of a native crash in ``text`` (from its last "Fatal Python error" line on), at most
    ``n`` characters from its start: the error and the innermost frames first. The list of extension modules
    it ends with (70 names, ~1,300 characters) is said in one line, so the tail of a segfault shows what crashed
    where (its header had been cut off by that list), after the last quarter of ``n`` of what was printed before
    it; "" when ``text`` has no such report."""
    at = text.rfind("Fatal Python error")
    if at < 0:
        return ""
    report = _EXTENSIONS.sub(lambda m: f"Extension modules: {m.group(1)} (names left out)", text[at:]).rstrip()
    before = text[:at][-(n // 4):]  # the lines printed just before it (the model's own last words), if any
    if len(before) + len(report) > n:
        report = report[: n - len(before) - 4].rstrip() + "\n..."
    return before + report
