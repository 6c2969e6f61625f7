"""The memory analysis: peak memory of inference and of a training step, what holds it, per layer,
over time, and an estimate before running (job.py)."""

from __future__ import annotations

from typing import Annotated, Any

from diagnostics.declare import Analysis, Option, column, metric, table
from diagnostics.measure.optimizers import OPTIMIZERS
from diagnostics.results import UNSET, Record, Result, UnsetType


class MemoryMetrics(Record, frozen=True, kw_only=True):
    """None: not measured (a model on the meta device is counted, not run), never 0."""

    peak_train_bytes: Annotated[int | None, metric("bytes", "Training-step peak", better="lower")]
    peak_inference_bytes: Annotated[int | None, metric("bytes", "Inference peak", better="lower")]
    reserved_train_bytes: Annotated[int | None, metric("bytes", "Reserved by the CUDA allocator (training)",
                                                       better="lower")]
    param_bytes: Annotated[int, metric("bytes", "Parameters", better="lower")]
    buffer_bytes: Annotated[int, metric("bytes", "Buffers")]
    grad_bytes: Annotated[int, metric("bytes", "Gradients", better="lower")]
    optimizer_state_bytes: Annotated[int, metric("bytes", "Optimizer state", better="lower")]
    #: only a model on the meta device, whose step is counted, not measured
    static_train_bytes: Annotated[int | UnsetType, metric(
        "bytes", "Weights + gradients + optimizer state",
        "counted without running (a model on the meta device); activations not included", better="lower")] = UNSET
    saved_activation_bytes: Annotated[int | None, metric("bytes", "Activations saved for backward", better="lower")]
    input_bytes: Annotated[int | None, metric("bytes", "Inputs")]
    estimate_bytes: Annotated[int | None, metric("bytes", "Estimate before running")]
    estimate_error_pct: Annotated[float | None, metric("percent", "Estimate error",
                                                       "(estimate - measured peak) / measured peak")]
    workspace_bytes: Annotated[int | None, metric("bytes", "CUDA workspaces", better="lower")]
    rss_bytes: Annotated[int | None, metric("bytes", "Worker resident memory", better="lower")]
    batch_size: Annotated[int | None, metric("count", "Batch size")]


class Peak(Record, frozen=True, kw_only=True):
    """One measured pass (measure.memory.Peak): its peak, what was allocated before it, how it was measured."""

    peak_bytes: int
    baseline_bytes: int
    reserved_bytes: int | None
    source: str


class Rss(Record, frozen=True, kw_only=True):
    start_bytes: int
    end_bytes: int
    source: str


class Parts(Record, frozen=True, kw_only=True):
    """Bytes by what holds them (parameters, gradients, optimizer state, activations, inputs, ...)."""

    parts: dict[str, int]
    source: str


class BreakdownAtPeak(Record, frozen=True, kw_only=True):
    """The profiler timeline's categories at the instant of its peak (plus what the measured peak has beyond)."""

    parts: dict[str, int]
    timeline_peak_bytes: int
    source: str
    at_ms: float


class MemoryTimeline(Record, frozen=True, kw_only=True):
    """Bytes per category over the training step: the profiler's timeline (``times_ms``), or, without it,
    the accounting at the phase boundaries (``phases_only``, ``labels``)."""

    series: dict[str, list[int]]
    source: str
    times_ms: tuple[float, ...] | UnsetType = UNSET
    phases_only: bool | UnsetType = UNSET
    labels: tuple[str, ...] | UnsetType = UNSET


class MemoryLayer(Record, frozen=True, kw_only=True):
    layer: str
    type: str
    is_leaf: bool
    output_bytes: Annotated[int, column("bytes", "output")]
    saved_bytes: Annotated[int, column("bytes", "saved for backward")]


class EstimateRow(Record, frozen=True, kw_only=True):
    name: str
    bytes: Annotated[int, column("bytes", "estimate")]
    error_pct: Annotated[float | None, column("percent", "error")]


class Estimate(Record, frozen=True, kw_only=True):
    """The estimate before running: parts scaled from small batches, compared with the measured peak."""

    parts: dict[str, int]
    total_bytes: int
    static_bytes: int
    saved_per_sample_bytes: float
    batches_measured: tuple[int, ...]
    saved_at_measured_batches: tuple[int, ...]
    method: str
    estimates: Annotated[tuple[EstimateRow, ...], table("Estimate against the measured peak")]
    measured_peak_bytes: int


class Snapshot(Record, frozen=True, kw_only=True):
    """The CUDA memory snapshot written for pytorch.org/memory_viz."""

    path: str
    file: str
    bytes: int
    note: str


class MemoryResult(Result, frozen=True, kw_only=True):
    """A measured step; or, for a model on the meta device (``meta``), the counted parts only: the measured
    parts are then unset."""

    model: str
    device: str
    options: dict[str, Any]
    batch_size: int | None
    meta: bool | UnsetType = UNSET
    metrics: MemoryMetrics
    inference: Peak | UnsetType = UNSET
    train: Peak | UnsetType = UNSET
    rss: Rss | UnsetType = UNSET
    breakdown_at_peak: BreakdownAtPeak | None | UnsetType = UNSET
    accounting: Parts
    layers: Annotated[tuple[MemoryLayer, ...] | UnsetType, table("Activation memory by layer")] = UNSET
    timeline: MemoryTimeline | UnsetType = UNSET
    #: the training step's phases (forward, backward, optimizer): [start, end] ms on the timeline
    phases_ms: dict[str, tuple[float, float]] | UnsetType = UNSET
    estimate: Estimate | UnsetType = UNSET
    snapshot: Snapshot | None | UnsetType = UNSET
    notes: tuple[str, ...]
    #: the modules the training step ran checkpointed (option checkpoint_modules); unset: none
    checkpointed: tuple[str, ...] | UnsetType = UNSET


ANALYSIS = Analysis(
    name="memory", title="Memory", target="diagnostics.analyses.memory.job:analyze", command="memory",
    exclusive=True, timeout_s=600, result=MemoryResult, view="ui.views.memory:show",
    report="diagnostics.render.charts.memory:memory_sections",
    description="peak memory of inference and a training step, what holds it, per layer and over time",
    options=(
        Option("optimizer", "choice", "adamw", "optimizer of the training step: its state counts towards the peak "
               "(SGD with momentum: 1 x the trainable parameters; AdamW: 2 x)", choices=OPTIMIZERS),
        Option("lr", "float", 1e-3, "learning rate", gt=0, label="Learning rate"),
        Option("timeline", "bool", True, "the memory timeline (slower: profiles with shapes and stacks)"),
        Option("checkpoint_modules", "str", "", "measure the training step with these modules checkpointed (names "
               "or fnmatch patterns, comma-separated, e.g. encoder.layers.0,encoder.layers.1): what the plan's "
               "budget answer picks", label="Checkpointed modules"),
    ),
)
