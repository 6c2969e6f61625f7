"""The profile analysis: a torch.profiler run of inference or training steps, latency measured
outside the profiler, and the operator / step / module / kernel / timeline views (job.py)."""

from __future__ import annotations

from typing import Annotated, Any

from diagnostics.declare import Analysis, Option, column, metric, table
from diagnostics.results import UNSET, ModelInput, Record, Result, UnsetType
from diagnostics.trace.records.timeline import Timeline, from_legacy, is_legacy

MODES = ("inference", "train")
OPTIMIZERS = ("sgd", "adamw")
ACTIVITIES = ("cpu", "cuda")
#: The schedule runs at most this many steps ((wait + warmup + active) x repeat).
MAX_PROFILED_STEPS = 200
MAX_LATENCY_ITERS = 10_000
TIMELINE_MAX_EVENTS = 4000

class ProfileMetrics(Record, frozen=True, kw_only=True):
    latency_median_ms: Annotated[float, metric("ms", "Latency (median)", "per step, measured outside the profiler",
                                               better="lower")]
    latency_p90_ms: Annotated[float, metric("ms", "Latency p90", better="lower")]
    latency_p99_ms: Annotated[float, metric("ms", "Latency p99", better="lower")]
    latency_std_ms: Annotated[float, metric("ms", "Latency std", better="lower")]
    throughput_samples_per_s: Annotated[float | None, metric("per_s", "Throughput",
                                                             "samples per second at the median latency",
                                                             better="higher")]
    profiled_steps: Annotated[int, metric("count", "Profiled steps")]
    step_time_mean_ms: Annotated[float | None, metric("ms", "Profiled step time (mean)",
                                                      "inside the profiler: includes its overhead", better="lower")]
    #: None: not measured (overhead_rounds 0)
    profiler_overhead_pct: Annotated[float | None, metric(
        "percent", "Profiler overhead", "a profiled step over an unprofiled one, minus 1: both timed in the same "
        "interleaved rounds (the geometric mean of the rounds' ratios)", better="lower",
        interval=("profiler_overhead_ci_low", "profiler_overhead_ci_high"))]
    profiler_overhead_ci_low: Annotated[float | None, metric("percent", "Profiler overhead interval, low")]
    profiler_overhead_ci_high: Annotated[float | None, metric("percent", "Profiler overhead interval, high")]
    self_cpu_total_ms: Annotated[float, metric("ms", "Self CPU time (sum)", better="lower")]
    self_device_total_ms: Annotated[float, metric("ms", "Self device time (sum)", better="lower")]
    kernel_time_ms: Annotated[float, metric("ms", "GPU kernel time", better="lower")]
    tensor_core_kernel_pct: Annotated[float | None, metric("percent", "Kernel time on Tensor Cores",
                                                           better="higher")]
    peak_device_memory_bytes: Annotated[int | None, metric("bytes", "Peak device memory", better="lower")]
    #: the roofline's figures: None without it (roofline off, or not available: the notes say why)
    mfu: Annotated[float | None, metric("fraction", "MFU", "model FLOPs per step / median latency / the measured "
                                                           "GEMM peak", better="higher")]
    model_flops_per_step: Annotated[int | None, metric("flop", "Model FLOPs per step", "FlopCounterMode, one step")]
    peak_flops: Annotated[float | None, metric("flop_per_s", "Measured GEMM peak")]
    bandwidth_bytes_per_s: Annotated[float | None, metric("bytes_per_s", "Measured memory bandwidth")]
    roofline_headroom_ms: Annotated[float | None, metric("ms", "Time above the roofs per step",
                                                         "sum over ops of time minus time at the roof",
                                                         better="lower")]
    profile_wall_s: Annotated[float, metric("s", "Profiler wall time")]
    batch_size: Annotated[int | None, metric("count", "Batch size")]


class Latency(Record, frozen=True, kw_only=True):
    """The step's latency outside the profiler (measure.timer.latency_stats of ``samples_ms``)."""

    median_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    std_ms: float
    min_ms: float
    max_ms: float
    cv: float | None
    samples_per_s: float | None
    iterations: int
    samples_ms: tuple[float, ...]
    method: str
    warmup: int


class StepRow(Record, frozen=True, kw_only=True):
    cycle: int
    step: int
    step_ms: Annotated[float, column("ms", "step")]
    zero_grad_ms: Annotated[float, column("ms", "zero_grad")]
    forward_ms: Annotated[float, column("ms", "forward")]
    backward_ms: Annotated[float, column("ms", "backward")]
    optimizer_ms: Annotated[float, column("ms", "optimizer")]
    other_ms: Annotated[float, column("ms", "other")]


class SplitRow(Record, frozen=True, kw_only=True):
    """A step's window split as the TensorBoard plugin does: kernel / memcpy / memset / runtime / CPU / other."""

    cycle: int
    step: int
    window_ms: Annotated[float, column("ms", "window")]
    kernel_ms: Annotated[float, column("ms", "kernel")]
    memcpy_ms: Annotated[float, column("ms", "memcpy")]
    memset_ms: Annotated[float, column("ms", "memset")]
    runtime_ms: Annotated[float, column("ms", "runtime")]
    cpu_exec_ms: Annotated[float, column("ms", "cpu_exec")]
    other_ms: Annotated[float, column("ms", "other")]


class Overhead(Record, frozen=True, kw_only=True):
    """The profiler's own cost: a profiled step against an unprofiled one, interleaved rounds."""

    pct: float
    ci: tuple[float, float] | None  # None: too few rounds for an interval (``note`` says so)
    rounds: int
    note: str | None
    profiled_round_ms: tuple[float, ...]
    unprofiled_round_ms: tuple[float, ...]


class OperatorRow(Record, frozen=True, kw_only=True):
    """key_averages of the profiled steps, summed over cycles (times in ms, memory in bytes)."""

    name: str
    calls: Annotated[int, column("count", "calls")]
    self_cpu_ms: Annotated[float, column("ms", "self CPU")]
    cpu_total_ms: Annotated[float, column("ms", "CPU total")]
    self_device_ms: Annotated[float, column("ms", "self device")]
    device_total_ms: Annotated[float, column("ms", "device total")]
    self_cpu_memory_bytes: Annotated[int, column("bytes", "self CPU memory")]
    cpu_memory_bytes: Annotated[int, column("bytes", "CPU memory")]
    self_device_memory_bytes: Annotated[int, column("bytes", "self device memory")]
    device_memory_bytes: Annotated[int, column("bytes", "device memory")]
    #: only in the by-shape table
    input_shapes: str | UnsetType = UNSET
    self_cpu_pct: Annotated[float, column("percent", "self CPU share")]
    self_device_pct: Annotated[float, column("percent", "self device share")]
    mean_cpu_ms: Annotated[float, column("ms", "mean CPU per call")]


class ModuleRow(Record, frozen=True, kw_only=True):
    """Per module: forward time from its module:: ranges, backward from autograd's; with the roofline,
    its FLOPs per step, MFU and the ops under it whose FLOPs were not counted."""

    name: str
    parent: str | None
    type: str
    calls: Annotated[int, column("count", "calls")]
    forward_ms: Annotated[float, column("ms", "forward")]
    forward_self_ms: Annotated[float, column("ms", "forward self")]
    backward_ms: Annotated[float, column("ms", "backward")]
    backward_self_ms: Annotated[float, column("ms", "backward self")]
    flops: int | None | UnsetType = UNSET
    mfu: float | None | UnsetType = UNSET
    flops_not_counted: str | None | UnsetType = UNSET


class KernelRow(Record, frozen=True, kw_only=True):
    name: str
    calls: Annotated[int, column("count", "calls")]
    total_us: Annotated[float, column("us", "total")]
    max_us: Annotated[float, column("us", "max")]
    min_us: Annotated[float, column("us", "min")]
    grid: str | None
    block: str | None
    registers_per_thread: int | None
    occupancy_pct: Annotated[float | None, column("percent", "achieved occupancy")]
    tensor_cores: bool
    mean_us: Annotated[float, column("us", "mean")]
    pct_of_kernel_time: Annotated[float, column("percent", "share of kernel time")]


class RooflineRow(Record, frozen=True, kw_only=True):
    """One operator on the roofline: its work per step, its time, and its time at this machine's roof."""

    op: str
    calls: int
    flops: Annotated[int, column("flop", "FLOPs per step")]
    bytes: Annotated[int, column("bytes", "bytes moved per step")]
    time_ms: Annotated[float, column("ms", "time per step")]
    achieved_tflops: Annotated[float, column("number", "achieved TFLOP/s")]
    achieved_bytes_per_s: float
    intensity: Annotated[float | None, column("number", "FLOP per byte")]
    roof_tflops: float
    bound: str
    roof_ms: Annotated[float, column("ms", "time at the roof")]
    memory_roof: str
    headroom_ms: Annotated[float, column("ms", "headroom")]
    pct_of_roof: float
    above_roof: bool
    flops_not_counted: bool


class Datasheet(Record, frozen=True, kw_only=True):
    gpu: str
    peak_flops: float
    bandwidth_bytes_per_s: float


class Roofs(Record, frozen=True, kw_only=True):
    """This machine's ceilings (measure.roofline.measure_roofs)."""

    device: str
    device_name: str
    dtype: str
    threads: int
    peak_flops: float
    bandwidth_bytes_per_s: float
    cache_bandwidth_bytes_per_s: float
    cache_op_bytes: int
    #: [bytes moved per call, bytes per second]
    bandwidth_curve: tuple[tuple[int, float], ...]
    gemm_rates: dict[str, float]
    ridge_intensity: float
    method: str
    datasheet: Datasheet | None


class NotCounted(Record, frozen=True, kw_only=True):
    """An op the FLOP count left out, with its measured time per step and share of all op time."""

    op: str
    calls: int
    modules: tuple[str, ...]
    time_ms: float | None
    pct_of_time: float | None


class Artifacts(Record, frozen=True, kw_only=True):
    trace_json: str
    trace_json_gz: str
    tb_zip: str


class ProfileResult(Result, frozen=True, kw_only=True):
    model: str
    device: str
    batch_size: int | None
    mode: str
    #: the options as run (activities resolved)
    config: dict[str, Any]
    cuda_ran: bool
    inputs: tuple[ModelInput, ...]
    loss: str | None  # training steps only
    metrics: ProfileMetrics
    latency: Latency
    timing_cv: float | None
    steps: Annotated[tuple[StepRow, ...], table("Steps")]
    device_split: Annotated[tuple[SplitRow, ...], table("Step split (kernel / memcpy / memset / runtime / CPU)")]
    profiler_overhead: Overhead | None
    operators: Annotated[tuple[OperatorRow, ...], table("Operators (summed over the profiled steps)")]
    operators_by_shape: Annotated[tuple[OperatorRow, ...] | None, table("Operators by input shape")]
    modules: Annotated[tuple[ModuleRow, ...], table("Modules")]
    modules_note: str | None
    kernels: Annotated[tuple[KernelRow, ...], table("GPU kernels")]
    #: the last cycle's timeline (diagnostics.trace.profiler_tables.timeline: the trace layer's, with input
    #: shapes), the record the Trace explorer's results hold, drawn by render.charts.timeline
    timeline: Timeline
    roofline: Annotated[tuple[RooflineRow, ...], table("Roofline per operator")]
    roofs: Roofs | None
    artifacts: Artifacts
    notes: tuple[str, ...]
    flops_not_counted: tuple[NotCounted, ...]
    roofline_unavailable: str | UnsetType = UNSET
    torch_version: str

    @classmethod
    def upgrade(cls, plain: dict) -> dict:
        """Runs stored before the timeline was typed hold it in ms with lanes as labels: read as a Timeline."""
        if is_legacy(plain.get("timeline")):
            return {**plain, "timeline": from_legacy(plain["timeline"])}
        return plain


ANALYSIS = Analysis(
    name="profile", title="Profiler", target="diagnostics.analyses.profile.job:analyze", command="profile",
    exclusive=True, timeout_s=600, result=ProfileResult, view="ui.views.profiler:show",
    report="diagnostics.render.charts.profiler:profile_sections",
    description="torch.profiler run: latency, operators, steps, modules, kernels, timeline and the Chrome trace",
    options=(
        Option("mode", "choice", "inference", "profile inference (eval + inference_mode) or training steps "
               "(forward, loss, backward, optimizer)", choices=MODES),
        Option("optimizer", "choice", "sgd", "optimizer of training steps", choices=OPTIMIZERS),
        Option("lr", "float", 0.01, "learning rate of training steps", gt=0, label="Learning rate"),
        Option("wait", "int", 1, "schedule: steps run without the profiler first", lo=0, hi=MAX_PROFILED_STEPS),
        Option("warmup", "int", 1, "schedule: profiled steps that are discarded (the profiler warms up)",
               lo=0, hi=MAX_PROFILED_STEPS),
        Option("active", "int", 3, "schedule: recorded steps per cycle", lo=1, hi=MAX_PROFILED_STEPS,
               flag="--steps"),
        Option("repeat", "int", 1, "schedule: cycles of wait + warmup + active", lo=1, hi=MAX_PROFILED_STEPS),
        Option("activities", "multi", None, "what to record (default: cpu, plus cuda when the model runs on a "
               "CUDA device)", choices=ACTIVITIES, optional=True),
        Option("record_shapes", "bool", True, "input shapes per operator (enables the by-shape table)"),
        Option("profile_memory", "bool", False, "memory allocated per operator"),
        Option("with_stack", "bool", False, "Python stacks in the trace (slower, larger trace)"),
        Option("with_modules", "bool", True, "a range per module's forward: per-module times and the module tree"),
        Option("latency_warmup", "int", 5, "untimed iterations before the latency is measured", lo=0,
               hi=MAX_LATENCY_ITERS),
        Option("latency_iters", "int", 30, "timed iterations outside the profiler", lo=1, hi=MAX_LATENCY_ITERS),
        Option("overhead_rounds", "int", 6, "rounds that measure the profiler's own cost: an unprofiled step and a "
               "profiled one (same settings) in a fresh random order each round; a 95% interval needs at least 6 "
               "(0: not measured)", lo=0, hi=1000),
        Option("roofline", "bool", True, "measure this machine's roofs (GEMM FLOP/s, copy bandwidth) and place each "
               "operator on the roofline; MFU of the step"),
        Option("timeline_max_events", "int", TIMELINE_MAX_EVENTS, "events drawn on the timeline at most",
               lo=10, hi=200_000),
    ),
)
