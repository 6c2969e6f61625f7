"""The records of serving.serving: an inference server's iterations, phases and graph replays (µs)."""

from __future__ import annotations

from typing import Annotated

from diagnostics.declare import column, table
from diagnostics.results import UNSET, Record, UnsetType

_us = lambda label: column("us", label)  # noqa: E731


class ServingIteration(Record, frozen=True, kw_only=True):
    """One server iteration: its phase, batch and tokens where recorded, its time and the split of it
    (GPU time by what the kernels do, counted once; the GPU idle: ``queued_us`` while work the iteration had
    launched waited to start, ``host_us`` while nothing was launched yet, the GPU waiting on the host)."""

    iteration: int
    annotation: str
    phase: str | None
    phase_from: str | None
    batch_size: int | None
    tokens: int | None
    prefill_requests: int | None
    decode_requests: int | None
    start_us: Annotated[float, _us("start")]
    host_span_us: Annotated[float, _us("host span")]
    time_us: Annotated[float, _us("iteration")]
    gpu_span_us: Annotated[float, _us("GPU span")]
    gpu_busy_us: Annotated[float, _us("GPU busy")]
    kernels: int
    graph_launches: int
    graph_kernels: int
    attention_us: Annotated[float, _us("attention")]
    GEMM_us: Annotated[float, _us("GEMM")]
    communication_us: Annotated[float, _us("communication")]
    sampling_us: Annotated[float, _us("sampling")]
    other_us: Annotated[float, _us("other compute")]
    copies_us: Annotated[float, _us("copies")]
    host_us: Annotated[float, _us("host (GPU idle)")]
    #: the GPU idle while launched work waited to start (absent from results before it was told from host_us)
    queued_us: Annotated[float | UnsetType, _us("queued (launched, GPU idle)")] = UNSET


class ServingPhase(Record, frozen=True, kw_only=True):
    phase: str
    iterations: int
    median_us: Annotated[float, _us("median iteration")]
    median_gpu_busy_us: Annotated[float, _us("median GPU busy")]
    tokens: int
    batch_size_median: float | None


class GraphReplay(Record, frozen=True, kw_only=True):
    """A CUDA / HIP graph launch and the kernels it replayed (joined by its correlation id)."""

    launch_name: str
    launch_start_us: Annotated[float, _us("launch")]
    iteration: int
    kernels: int
    span_us: Annotated[float, _us("GPU span")]
    gpu_us: Annotated[float, _us("kernel time")]


class GraphReplays(Record, frozen=True, kw_only=True):
    launches: int
    kernels: int
    gpu_us: float
    share_of_gpu: float | None
    by_launch: tuple[GraphReplay, ...]


class Serving(Record, frozen=True, kw_only=True):
    """An inference server's trace read as iterations (vLLM, SGLang); absent for other traces."""

    available: bool
    reason: str | UnsetType = UNSET
    engine: str | None = None
    phase_source: str | UnsetType = UNSET
    iterations: Annotated[tuple[ServingIteration, ...], table("Serving iterations")] = ()
    phases: tuple[ServingPhase, ...] = ()
    graphs: GraphReplays | UnsetType = UNSET
    split: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
