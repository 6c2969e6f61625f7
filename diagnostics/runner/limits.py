"""The worker's memory cap, counted by the parent: the cap from the setting (``memory_cap_bytes``),
the job's resident memory over its process tree from the footprint it had once torch was loaded plus
what it holds in /dev/shm (``MemoryWatch``), and the kill of the whole tree (``kill_worker``)."""

from __future__ import annotations

import os

import psutil

import diagnostics.procs as procs
from diagnostics.settings import env_number

MEMORY_LIMIT_ENV = "TORCHSCOPE_WORKER_MEMORY_MB"

#: Default worker memory cap: this share of physical memory.
DEFAULT_MEMORY_SHARE = 0.6


def memory_cap_bytes() -> int:
    """The worker's memory cap: MEMORY_LIMIT_ENV in MiB, else DEFAULT_MEMORY_SHARE of physical memory."""
    mb = env_number(MEMORY_LIMIT_ENV, None)
    if mb is not None:
        return int(mb * 2**20)
    return int(psutil.virtual_memory().total * DEFAULT_MEMORY_SHARE)


class _ShmCounter:
    """What a job holds in shared memory files: its private /dev/shm where it has one (seen through
    /proc/<pid>/root of its processes), else what the host's /dev/shm gained since the job started."""

    def __init__(self):
        self.host = self._stat("/dev/shm")
        self.host_used0 = self._used("/dev/shm")

    @staticmethod
    def _stat(path: str):
        try:
            return os.stat(path).st_dev
        except OSError:
            return None

    @staticmethod
    def _used(path: str) -> int:
        try:
            st = os.statvfs(path)
        except OSError:
            return 0
        return (st.f_blocks - st.f_bfree) * st.f_frsize

    def used(self, pids: list[int]) -> int:
        private: dict[int, int] = {}
        for pid in pids:
            path = f"/proc/{pid}/root/dev/shm"
            dev = self._stat(path)
            if dev is not None and dev != self.host and dev not in private:
                private[dev] = self._used(path)
        if private:
            return sum(private.values())
        return max(0, self._used("/dev/shm") - self.host_used0) if self.host is not None else 0


def _tree_pids(pid: int) -> list[int]:
    """The worker and every process below it (the job's, DataLoader workers...)."""
    try:
        root = psutil.Process(pid)
        return [root.pid] + [p.pid for p in root.children(recursive=True)]
    except psutil.Error:
        return []


def _rss(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_info().rss
        except psutil.Error:
            pass
    return total


def _baseline(pid: int, job_rss: int) -> int:
    """The footprint the memory cap counts from: the job process' own resident memory when it said
    so (``job_rss``), plus every other process of the tree now (the guardian and, in namespaces, the
    processes waiting above the job; they allocate nothing later). The job process is the deepest
    one at that moment: it has started nothing yet."""
    try:
        root = psutil.Process(pid)
        tree = [root] + root.children(recursive=True)
    except psutil.Error:
        return job_rss
    depth: dict[int, int] = {root.pid: 0}
    for p in tree[1:]:
        try:
            depth[p.pid] = depth.get(p.ppid(), 0) + 1
        except psutil.Error:
            pass
    job = max(depth, key=lambda q: depth[q]) if len(depth) > 1 else None
    return job_rss + _rss([q for q in depth if q != job])


class MemoryWatch:
    """What a job uses against its memory cap: its process tree's resident memory beyond the footprint
    it had once torch was loaded, plus what it holds in /dev/shm. Made before the worker starts (the
    host's /dev/shm is counted from then); counting begins once the job says its footprint (``start``)."""

    def __init__(self):
        self._shm = _ShmCounter()
        self.baseline: int | None = None

    def start(self, pid: int, job_rss: int) -> None:
        """The job's footprint (its Baseline message, sent before any user code): only the first counts,
        a later one (the model's own) would move the cap's zero."""
        if self.baseline is None:
            self.baseline = _baseline(pid, job_rss)

    def used(self, pid: int) -> tuple[int, int]:
        """(bytes used beyond the footprint, of which in /dev/shm) by the worker ``pid`` and its tree."""
        pids = _tree_pids(pid)
        in_shm = self._shm.used(pids)
        return _rss(pids) - (self.baseline or 0) + in_shm, in_shm


def kill_worker(proc) -> None:
    """Kill the worker (the job's guardian), the job process and anything they started (DataLoader
    workers, subprocesses, their orphans): frozen first, so nothing forks away meanwhile."""
    if proc.is_alive():
        procs.kill_tree(proc.pid)
    proc.join(5)
