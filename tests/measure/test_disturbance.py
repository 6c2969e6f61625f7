"""Disturbance: the verdict on synthetic figures, and a real busy process next to a watch."""

import subprocess
import sys
import time

from diagnostics.measure.disturbance import CV_MAX, OTHERS_CORES_MAX, assess, watch
from diagnostics.render.text import disturbance_line as _line
from diagnostics.results import disturbance_of


def disturbance_line(report):
    """The line a page, the report and the CLI write for this report, once it is in a result (typed)."""
    return _line(disturbance_of({"disturbance": report}))

QUIET = {"wall_s": 2.0, "cpu_s": 1.9, "cpu_cores_used": 0.95, "other_processes_cores": 0.05, "cores": 2,
         "torch_threads": 1, "load_avg_1m_start": 0.9, "load_avg_1m_end": 1.0}


def test_a_quiet_run_is_not_disturbed():
    r = assess(QUIET, cv=0.05)
    assert r["disturbed"] is False and r["reasons"] == [] and r["cv"] == 0.05
    assert disturbance_line(r).startswith("quiet run: other processes used 0.05 CPU cores")


def test_other_processes_and_scattered_timings_each_disturb_a_run_with_their_figures():
    busy = assess(dict(QUIET, other_processes_cores=1.02, load_avg_1m_end=2.4), cv=0.1)
    assert busy["disturbed"] and busy["reasons"] == [
        f"other processes used 1.02 CPU cores on average during the run (more than {OTHERS_CORES_MAX}); "
        "load average 2.40 on 2 cores"]
    scattered = assess(QUIET, cv=0.8)
    assert scattered["disturbed"] and scattered["reasons"] == [
        f"the timings scattered: coefficient of variation 0.80 (more than {CV_MAX})"]
    assert "low-confidence" in disturbance_line(scattered)
    assert disturbance_line(None) is None


def test_a_busy_loop_in_another_process_is_seen():
    spin = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 3: pass"])
    try:
        time.sleep(0.3)  # let it start spinning
        with watch() as w:
            time.sleep(1.5)  # this process idles: the busy CPU time is someone else's
    finally:
        spin.kill()
        spin.wait()
    f = w.figures
    assert f["other_processes_cores"] > OTHERS_CORES_MAX and f["cpu_s"] < 0.2, f
    assert assess(f)["disturbed"]


def test_our_own_work_is_ours_not_another_process():
    # Spin until this process has used 0.6 s of CPU (not 0.6 s of wall: on a loaded machine a wall-clock spin
    # gets a fraction of a core), at most 10 s.
    with watch() as w:
        t, c = time.perf_counter(), time.process_time()
        while time.process_time() - c < 0.6 and time.perf_counter() - t < 10:
            pass
    assert w.figures["cpu_s"] > 0.3 and w.figures["wall_s"] >= 0.6
