"""The plan's result, typed (diagnostics.results: one serialisation for the worker, the store, --json and
result.json; no torch): what ``analyze`` returns is a :class:`PlanResult`.

Categories of memory at a peak (``Row.parts``): parameters (and buffers), gradients, optimizer
state, activations (saved for backward, kept or recomputed by checkpointing), kv cache (inference),
temporaries, inputs,
rounding (CUDA's caching allocator: 512-byte blocks, and blocks it serves a request with without
splitting them), workspaces (CUDA: the cuBLAS / cuBLASLt workspaces a step's threads keep, and kernels'
own scratch at the peak). Their sum is ``peak_bytes``.
"""

from __future__ import annotations

from typing import Annotated, Any

from diagnostics.analyses.plan.targets import Target
from diagnostics.declare import column, metric, table
from diagnostics.results import UNSET, Record, Result, UnsetType

#: Row.parts keys, in the order charts and tables show them.
PART_KEYS = ("parameters", "gradients", "optimizer state", "activations", "kv cache", "temporaries", "inputs",
             "rounding", "workspaces")


class Row(Record, frozen=True, kw_only=True):
    """One configuration's prediction. ``how``: "traced" (this configuration ran on fake tensors),
    "fitted" (interpolated from traced neighbours, see sweep.py) or "failed" (``error`` says why). ``fits`` / ``headroom_bytes`` are for
    the result's device: headroom = capacity - context - peak (negative: over by that much). ``parts``:
    category (PART_KEYS) -> bytes at the peak."""

    batch: int
    seq: int | None
    dtype: str
    optimizer: str
    checkpointing: str
    shard: str
    ranks: int
    offload: bool
    mode: str
    peak_bytes: Annotated[int, column("bytes", "predicted peak")]
    parts: dict[str, int]
    phase: str
    module: str
    fits: bool
    headroom_bytes: Annotated[int, column("bytes", "headroom")]
    how: str = "traced"
    setting: str = ""
    host_bytes: Annotated[int, column("bytes", "host memory")] = 0
    recompute_flops: Annotated[int | None, column("flop", "recomputed FLOPs")] = None
    analytic: tuple[str, ...] = ()
    kv_dtype: str = "model"
    #: why this configuration could not be planned (then peak_bytes is 0 and fits False; the other rows stand);
    #: UNSET on a row that was planned
    error: str | UnsetType = UNSET

    @property
    def label(self) -> str:
        """Its setting, batch and sequence, short (charts, the CLI's table)."""
        return f"{self.setting} · b{self.batch}" + (f" · s{self.seq}" if self.seq is not None else "")


class Breakdown(Record, frozen=True, kw_only=True):
    """What holds one configuration's peak, a column per category (a category a peak lacks holds 0 bytes)."""

    configuration: str
    parameters: Annotated[int, column("bytes", "parameters")] = 0
    gradients: Annotated[int, column("bytes", "gradients")] = 0
    optimizer_state: Annotated[int, column("bytes", "optimizer state")] = 0
    activations: Annotated[int, column("bytes", "activations")] = 0
    kv_cache: Annotated[int, column("bytes", "kv cache")] = 0
    temporaries: Annotated[int, column("bytes", "temporaries")] = 0
    inputs: Annotated[int, column("bytes", "inputs")] = 0
    rounding: Annotated[int, column("bytes", "rounding")] = 0
    workspaces: Annotated[int, column("bytes", "workspaces")] = 0

    @classmethod
    def of(cls, row: Row) -> "Breakdown":
        return cls(configuration=f"{row.setting} · batch {row.batch}" + (f" · seq {row.seq}" if row.seq is not None
                                                                             else ""),
                   **{k.replace(" ", "_"): row.parts.get(k, 0) for k in PART_KEYS})


class MaxBatch(Record, frozen=True, kw_only=False):
    """The largest batch that fits at one sequence length for one setting; ``checked``: the traces at the
    boundary that confirmed it (that batch fits, the next one does not)."""

    setting: str
    seq: int | None
    max_batch: int
    peak_bytes: Annotated[int | None, column("bytes", "peak at that batch")]
    checked: str
    limit: int


class Grid(Record, frozen=True, kw_only=False):
    """Predicted peaks over batch x sequence for one setting (fitted from traced points, see sweep.py)."""

    setting: str
    batches: tuple[int, ...]
    seqs: tuple[int | None, ...]
    peak_bytes: tuple[tuple[int, ...], ...]  # [seq index][batch index]
    fits: tuple[tuple[bool, ...], ...]
    traced_points: tuple[tuple[int | None, ...], ...]  # ((batch, seq), ...) the fit used


class Suggestion(Record, frozen=True, kw_only=False):
    """A change that brings a configuration under the device's memory, with its predicted peak and cost."""

    change: str
    peak_bytes: Annotated[int, column("bytes", "predicted peak")]
    fits: bool
    headroom_bytes: int
    cost: str
    recompute_flops: Annotated[int | None, column("flop", "recomputed FLOPs per step")] = None
    batch: int | None = None
    seq: int | None = None
    setting: str = ""


class FitCandidate(Record, frozen=True, kw_only=True):
    """A module the budget answer may checkpoint: what it saves for backward in the unconstrained step, what
    recomputing its forward costs (measured here, or None where it was not: then ranked by FLOPs)."""

    module: str
    saved_bytes: Annotated[int, column("bytes", "saved for backward")]
    recompute_ms: Annotated[float | None, column("ms", "recompute time")]
    forward_flops: Annotated[int | None, column("flop", "forward FLOPs")] = None
    chosen: bool = False


class Fit(Record, frozen=True, kw_only=True):
    """The budget answer (fit.py): the modules to checkpoint so the configuration's predicted peak fits in
    ``budget_bytes`` at the least recompute time. ``checkpoint_modules`` are names ``--checkpoint-modules``
    takes (``memory --checkpoint-modules`` measures the choice). When nothing fits: ``smallest_peak_bytes``
    (every candidate checkpointed) and ``needed``: what else, traced at the budget."""

    budget_bytes: Annotated[int, column("bytes", "budget")]
    configuration: str
    batch: int
    seq: int | None
    unconstrained_peak_bytes: Annotated[int, column("bytes", "peak without checkpointing")]
    checkpoint_modules: tuple[str, ...]
    predicted_peak_bytes: Annotated[int, column("bytes", "predicted peak")]
    recompute_ms: Annotated[float | None, column("ms", "recompute time per step")]
    recompute_flops: Annotated[int | None, column("flop", "recomputed FLOPs per step")]
    fits: bool
    smallest_peak_bytes: Annotated[int | None, column("bytes", "smallest peak reachable")] = None
    needed: tuple[Suggestion, ...] = ()
    candidates: tuple[FitCandidate, ...] = ()
    timing: str = ""
    method: str = ""
    traces: int = 0

    @property
    def checkpoint_option(self) -> str:
        """The choice as ``--checkpoint-modules`` takes it."""
        return ",".join(self.checkpoint_modules)


class Timeline(Record, frozen=True, kw_only=True):
    """Memory by category over the first configuration's traced step: at most TIMELINE_POINTS samples (the
    highest op of each bucket), each op's index in the step, its phase, and bytes per category."""

    op_index: tuple[int, ...]
    phase: tuple[str, ...]
    series: dict[str, tuple[int, ...]]
    ops: int
    configuration: str = ""


class PlanMetrics(Record, frozen=True, kw_only=True):
    configs: Annotated[int, metric("count", "Configurations")]
    fitting_configs: Annotated[int, metric("count", "Configurations that fit")]
    min_peak_bytes: Annotated[int, metric("bytes", "Smallest predicted peak", better="lower")]
    max_peak_bytes: Annotated[int, metric("bytes", "Largest predicted peak", better="lower")]
    capacity_bytes: Annotated[int, metric("bytes", "Device memory")]
    traces: Annotated[int, metric("count", "Steps traced on fake tensors")]
    analytic_modules: Annotated[int, metric(
        "count", "Modules estimated analytically",
        "modules fake tracing failed in, estimated by a formula instead (named in the result)")]
    trace_seconds: Annotated[float, metric("s", "Time tracing")]


class PlanResult(Result, frozen=True, kw_only=True):
    model: str
    device: Target
    #: the options it ran with, validated (the declaration's keys)
    options: dict[str, Any]
    rows: Annotated[tuple[Row, ...], table("Predicted peak per configuration")]
    breakdown: Annotated[tuple[Breakdown, ...], table("What holds each peak")] = ()
    max_batch: Annotated[tuple[MaxBatch, ...], table("Largest batch that fits")] = ()
    grids: tuple[Grid, ...] = ()
    suggestions: Annotated[tuple[Suggestion, ...], table("Make it fit")] = ()
    timeline: Timeline | None = None
    #: module -> why fake tracing failed in it (estimated by a formula instead)
    analytic_modules: dict[str, str] = {}
    notes: tuple[str, ...] = ()
    metrics: PlanMetrics
    method: str = ""
    traced_on: str = ""
    #: the categories of memory, in the order the ledger counts them
    categories: tuple[str, ...] = ()
    #: the budget answer (option budget); unset without one
    fit: Fit | UnsetType = UNSET
