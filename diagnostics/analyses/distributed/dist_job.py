"""DistJob: a plain, JSON round-trip description of one distributed profiling run.

It crosses from the dashboard's worker to every torchrun rank (as a file or inline JSON), so it
holds only plain values: the model as a ModelSpec dict, step counts, the backend and the
optional fault injections used for demos and tests.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from diagnostics.analyses.distributed import BACKENDS, DIE_HOWS
from diagnostics.errors import TorchScopeError

#: Process-group timeout: a collective that waits longer than this fails instead of hanging.
DEFAULT_PG_TIMEOUT_S = 60.0


class DistributedError(TorchScopeError):
    """A distributed run that could not start, failed on a rank or timed out."""


class DistributedInputError(DistributedError):
    """What was given cannot be used: a bad option, a missing folder, a folder without traces (CLI exit 2)."""


@dataclass(frozen=True)
class DistJob:
    spec: dict  # ModelSpec.to_dict()
    out_dir: str  # where every rank writes rank{R}.pt.trace.json and rank{R}.steps.json
    steps: int = 5  # profiled training steps
    warmup: int = 2  # steps run before the profiled ones (profiler warm-up included)
    backend: str = "auto"  # auto: nccl when every process on a node gets a GPU, else gloo
    pg_timeout_s: float = DEFAULT_PG_TIMEOUT_S
    threads: int = 1  # torch intra-op threads per rank (CPU)
    lr: float = 0.01
    straggler_rank: int | None = None  # inject: this rank sleeps straggler_sleep_ms in every step
    straggler_sleep_ms: float = 0.0
    die_rank: int | None = None  # inject: this rank exits (code 3) at step die_step
    die_step: int = 1
    die_how: str = "exit"  # "exit": os._exit(3); "kill": SIGKILL to itself, as the OOM killer would

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise DistributedInputError(f"unknown backend {self.backend!r}; choose one of {', '.join(BACKENDS)}")
        if int(self.steps) < 1:
            raise DistributedInputError(f"steps must be at least 1, got {self.steps}")
        if int(self.warmup) < 0:
            raise DistributedInputError(f"warmup must be >= 0, got {self.warmup}")
        if float(self.pg_timeout_s) <= 0:
            raise DistributedInputError(f"the process-group timeout must be positive, got {self.pg_timeout_s}")
        if self.die_how not in DIE_HOWS:
            raise DistributedInputError(f"unknown die_how {self.die_how!r}; choose one of {', '.join(DIE_HOWS)}")
        if float(self.straggler_sleep_ms) < 0:
            raise DistributedInputError(f"straggler sleep must be >= 0 ms, got {self.straggler_sleep_ms}")

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "DistJob":
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise DistributedInputError(f"the job description is not valid JSON: {e}") from None
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    @classmethod
    def from_arg(cls, arg: str) -> "DistJob":
        """``--job`` takes inline JSON or the path of a JSON file (handier on several nodes)."""
        text = arg.strip()
        if not text.startswith("{"):
            path = Path(text)
            if not path.is_file():
                raise DistributedInputError(f"--job {arg!r} is neither inline JSON nor an existing file")
            text = path.read_text()
        return cls.from_json(text)


def choose_backend(backend: str, nproc: int, gpu_count: int) -> tuple[str, str]:
    """(backend, why) for ``nproc`` processes on a machine with ``gpu_count`` CUDA GPUs.

    auto: nccl only when every process gets its own GPU (nproc <= gpu_count), else gloo on CPU (NCCL
    cannot put two ranks on one GPU). An explicit nccl that the GPUs cannot serve is refused.
    """
    nproc, gpu_count = int(nproc), int(gpu_count)
    gpus = f"{gpu_count} CUDA GPU{'' if gpu_count == 1 else 's'}"
    procs = f"{nproc} process{'' if nproc == 1 else 'es'}"
    if backend == "auto":
        if gpu_count <= 0:
            return "gloo", "auto: no CUDA GPU here, gloo on CPU"
        if nproc <= gpu_count:
            return "nccl", f"auto: {procs}, {gpus}: nccl, one GPU per process"
        return "gloo", (f"auto: {procs} but only {gpus} (nccl needs one GPU per process): gloo on CPU; "
                        f"use --nproc {gpu_count} for nccl")
    if backend == "nccl":
        if gpu_count <= 0:
            raise DistributedInputError("backend nccl needs CUDA GPUs; none is available here (use gloo)")
        if nproc > gpu_count:
            raise DistributedInputError(f"{nproc} NCCL processes need {nproc} GPUs; this machine has {gpu_count} "
                                        "(use gloo, or fewer processes)")
        return "nccl", "requested"
    if backend not in BACKENDS:
        raise DistributedInputError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    return backend, "requested"


def trace_path(out_dir, rank: int) -> Path:
    return Path(out_dir) / f"rank{rank}.pt.trace.json"


def steps_path(out_dir, rank: int) -> Path:
    return Path(out_dir) / f"rank{rank}.steps.json"


def status_path(out_dir, rank: int) -> Path:
    return Path(out_dir) / f"rank{rank}.status.json"
