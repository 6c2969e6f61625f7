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
    trace.json.gz                the torch.profiler trace (one process), or rank<R>.pt.trace.json.gz per rank;
                                 exported raw as trace.json (raw_trace_name), gzipped by the launcher
    memory_snapshot.pickle       CUDA memory snapshot of the window (rank<R>.memory_snapshot.pickle per rank)
    oom_snapshot.pickle          CUDA memory snapshot taken when the allocator ran out (rank<R>.... per rank)
    proc-<pid>/oom.json          the script died of out-of-memory: the failing allocation, what held memory, the
                                 budget answer (oom_kind / requested_bytes below say what counts as one)

Times are ``time.perf_counter()`` seconds: CLOCK_MONOTONIC on Linux, one clock for every process of
the machine, so a worker's batch and the main process' step can be put side by side.

The folder is the user's script's to write, so what is read back from it is read as
diagnostics.jobfiles reads a job's files (the same checks, here with the standard library only, as this
file is also loaded inside the user's processes): a regular file opened without following a link
(O_NOFOLLOW, its folder too) and without waiting on a FIFO (O_NONBLOCK), checked with fstat, of bounded
size. Anything else (a FIFO, a device, a socket, a link, a file past its bound) is not read: the reader
gets its default and, when it asks (``refused``), a line saying what was not read and why.
"""

from __future__ import annotations

import json
import os
import stat
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
#: ``run --plan``: the memory plan made inside the process at its first optimizer step's end (JSON)
PLAN = "plan.json"
#: the script died of out-of-memory (JSON, written by the agent's excepthook)
OOM = "oom.json"
#: The phases an out-of-memory error is placed in (the agent's parts, ``data_wait`` named ``data``).
OOM_PHASES = {"data_wait": "data", "forward": "forward", "backward": "backward", "optimizer": "optimizer",
              "evaluation": "evaluation", "comm": "comm", "sync": "sync", "host": "host"}

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

#: The live status is rewritten at most this often (seconds; a phase change is written at once). Each write
#: (a new file renamed into place) is 1-4 ms of the script's main thread on a VM's disk: once a second keeps
#: it near 0.1-0.4 % of the script's wall (four times a second read 1.6 %).
STATUS_EVERY_S = 1.0
#: Worker timing lines are flushed at least this often (seconds), and when a worker ends.
WORKER_FLUSH_S = 0.5


def oom_kind(type_name: str, message: str) -> str | None:
    """"cuda" or "cpu" when an exception is an allocator's out-of-memory error, else None: torch's
    OutOfMemoryError (torch.cuda.OutOfMemoryError is the same class) or "CUDA out of memory" in the message
    (CUDA); the CPU allocator's RuntimeError "DefaultCPUAllocator: can't allocate memory" (CPU). Python's own
    MemoryError is "cpu" too. Any other error, however it mentions memory, is not one."""
    if type_name == "OutOfMemoryError" or "CUDA out of memory" in message:
        return "cuda"
    if "can't allocate memory" in message and "CPUAllocator" in message or type_name == "MemoryError":
        return "cpu"
    return None


_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40, "PiB": 1 << 50}


def requested_bytes(message: str) -> tuple[int | None, bool]:
    """(bytes, exact) the failing allocation asked for, from the allocator's message: the CPU allocator's
    "you tried to allocate N bytes" (exact); CUDA's "Tried to allocate 3.20 GiB" (rounded by the message to
    two decimals: exact False). (None, False) when the message says neither."""
    import re

    m = re.search(r"tried to allocate (\d+) bytes", message)
    if m:
        return int(m.group(1)), True
    m = re.search(r"Tried to allocate (\d+(?:\.\d+)?) ?(B|KiB|MiB|GiB|TiB|PiB)\b", message)
    if m:
        n, unit = m.group(1), m.group(2)
        return int(round(float(n) * _UNITS[unit])), unit == "B" and "." not in n
    return None, False


def rank_trace_name(rank: int | None) -> str:
    """The exported trace's file name: trace.json.gz for one process, rank<R>.pt.trace.json.gz per rank."""
    return TRACE if rank is None else f"rank{rank}.pt.trace.json.gz"


def raw_trace_name(name: str) -> str:
    """The name the agent exports a trace under, as kineto writes it (JSON, no gzip): ``name`` less its ``.gz``.
    The launcher gzips it into ``name`` beside the running script (torch's own .gz export gzips line by line
    in Python inside the script: seconds of its wall on a large trace)."""
    return name[:-3] if name.endswith(".gz") else f"{name}.raw"


def rank_file(name: str, rank: int | None) -> str:
    """A per-rank file name (rank<R>.<name>) when a rank is known, else the name itself."""
    return name if rank is None else f"rank{rank}.{name}"


@dataclass(frozen=True)
class AttachConfig:
    """What the bootstrap profiles. ``at``: the first profiled step (None: after an automatic warm-up);
    ``steps``: how many; ``stacks``: Python stacks in the trace; ``shapes``: the operators' input shapes in the
    trace (no view of the run reads them: off unless asked, the window's steps, stop and export are cheaper and
    the trace smaller without them); ``max_warmup``: the warm-up ends here
    even if step times never settle; ``stable_tol``: the last ``stable_steps`` step times within this
    fraction of their median is "stable"; ``fallback_after_s``: seconds of forwards without an
    optimizer step or a backward before they are taken as an inference loop's steps; ``grads``:
    gradient statistics in the profiled steps; ``plan``: ``run --plan``'s text (None: no plan; "": the
    script's own configuration alone), planned in the process (analyses/plan/attached.py)."""

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
    plan: str | None = None
    shapes: bool = False

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
        got = read_json(os.path.join(run_dir, CONFIG), None)
        try:
            return cls.from_dict(got if isinstance(got, dict) else {})
        except TypeError:
            return cls()


def write_json(path: str, data) -> None:
    """Write JSON atomically (a reader never sees half a file)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, default=str)
    os.replace(tmp, path)


#: The most read back from one JSON file of the run folder (status, meta, window, grads, segments).
MAX_JSON_BYTES = 64 << 20
#: The most read back from one JSON-lines file (steps, errors, a worker's batches): long runs keep
#: their step lines bounded (the agent counts the rest), so a larger file is not the agent's.
MAX_JSONL_BYTES = 256 << 20

_READ = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
_FOLDER = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class NotRead(OSError):
    """A file of the run folder that is not read back: its message says which and why."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a folder"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def read_bytes(path: str, max_bytes: int) -> bytes:
    """The content of the regular file at ``path``; NotRead for anything else (a FIFO is never waited
    on, a link never followed, in the file's name or its folder's), or for a file over ``max_bytes``.
    FileNotFoundError (an OSError) when there is none."""
    folder, name = os.path.split(path)
    try:
        dfd = os.open(folder or ".", _FOLDER)
    except FileNotFoundError:
        raise
    except OSError as e:  # a link (ELOOP), a file (ENOTDIR)...
        raise NotRead(f"{folder} is not a folder of the run ({e.strerror}): {name} not read") from None
    try:
        try:
            fd = os.open(name, _READ, dir_fd=dfd)
        except FileNotFoundError:
            raise
        except OSError as e:
            try:
                mode = os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode
                why = _kind(mode)
            except OSError:
                why = e.strerror
            raise NotRead(f"{path} is {why}: not read") from None
    finally:
        os.close(dfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRead(f"{path} is {_kind(st.st_mode)}: not read")
        if st.st_size > max_bytes:
            raise NotRead(f"{path} is {st.st_size:,} bytes, over the {max_bytes:,} read back: not read")
        chunks, left = [], max_bytes + 1
        while left > 0:  # a file still growing is cut at the bound, not read forever
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        if left <= 0:
            raise NotRead(f"{path} grew past the {max_bytes:,} bytes read back: not read")
        return b"".join(chunks)
    finally:
        os.close(fd)


def _note(refused, e: OSError) -> None:
    if refused is not None and isinstance(e, NotRead):
        refused.append(str(e))


def read_json(path: str, default=None, refused: list | None = None, max_bytes: int = MAX_JSON_BYTES):
    """The JSON in the run folder's file ``path`` (read_bytes), or ``default`` when there is none, it is
    not whole JSON, or it is not read (then ``refused`` gets the reason)."""
    try:
        return json.loads(read_bytes(path, max_bytes))
    except OSError as e:
        _note(refused, e)
        return default
    except (ValueError, RecursionError):
        return default


def read_jsonl(path: str, refused: list | None = None, max_bytes: int = MAX_JSONL_BYTES) -> list:
    """Every whole line of a JSON-lines file (a line cut off by a crash is skipped); [] when the file
    is not there or not read (``refused`` gets the reason)."""
    try:
        data = read_bytes(path, max_bytes)
    except OSError as e:
        _note(refused, e)
        return []
    out = []
    for line in data.splitlines():
        try:
            out.append(json.loads(line))
        except (ValueError, RecursionError):
            continue
    return out
