"""The checklist's measured sections as typed records (torch-free, beside facts.py, which makes them): the
timed and traced probes (``MeasuredFacts``) and the DataLoader (``DataLoaderFacts``). The sections read from the
module tree and the machine are the measure layer's (diagnostics.measure.records).

A probe that failed is None (its reason in ``Facts.errors``); one that did not run here (no trainable
parameters, no CUDA, no batch size to probe, or a run stored before it existed) is UNSET. The field names
are the stored runs' keys (tests/test_stored_runs.py).
"""

from __future__ import annotations

from diagnostics.results import UNSET, Record, UnsetType


class Timed(Record, frozen=True, kw_only=True):
    """Seconds per call over ``iters`` calls (facts._timed)."""

    median_s: float
    p90_s: float
    mean_s: float
    min_s: float
    iters: int


class TopOp(Record, frozen=True, kw_only=True):
    name: str
    count_per_step: float


class ProfileFacts(Record, frozen=True, kw_only=True):
    """A profiled training step, per step (facts.step_profile_facts, layout_copy_facts): operators, kernels,
    sync points, Tensor Core kernels, layout copies, per-element indexing, GPU busy and communication shares."""

    layout_copies_per_step: float
    layout_copy_us_per_step: float
    op_time_us_per_step: float
    layout_copy_fraction: float | None
    #: "GPU kernel" or "CPU operator": what the copies' time is measured in
    layout_copy_time_kind: str
    element_ops_per_step: dict[str, float]
    element_ops_total_per_step: int | float
    steps: int
    step_wall_us: float
    ops_per_step: float
    median_op_us: float | None
    kernels_per_step: float
    median_kernel_us: float | None
    sync_per_step: dict[str, float]
    sync_points_per_step: float
    eligible_ops: tuple[str, ...]
    tensor_core_kernels: tuple[str, ...]
    kernel_names_sample: tuple[str, ...]
    gpu_busy_fraction: float | None
    communication_fraction: float | None
    communication_families: tuple[str, ...]
    top_ops: tuple[TopOp, ...]


class FlaggedLayer(Record, frozen=True, kw_only=True):
    layer: str
    status: str
    reason: str


class GradientFacts(Record, frozen=True, kw_only=True):
    """Gradient health over a few training steps (facts.gradient_facts, from measure.gradflow)."""

    verdict: str
    phase: str | None | UnsetType = UNSET
    steps: int | UnsetType = UNSET
    layers: int
    vanishing: int
    exploding: int
    dead: int
    nonfinite: int
    global_norm_first: float | None
    global_norm_max: float | None
    min_ratio: float | None
    loss_stand_in: bool
    loss: str | None
    flagged: tuple[FlaggedLayer, ...]


class InferenceProbe(Record, frozen=True, kw_only=True):
    """eval() + inference_mode against a training-mode forward, interleaved, with the A/A control."""

    train_grad_forward_s: float
    eval_inference_forward_s: float
    speedup: float
    speedup_ci: tuple[float, float] | None
    verdict: str
    control_ci: tuple[float, float] | None
    control_verdict: str
    rounds: int


class GraphBreak(Record, frozen=True, kw_only=True):
    location: str
    reason: str
    count: int


class CompileFacts(Record, frozen=True, kw_only=True):
    """Dynamo's graphs and graph breaks of one eval forward (facts.compile_facts)."""

    graph_count: int
    graph_break_count: int
    breaks: tuple[GraphBreak, ...]


class BatchPoint(Record, frozen=True, kw_only=True):
    batch_size: int
    median_s: float
    samples_per_s: float


class BatchProbe(Record, frozen=True, kw_only=True):
    """Inference throughput at the batch and at twice it, interleaved, with the A/A control."""

    points: tuple[BatchPoint, BatchPoint]
    throughput_gain_2x: float
    throughput_gain_ci: tuple[float, float] | None
    control_ci: tuple[float, float] | None
    control_verdict: str
    rounds: int


class MeasuredFacts(Record, frozen=True, kw_only=True):
    """Everything timed or traced (facts.measured_facts)."""

    train_step: Timed | None | UnsetType = UNSET
    profile: ProfileFacts | None | UnsetType = UNSET
    peak_bytes: int | None | UnsetType = UNSET
    saved_activation_bytes: int | None | UnsetType = UNSET
    gradients: GradientFacts | None | UnsetType = UNSET
    #: CUDA only
    memory_growth_bytes_per_step: float | None | UnsetType = UNSET
    inference: InferenceProbe | None | UnsetType = UNSET
    compile: CompileFacts | None | UnsetType = UNSET
    batch_probe: BatchProbe | None | UnsetType = UNSET


class LoaderSettings(Record, frozen=True, kw_only=True):
    """The DataLoader as described (checklist.LOADER_KEYS; None: not given)."""

    batch_size: int | None
    num_workers: int | None
    pin_memory: bool | None
    prefetch_factor: int | None
    persistent_workers: bool | None


class DataLoaderFacts(Record, frozen=True, kw_only=True):
    """The DataLoader described, and (with a dataset module) its measured time per batch against the step's."""

    described: LoaderSettings
    loader_s_per_batch: float | None
    step_time_s: float | None
    loader_fraction: float | None
    note: str | None


def got(value):
    """A probe's value, or None where it was not measured here (UNSET) or failed (None)."""
    return None if value is UNSET else value
