"""An attached run's result, typed (diagnostics.results: one serialisation for the worker, the store, --json
and result.json).

The keys a user reads first (``--json``, result.json, History) are the issue's: exit_code, steps,
step_boundary, profiled_steps, step_ms, breakdown_ms, bottleneck, overhead_pct, trace, ranks,
findings; the rest is what the views draw (per-step rows, workers, syncs, gradients, memory, GPU).
What the bootstrap wrote about the script (its loaders, optimizers, modules) is typed as it writes it
(diagnostics.attach.agent). Two parts are another part's results, kept in their plain form (an analysis
never imports another's types): ``gradients``, a Gradient flow result, and ``ranks_view``, the trace
layer's Ranks view. Runs stored before this type (a dict per part) read back the same; a run with no step
stored ``{}`` for the parts only a step fills in, which read back as those parts with nothing in them.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from diagnostics.analyses.attach.protocol import PHASES
from diagnostics.declare import column, metric, table
from diagnostics.findings import Finding, FixFirst
from diagnostics.results import UNSET, Record, Result, UnsetType


class Bottleneck(Record, frozen=True, kw_only=True):
    """The part of the step that takes the most time: its name, its share of the step, its ms."""

    category: str
    share: float
    ms: float

    @classmethod
    def of(cls, breakdown: dict, step_ms: float | None) -> "Bottleneck | None":
        if not breakdown or not step_ms:
            return None
        cat = max(PHASES, key=lambda k: breakdown.get(k) or 0.0)
        ms = breakdown.get(cat) or 0.0
        return cls(category=cat, share=ms / step_ms if step_ms > 0 else 0.0, ms=ms)


class RankResult(Record, frozen=True, kw_only=True):
    """One process that stepped: its rank (None for a single process), pid, step time (median of the
    steps outside the window), the parts of its step (``breakdown_ms``: phase -> ms, PHASES), its
    bottleneck and where its trace is."""

    rank: int | None
    pid: int
    steps: int
    step_ms: Annotated[float | None, column("ms", "step")]
    breakdown_ms: dict[str, float]
    bottleneck: Bottleneck | None
    profiled_steps: tuple[int, ...] | None
    step_ms_profiled: float | None
    overhead_pct: float | None
    trace: str | None
    busy_ms: Annotated[float | None, column("ms", "busy")] = None
    waited_for: bool = False

    @property
    def label(self) -> str:
        return "this process" if self.rank is None else f"rank {self.rank}" + (" (waited for)" if self.waited_for
                                                                                 else "")


class StepRow(Record, frozen=True, kw_only=True):
    """One step: its time and each part's (they sum to it), ours, batches, memory; on a profiled step what
    the trace adds (GPU idle and kernel time, communication the light timing cannot see)."""

    step: int
    profiled: bool
    warmup: bool
    step_ms: Annotated[float, column("ms", "step")]
    data_wait_ms: Annotated[float, column("ms", "data_wait")]
    forward_ms: Annotated[float, column("ms", "forward")]
    backward_ms: Annotated[float, column("ms", "backward")]
    optimizer_ms: Annotated[float, column("ms", "optimizer")]
    comm_ms: Annotated[float, column("ms", "comm")]
    sync_ms: Annotated[float, column("ms", "sync")]
    #: runs stored before the evaluation part leave it unset (read as 0.0 by part_ms)
    evaluation_ms: Annotated[float | UnsetType, column("ms", "evaluation")] = UNSET
    host_ms: Annotated[float, column("ms", "host")]
    tool_ms: Annotated[float, column("ms", "ours")]
    batches: int | None = None
    peak_bytes: Annotated[int | None, column("bytes", "peak")] = None
    rss_bytes: Annotated[int | None, column("bytes", "resident (RSS)")] = None
    alloc_peak_bytes: Annotated[int | None | UnsetType, column("bytes", "allocator peak")] = UNSET
    trace_exposed_comm_ms: Annotated[float | UnsetType, column("ms", "exposed comm (trace)")] = UNSET
    gpu_idle_ms: Annotated[float | UnsetType, column("ms", "GPU idle")] = UNSET
    kernel_ms: Annotated[float | UnsetType, column("ms", "kernels")] = UNSET

    def part_ms(self, phase: str) -> float:
        """The step's time in ``phase`` (one of PHASES)."""
        v = getattr(self, f"{phase}_ms")
        return 0.0 if v is UNSET else v


if tuple(f[: -len("_ms")] for f in StepRow.__struct_fields__ if f.endswith("_ms"))[1:1 + len(PHASES)] != PHASES:
    raise ImportError("StepRow must have a <phase>_ms field per protocol.PHASES, in that order")


class Window(Record, frozen=True, kw_only=True):
    """The profiled window: its first and last step, why there, how many steps were asked for and profiled."""

    first: int | None = None
    last: int | None = None
    reason: str = ""
    note: str = ""
    requested_steps: int | None = None
    at: int | None = None
    steps_profiled: int = 0


class Overhead(Record, frozen=True, kw_only=True):
    """What profiling cost: the profiled steps against the others, and our own time between steps."""

    profiled_vs_outside_pct: float | None = None
    tool_outside_s: float = 0.0
    tool_outside_ms_per_step: float | None = None
    tool_outside_pct: float | None = None
    export_s: float | None = None
    tool_in_steps_ms: float | None = None
    #: our own work inside the profiled steps (the gradient statistics), kept out of their step time
    tool_in_profiled_steps_ms: float | None | UnsetType = UNSET
    #: [low, high] percent: where the profiled steps' difference falls from the steps' own spread alone
    noise_pct: tuple[float, float] | None | UnsetType = UNSET
    #: "cost" (slower beyond the spread) or "within noise" (a negative difference is never a cost);
    #: runs stored before these three leave them unset
    verdict: str | UnsetType = UNSET
    steps_outside: int = 0
    steps_profiled: int = 0


class Loader(Record, frozen=True, kw_only=True):
    """A DataLoader the script iterated, as the bootstrap saw it (what it did not record is None / empty)."""

    id: int
    batch_size: int | None = None
    num_workers: int | None = None
    pin_memory: bool | None = None
    persistent_workers: bool | None = None
    prefetch_factor: int | None = None
    drop_last: bool | None = None
    dataset: str = ""
    iter_starts_ms: tuple[float, ...] = ()
    iters: int = 0
    multiprocessing_context: str = ""
    len: int | None = None


class WorkerRow(Record, frozen=True, kw_only=True):
    worker: int
    batches: int
    fetch_collate_ms: Annotated[float | None, column("ms", "fetch + collate")]
    collate_ms: Annotated[float | None, column("ms", "collate")]
    samples_per_batch: int | float | None  # a median of counts


class Workers(Record, frozen=True, kw_only=True):
    """The DataLoader workers in the steady part of the run: each one's fetch + collate per batch, and whether
    they keep up (``workers_needed``: how many would supply a batch as fast as a step takes one)."""

    loader: Loader | None = None
    per_worker: Annotated[tuple[WorkerRow, ...], table("DataLoader workers")] = ()
    batches: int = 0
    fetch_collate_ms: float | None | UnsetType = UNSET
    collate_ms: float | None | UnsetType = UNSET
    batches_per_step: int | float | UnsetType = UNSET  # a median of counts
    step_compute_ms: float | UnsetType = UNSET
    num_workers: int | None | UnsetType = UNSET
    supply_interval_ms: float | UnsetType = UNSET
    demand_interval_ms: float | None | UnsetType = UNSET
    workers_needed: int | None | UnsetType = UNSET
    #: no workers: batches load in the main process, inside the step
    main_process: bool | UnsetType = UNSET


class Optimizer(Record, frozen=True, kw_only=True):
    """An optimizer the script stepped: its type, its parameter groups' hyperparameters (as torch names them),
    its parameters by dtype and device."""

    type: str
    module: str = ""
    params: int
    groups: tuple[dict[str, Any], ...] = ()
    param_dtypes: dict[str, int] = {}
    devices: dict[str, int] = {}
    order: int = 0

    @property
    def lr(self) -> float | None:
        lr = self.groups[0].get("lr") if self.groups else None
        return float(lr) if isinstance(lr, (int, float)) and not isinstance(lr, bool) else None


class RootModule(Record, frozen=True, kw_only=True):
    type: str
    params: int


class ScriptModel(Record, frozen=True, kw_only=True):
    """The script's model as the bootstrap found it: its top-level modules, parameters by dtype and device,
    the batch size, autocast (device -> dtype), the machine and the command line."""

    modules: tuple[RootModule, ...] = ()
    param_dtypes: dict[str, int] = {}
    devices: dict[str, int] = {}
    batch_size: int | None = None
    loader_batch_size: int | None = None
    autocast: dict[str, str] = {}
    cuda: bool | None = None
    device_name: str | None = None
    torch: str | None = None
    argv: tuple[str, ...] | None = None
    rank: int | None = None
    world_size: int | None = None


class SyncRow(Record, frozen=True, kw_only=True):
    """A line of the script that waited for the device, per step."""

    location: str
    calls_per_step: float
    ms_per_step: Annotated[float, column("ms", "ms per step")]
    calls: int


class HeldByModule(Record, frozen=True, kw_only=True):
    """What one top-level child module of the model held at an out-of-memory error (bytes of its tensors on
    the device that ran out, each storage once): ``(model)`` the model's own, ``(outside the model)`` an
    optimizer's parameters the model does not hold."""

    module: str
    parameters: Annotated[int, column("bytes", "parameters")] = 0
    buffers: Annotated[int, column("bytes", "buffers")] = 0
    gradients: Annotated[int, column("bytes", "gradients")] = 0
    optimizer_state: Annotated[int, column("bytes", "optimizer state")] = 0


class OomFit(Record, frozen=True, kw_only=True):
    """The planner's budget answer (analyses/plan/fit.py, its Fit's plain fields) for the script's step against
    the capacity of the device that ran out: what to checkpoint, the predicted peak; when nothing does, the
    smallest peak reachable and what else would be needed (``needed``: each change and its predicted peak)."""

    device: str = ""
    device_kind: str = ""
    budget_bytes: int
    budget_source: str = ""
    optimizer: str = ""
    configuration: str = ""
    batch: int | None = None
    unconstrained_peak_bytes: int | None = None
    checkpoint_modules: tuple[str, ...] = ()
    predicted_peak_bytes: int | None = None
    fits: bool = False
    smallest_peak_bytes: int | None = None
    needed: tuple[dict[str, Any], ...] = ()
    recompute_flops: int | None = None
    timing: str = ""
    notes: tuple[str, ...] = ()


class OutOfMemory(Record, frozen=True, kw_only=True):
    """The script died of out-of-memory. ``why``: the error; ``step`` and ``phase`` (forward, backward,
    optimizer, data, host; ``inside``: a part nested in it) where it happened; the failing allocation's size
    (``requested_bytes``: from the allocator's message, or CUDA's out-of-memory observer; ``requested_exact``
    False where the message rounds it); what held memory by category (``held_bytes``: parameters, buffers,
    gradients, optimizer state, activations and temporaries = ``total_bytes`` less the others, measured as
    ``total_how`` says) and by module; the planner's budget answer (``plan``) or why none (``plan_error``).
    Runs stored before the OOM report hold only why, step and the CUDA snapshot."""

    why: str
    step: int
    snapshot: str | None = None
    error: str | UnsetType = UNSET
    kind: str | UnsetType = UNSET
    phase: str | UnsetType = UNSET
    inside: str | None | UnsetType = UNSET
    module: str | None | UnsetType = UNSET
    requested_bytes: int | None | UnsetType = UNSET
    requested_exact: bool | UnsetType = UNSET
    held_bytes: dict[str, int | None] | UnsetType = UNSET
    total_bytes: int | None | UnsetType = UNSET
    total_how: str | UnsetType = UNSET
    by_module: tuple[HeldByModule, ...] | UnsetType = UNSET
    plan: OomFit | None | UnsetType = UNSET
    plan_error: str | None | UnsetType = UNSET
    held_error: str | None | UnsetType = UNSET
    #: what counting and planning delayed the script's end by (its excepthook, before the traceback is printed)
    seconds: float | None | UnsetType = UNSET


class Memory(Record, frozen=True, kw_only=True):
    """Memory over the profiled steps: the CUDA allocator's peak per step, else the process' resident memory."""

    cuda: bool = False
    peak_bytes_per_step: tuple[int, ...] = ()
    peak_bytes: int | None = None
    #: CPU: the allocator's peak per profiled step above the step's start (the profiler's allocation events)
    alloc_peak_bytes_per_step: tuple[int, ...] | UnsetType = UNSET
    #: the process' resident memory at the end of each profiled step (RSS: not the step's own memory)
    rss_bytes_per_step: tuple[int, ...] = ()
    snapshot: str | None = None
    oom: OutOfMemory | None = None
    #: why there is no allocator peak
    note: str | UnsetType = UNSET


class PlanRow(Record, frozen=True, kw_only=True):
    """One configuration of ``run --plan``: a batch (``scale``: "1x", "2x" or a size) in a dtype, at the
    script's sequence lengths or others (``seq``: "2x", "1024"; ``inputs``: the row's shapes), unsharded or
    sharded (``shard`` over ``ranks``, the batch per rank; ``per_rank``: the traced ranks' peaks), its
    predicted peak and parts, or why it could not be planned (``error``)."""

    scale: str
    batch: int
    dtype: str
    seq: str = ""
    inputs: tuple[str, ...] = ()
    shard: str = ""
    ranks: int = 1
    per_rank: dict[str, int] = {}
    #: the script's own batch, dtype and lengths, unsharded: the row set beside the measured peak
    as_run: bool = False
    peak_bytes: int | None = None
    parts: dict[str, int] = {}
    phase: str = ""
    module: str = ""
    fits: bool | None = None
    #: the (fake) model's parameters, gradients and optimizer state in the step (one rank's when sharded)
    parameter_bytes: int | None = None
    gradient_bytes: int | None = None
    state_bytes: int | None = None
    error: str | None = None


class RunPlan(Record, frozen=True, kw_only=True):
    """``run --plan``: the memory plan of the script's own job, made in its process at the first optimizer
    step's end on fake copies of its model and optimizer (analyses/plan/attached.py), and the peak the run
    measured beside the as-run row: on CUDA the largest per-step ``max_memory_allocated``; on the CPU what
    the script's tensors held at that boundary (``held_bytes``) plus the allocator's median per-step peak
    above the step's start. ``gap_pct``: (predicted - measured) / measured."""

    spec: str = ""
    device: str = ""
    device_kind: str = ""
    budget_bytes: int | None = None
    optimizer: str = ""
    dtype: str = ""
    inputs: tuple[str, ...] = ()
    batch: int | None = None
    #: the loss the plan's backward starts from (the script's, recognised and replayed, or a stand-in, said so)
    loss: str = ""
    held_bytes: dict[str, int] = {}
    rows: tuple[PlanRow, ...] = ()
    seconds: float | None = None
    measured_peak_bytes: int | None = None
    measured_how: str = ""
    gap_pct: float | None = None
    notes: tuple[str, ...] = ()
    error: str | None = None


class GpuStep(Record, frozen=True, kw_only=True):
    step: int
    step_ms: float
    gpu_busy_ms: float
    kernel_ms: float
    gpu_idle_ms: float
    kernels: int
    #: what the host's main thread was doing while the GPU idled: phase (or "between steps") -> ms
    idle_causes_ms: dict[str, float]


class Gpu(Record, frozen=True, kw_only=True):
    """The GPU in the profiled steps (from the trace): busy and idle per step, and why it idled."""

    steps: tuple[GpuStep, ...]
    idle_ms_per_step: float | None
    kernel_ms_per_step: float | None
    kernels_per_step: int | float | None  # a median of counts
    kernel_us_median: float | None
    idle_causes_ms_per_step: dict[str, float]
    #: the host's phases could be put on the trace's clock (else the causes are all "between steps")
    clock_placed: bool


class Evaluation(Record, frozen=True, kw_only=True):
    """Evaluation in a training run: top-level module calls under no_grad / inference_mode or in eval mode.
    An evaluation loop between two training steps is a period of its own, outside every step."""

    forwards: int = 0
    forward_ms: float = 0.0
    periods: int = 0
    period_ms: float = 0.0


class BootstrapError(Record, frozen=True, kw_only=True):
    """The bootstrap failed inside the script's process (the job ran on, unprofiled from there)."""

    pid: int
    where: str
    error: str
    traceback: str = ""
    step: int | None = None


def _part_ms(phase: str, more: str = ""):
    """The type of a metric field holding one part of the step (PHASES): its median ms per step."""
    words = phase.replace("_", " ")
    return Annotated[float | None | UnsetType, metric("ms", words.capitalize(), f"median {words} per step{more}",
                                                      better="lower")]


class AttachMetrics(Record, frozen=True, kw_only=True):
    # the headline process' figures; a run without a step has none of them but its exit code, ranks and steps
    step_ms: Annotated[float | None | UnsetType, metric(
        "ms", "Step time", "median step outside the profiled window, after warm-up", better="lower")] = UNSET
    data_wait_ms: _part_ms("data_wait") = UNSET
    forward_ms: _part_ms("forward") = UNSET
    backward_ms: _part_ms("backward") = UNSET
    optimizer_ms: _part_ms("optimizer") = UNSET
    comm_ms: _part_ms("comm") = UNSET
    sync_ms: _part_ms("sync") = UNSET
    evaluation_ms: _part_ms("evaluation", " (evaluation forwards inside training steps)") = UNSET
    host_ms: _part_ms("host", " (the rest of the step)") = UNSET
    bottleneck_share: Annotated[float | None | UnsetType, metric(
        "fraction", "Bottleneck share", "the largest part's share of the step")] = UNSET
    step_ms_profiled: Annotated[float | None | UnsetType, metric(
        "ms", "Profiled step", "median step in the profiled window")] = UNSET
    overhead_pct: Annotated[float | None | UnsetType, metric(
        "percent", "Profiler overhead", "profiled steps against the steps outside the window", better="lower")] = UNSET
    steps: Annotated[int, metric("count", "Steps seen")]
    profiled_steps: Annotated[int | UnsetType, metric("count", "Profiled steps")] = UNSET
    ranks: Annotated[int, metric("count", "Processes that stepped")]
    exit_code: Annotated[int | None, metric("number", "Exit code")]
    gpu_idle_ms: Annotated[float | None | UnsetType, metric("ms", "GPU idle per step", better="lower")] = UNSET
    kernel_ms: Annotated[float | None | UnsetType, metric("ms", "Kernel time per step")] = UNSET
    peak_memory_bytes: Annotated[int | UnsetType, metric(
        "bytes", "Peak memory", "largest per-step CUDA peak in the window", better="lower")] = UNSET
    findings_failed: Annotated[int | UnsetType, metric("count", "Findings failed", better="lower")] = UNSET
    findings_warned: Annotated[int | UnsetType, metric("count", "Findings warned", better="lower")] = UNSET


class AttachResult(Result, frozen=True, kw_only=True):
    exit_code: int | None
    status: str  # ok | failed (the script exited non-zero) | interrupted | no steps
    command: tuple[str, ...]
    cwd: str
    duration_s: float | None
    steps: int
    step_boundary: str | None
    step_boundary_detail: str
    profiled_steps: tuple[int, ...] | None
    step_ms: float | None
    step_ms_profiled: float | None
    #: phase (PHASES) -> median ms per step; they sum to step_ms (empty: no step was measured)
    breakdown_ms: dict[str, float]
    bottleneck: Bottleneck | None
    overhead_pct: float | None
    #: the trace file's absolute path (one process), one per rank, or None (the script ended before the window);
    #: runs stored before paths were absolute hold the file's name in run_dir
    trace: str | tuple[str, ...] | None
    ranks: Annotated[tuple[RankResult, ...], table("Ranks")] = ()
    waited_for_rank: int | None = None
    window: Window = Window()
    overhead: Overhead = Overhead()
    step_table: Annotated[tuple[StepRow, ...], table("Steps")] = ()
    workers: Workers = Workers()
    loaders: tuple[Loader, ...] = ()
    optimizers: tuple[Optimizer, ...] = ()
    #: the script's model (not the label of a model TorchScope loaded: an attached run has none)
    model: ScriptModel = ScriptModel()
    syncs: Annotated[tuple[SyncRow, ...], table("Device syncs")] = ()
    memory: Memory = Memory()
    #: ``run --plan``'s rows (unset: no plan asked for, and runs stored before it keep exactly their keys)
    plan: RunPlan | None | UnsetType = UNSET
    gpu: Gpu | None = None
    #: runs stored before evaluation was told apart leave it unset
    evaluation: Evaluation | UnsetType = UNSET
    #: a Gradient flow result (its plain form) of the profiled steps' gradients: gradients(result) gives it whole
    gradients: dict[str, Any] | None = None
    #: the trace layer's Ranks view over the ranks' traces (plain; diagnostics.trace.ranks), or {"error": ...}
    ranks_view: dict[str, Any] | None = None
    findings: Annotated[tuple[Finding, ...], table("Findings")] = ()
    fix_first: Annotated[tuple[FixFirst, ...], table("Fix this first")] = ()
    notes: tuple[str, ...] = ()
    errors: tuple[BootstrapError, ...] = ()
    metrics: AttachMetrics
    artifacts: tuple[str, ...] = ()
    run_id: str | None = None
    run_dir: str = ""

    def with_notes(self, notes) -> "AttachResult":
        """The result with ``notes`` in place of its own (the session adds how the run ended)."""
        return msgspec.structs.replace(self, notes=tuple(notes))


def gradient_flow(result: AttachResult) -> dict | None:
    """The run's gradients as a whole Gradient flow result (plain, for that analysis' view and report: decode it
    with its declaration): the stored gradients, with the optimizer, the steps and the devices they were read
    under (runs stored before this carried them in the other fields)."""
    g = result.gradients
    if not g:
        return None
    opt = result.optimizers[0] if result.optimizers else None
    lr = opt.lr if opt is not None else None
    return {**g, "options": {"steps": g["metrics"]["steps"], "optimizer": opt.type if opt else "?",
                             "lr": lr if lr is not None else float("nan")},
            "model": "the script's model", "device": ", ".join(result.model.devices) or "?"}
