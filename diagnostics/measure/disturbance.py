"""Was the machine busy while we timed? Figures, and a verdict on them.

``watch()`` records, from its start to its end: the wall time, this process' CPU time (all its
threads), the whole machine's busy CPU time (from /proc/stat via psutil, every core), the load
average and the torch thread count. Other processes' CPU use is the machine's busy time minus ours
(the CPU-seconds they took from the cores we could have used), shown in cores. ``report(cv=...)``
adds the coefficient of variation of the timed samples and says whether the run was disturbed and
why; a comparison drawn from a disturbed run is marked low-confidence.

No torch at import: the runner wraps every timed analysis with it.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager

import psutil

from diagnostics.devices import logical_cores, torch_threads

#: Other processes using more than this many cores on average during the run disturbed it.
OTHERS_CORES_MAX = 0.5
#: Timings whose coefficient of variation (std / mean) exceeds this are too scattered to trust.
CV_MAX = 0.3


def _busy_cpu_s() -> float:
    t = psutil.cpu_times()
    idle = t.idle + getattr(t, "iowait", 0.0)
    return sum(t) - idle - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)


def _own_cpu_s(proc: psutil.Process) -> float:
    c = proc.cpu_times()
    return c.user + c.system + c.children_user + c.children_system


class Watch:
    def __init__(self):
        self._proc = psutil.Process()
        self._t0 = time.perf_counter()
        self._busy0 = _busy_cpu_s()
        self._own0 = _own_cpu_s(self._proc)
        self._load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        self.figures: dict | None = None

    def stop(self) -> dict:
        wall = max(1e-9, time.perf_counter() - self._t0)
        own = max(0.0, _own_cpu_s(self._proc) - self._own0)
        busy = max(0.0, _busy_cpu_s() - self._busy0)
        cores = logical_cores()
        threads = torch_threads(import_torch=False)  # this module never imports torch
        others = max(0.0, busy - own)
        self.figures = {
            "wall_s": wall, "cpu_s": own, "cpu_cores_used": own / wall,
            "other_processes_cores": others / wall, "cores": cores, "torch_threads": threads,
            "load_avg_1m_start": self._load0,
            "load_avg_1m_end": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        }
        return self.figures


@contextmanager
def watch():
    """``with watch() as w: ...`` then ``w.figures`` (or ``assess(w.figures, cv)``)."""
    w = Watch()
    try:
        yield w
    finally:
        w.stop()


def assess(figures: dict, cv: float | None = None) -> dict:
    """The figures with ``cv``, ``disturbed`` (bool) and ``reasons`` (what crossed which threshold)."""
    f = dict(figures, cv=cv)
    reasons = []
    others = f["other_processes_cores"]
    if others > OTHERS_CORES_MAX:
        reasons.append(f"other processes used {others:.2f} CPU cores on average during the run "
                       f"(more than {OTHERS_CORES_MAX}); load average {f['load_avg_1m_end']:.2f} "
                       f"on {f['cores']} cores" if f.get("load_avg_1m_end") is not None else
                       f"other processes used {others:.2f} CPU cores on average (more than {OTHERS_CORES_MAX})")
    if cv is not None and cv > CV_MAX:
        reasons.append(f"the timings scattered: coefficient of variation {cv:.2f} (more than {CV_MAX})")
    f["disturbed"] = bool(reasons)
    f["reasons"] = reasons
    f["thresholds"] = {"other_processes_cores": OTHERS_CORES_MAX, "cv": CV_MAX}
    return f
