"""The run folder of an attached run: what the bootstrap inside the user's processes writes and the
analysis reads. Standard library only: the bootstrap loads this file by its path (it must not import
the engine inside the user's job), and the launcher and the analysis import it as a module.

Layout (RUN_DIR, given to every process of the job in ``RUN_DIR_ENV``)::

    config.json                  AttachConfig: what to profile (steps, --at K, stacks)
    window.json                  the window the deciding process chose: {"first": K, "last": K+N-1, ...}
    proc-<pid>/meta.json         one process that stepped: rank, boundary, optimizers, loaders, window, notes
    proc-<pid>/steps.jsonl       one line per step: number, start/end (perf_counter s), ms per phase, syncs
    proc-<pid>/status.json       phase and step now (the live counter), rewritten at most every STATUS_EVERY_S
    proc-<pid>/grads.json        per-parameter gradient sums of the profiled steps
    proc-<pid>/segments.json     the main thread's phase segments in the profiled steps, and the clock marks
    proc-<pid>/errors.jsonl      what failed inside the bootstrap (the job ran on, unprofiled from there)
    workers/<pid>.jsonl          DataLoader fetch + collate per batch, from every process that fetched
    trace.json.gz                the torch.profiler trace (one process), or rank<R>.pt.trace.json.gz per rank
    memory_snapshot.pickle       CUDA memory snapshot of the window (rank<R>.memory_snapshot.pickle per rank)
    oom_snapshot.pickle          CUDA memory snapshot taken when the allocator ran out (rank<R>.... per rank)

Times are ``time.perf_counter()`` seconds: CLOCK_MONOTONIC on Linux, one clock for every process of
the machine, so a worker's batch and the main process' step can be put side by side.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields

#: The environment variable that turns the bootstrap on in a process: the run folder.
RUN_DIR_ENV = "TORCHSCOPE_ATTACH_DIR"
#: Set by the bootstrap once it has run in a process (its children see it too): how deep we are.
ACTIVE_ENV = "TORCHSCOPE_ATTACH_ACTIVE"

CONFIG = "config.json"
WINDOW = "window.json"
PROC_PREFIX = "proc-"
META = "meta.json"
STEPS = "steps.jsonl"
STATUS = "status.json"
GRADS = "grads.json"
SEGMENTS = "segments.json"
ERRORS = "errors.jsonl"
WORKERS = "workers"
TRACE = "trace.json.gz"
SNAPSHOT = "memory_snapshot.pickle"
OOM_SNAPSHOT = "oom_snapshot.pickle"

#: The parts of a step, in the order they are shown. Each step's parts sum to its time: the main
#: thread's time goes to the innermost part it is in, and to ``host`` when in none.
#: ``evaluation``: top-level module calls under no_grad / inference_mode or in eval mode, in a training run
#: (an evaluation loop between two training steps is kept out of both: timed apart, never a step).
PHASES = ("data_wait", "forward", "backward", "optimizer", "comm", "sync", "evaluation", "host")
#: What ends a step, best first: the optimizer's step (every optimizer of one iteration counts once); with
#: no torch.optim optimizer, a backward and the parameter update after it ("manual update"); with no
#: backward, the end of the top-level module's forward (an inference loop); a DataLoader batch; else the
#: whole run as one time window.
BOUNDARIES = ("optimizer", "manual update", "forward", "batch", "time window")
#: The live phases of a run.
LIVE_PHASES = ("starting", "warming up", "profiling", "running", "done")

#: The live status is rewritten at most this often (seconds).
STATUS_EVERY_S = 0.25
#: Worker timing lines are flushed at least this often (seconds), and when a worker ends.
WORKER_FLUSH_S = 0.5


def rank_trace_name(rank: int | None) -> str:
    """The exported trace's file name: trace.json.gz for one process, rank<R>.pt.trace.json.gz per rank."""
    return TRACE if rank is None else f"rank{rank}.pt.trace.json.gz"


def rank_file(name: str, rank: int | None) -> str:
    """A per-rank file name (rank<R>.<name>) when a rank is known, else the name itself."""
    return name if rank is None else f"rank{rank}.{name}"


@dataclass(frozen=True)
class AttachConfig:
    """What the bootstrap profiles. ``at``: the first profiled step (None: after an automatic warm-up);
    ``steps``: how many; ``stacks``: Python stacks in the trace; ``max_warmup``: the warm-up ends here
    even if step times never settle; ``stable_tol``: the last ``stable_steps`` step times within this
    fraction of their median is "stable"; ``fallback_after_s``: seconds of forwards without an
    optimizer step or a backward before they are taken as an inference loop's steps; ``grads``:
    gradient statistics in the profiled steps."""

    steps: int = 5
    at: int | None = None
    stacks: bool = False
    min_warmup: int = 2
    max_warmup: int = 50
    stable_steps: int = 3
    stable_tol: float = 0.15
    fallback_after_s: float = 3.0
    grads: bool = True
    memory: bool = True

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "AttachConfig":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (d or {}).items() if k in names})

    def write(self, run_dir: str) -> None:
        with open(os.path.join(run_dir, CONFIG), "w") as f:
            json.dump(self.to_dict(), f)

    @classmethod
    def read(cls, run_dir: str) -> "AttachConfig":
        try:
            with open(os.path.join(run_dir, CONFIG)) as f:
                return cls.from_dict(json.load(f))
        except (OSError, ValueError):
            return cls()


def write_json(path: str, data) -> None:
    """Write JSON atomically (a reader never sees half a file)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, default=str)
    os.replace(tmp, path)


def read_json(path: str, default=None):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def read_jsonl(path: str) -> list:
    """Every whole line of a JSON-lines file (a line cut off by a crash is skipped)."""
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
    except OSError:
        pass
    return out
