"""Execute a job (spec + analysis + options) in a worker process and return plain data.

The worker is a fresh ``spawn`` process: a crash, hang, abort or runaway allocation in user code
ends the worker, never the dashboard. The parent enforces the timeout, a memory cap (RLIMIT_AS on
CPU jobs, an RSS watchdog on all; both count from the worker's footprint once torch is loaded),
cancellation, and a per-device queue for jobs that time the device, so two sessions do not distort
each other's figures. The worker's stdout/stderr are drained
by a thread into a log file in the run's artifact folder (its first LOG_HEAD_BYTES and last
LOG_TAIL_BYTES), so a model that prints megabytes neither blocks nor fills the disk; the log's
last lines shown with a failure come from that pipe, never from a file. The job writes a staging
folder of its own (``jobfiles.JOB_FOLDER``) under a disk quota and a file-count limit; once it is
gone, its regular files are moved into the run's folder (``jobfiles.collect``). The worker
dies with the thread that started it (PR_SET_PDEATHSIG on Linux). A job is stopped by setting its
``cancel`` event (the CLI's Ctrl-C, the dashboard's Cancel: ui.background), or by an exception in
the calling thread; either way its worker is killed and the run is stored as 'cancelled'.

The parts, each importing only those listed before it, and only their public names:

* ``job``: Job, JobOutcome, AnalysisContext, ``execute`` (a job run in this process).
* ``logs``: worker.log, drained from the worker's pipe (head and tail kept), and its tail.
* ``limits``: the memory cap, the job's resident memory and /dev/shm (``MemoryWatch``), killing the worker's tree.
* ``worker``: starting a cold worker, the worker process' entry (``job_main``), the caps applied inside it, how a
  failure is classified.
* ``spare_pool``: the spare workers kept ahead of their jobs (``keep_spares``, ``spares``).
* ``device_lock``: ``device_queue``, one timed job per device at a time.
* ``run``: ``run_job``, which stores the run and supervises its worker.

This package re-exports what the rest of the code uses; a test that replaces a function the runner
calls patches the module that owns it (``diagnostics.runner.run``, ``.spare_pool``...): the
package's names are copies of them.
"""

from __future__ import annotations

from diagnostics.runner.device_lock import device_queue
from diagnostics.runner.job import (CANCELLED_MESSAGE, META_ANALYSES, AnalysisContext, Job, JobOutcome, PartialFn,
                                    ProgressFn, execute)
from diagnostics.runner.limits import DEFAULT_MEMORY_SHARE, MEMORY_LIMIT_ENV
from diagnostics.runner.logs import LOG_HEAD_BYTES, LOG_TAIL_BYTES, LOG_TAIL_CHARS, stat_is_regular
from diagnostics.runner.run import DISK_CHECK_S, INTERRUPTED_MESSAGE, TIMEOUT_ENV, run_job
from diagnostics.runner.spare_pool import (MAX_SPARE_WORKERS, REFILL_DELAY_S, SPARE_NAME, SPARE_PRELOAD, SPARE_WORKERS,
                                       SPARES_ENV, WARM_LOG_LINE, WORKER_NAME, SparePool, keep_spares,
                                       spare_setting, spares, spawn_environment)

__all__ = [
    "AnalysisContext", "CANCELLED_MESSAGE", "DEFAULT_MEMORY_SHARE", "DISK_CHECK_S", "INTERRUPTED_MESSAGE", "Job",
    "JobOutcome", "LOG_HEAD_BYTES", "LOG_TAIL_BYTES", "LOG_TAIL_CHARS", "MAX_SPARE_WORKERS", "MEMORY_LIMIT_ENV",
    "META_ANALYSES", "PartialFn", "ProgressFn", "REFILL_DELAY_S", "SPARE_NAME", "SPARE_PRELOAD", "SPARE_WORKERS",
    "SPARES_ENV", "SparePool", "TIMEOUT_ENV", "WARM_LOG_LINE", "WORKER_NAME", "device_queue", "execute",
    "keep_spares", "run_job", "spare_setting", "spares", "spawn_environment", "stat_is_regular",
]
