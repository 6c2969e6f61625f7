"""The gradient-flow analysis: per-layer gradient statistics from hooks over a few training steps,
and vanishing / exploding / dead layers named (job.py)."""

from __future__ import annotations

from typing import Annotated, Any

from diagnostics.declare import Analysis, Option, column, metric, table
from diagnostics.measure.optimizers import OPTIMIZERS
from diagnostics.results import UNSET, Record, Result, UnsetType

MAX_STEPS = 1000


class GradientsMetrics(Record, frozen=True, kw_only=True):
    """The figures an attached run (diagnostics.attach) does not measure are unset there: the loss, the
    update-based and activation figures."""

    layers: Annotated[int, metric("count", "Layers with parameters")]
    layers_healthy: Annotated[int, metric("count", "Healthy layers")]
    layers_vanishing: Annotated[int, metric("count", "Vanishing layers")]
    layers_exploding: Annotated[int, metric("count", "Exploding layers")]
    layers_dead: Annotated[int, metric("count", "Dead layers")]
    layers_nonfinite: Annotated[int, metric("count", "Layers with NaN / Inf gradients")]
    layers_flagged: Annotated[int, metric("count", "Layers flagged")]
    #: None: not finite
    global_norm_first: Annotated[float | None, metric("number", "Global gradient norm (first step)")]
    global_norm_last: Annotated[float | None, metric("number", "Global gradient norm (last step)")]
    global_norm_max: Annotated[float | None, metric("number", "Global gradient norm (max)")]
    grad_norm_min_ratio: Annotated[float | None | UnsetType, metric("number", "Smallest layer norm / largest")] = UNSET
    loss_first: Annotated[float | None | UnsetType, metric("number", "Loss (first step)")] = UNSET
    loss_last: Annotated[float | None | UnsetType, metric("number", "Loss (last step)")] = UNSET
    dead_relu_fraction_max: Annotated[float | None | UnsetType, metric(
        "fraction", "Dead ReLU units (worst activation)")] = UNSET
    saturated_fraction_max: Annotated[float | None | UnsetType, metric(
        "fraction", "Saturated outputs (worst activation)")] = UNSET
    activations_flagged: Annotated[int | UnsetType, metric("count", "Activations flagged")] = UNSET
    steps: Annotated[int, metric("count", "Steps")]


class Threshold(Record, frozen=True, kw_only=True):
    """A named constant of measure/gradient_health.py and what it means."""

    name: str
    value: int | float
    meaning: str


class GradientLayer(Record, frozen=True, kw_only=True):
    """One layer with parameters, in forward order: its gradient statistics over the steps and its status
    (healthy / vanishing / exploding / dead / non-finite) with the reason. None: not finite."""

    index: int
    layer: str
    type: str
    params: Annotated[int, column("count", "parameters")]
    param_names: tuple[str, ...]
    grad_norm_mean: Annotated[float | None, column("number", "mean gradient norm")]
    grad_norm_max: Annotated[float | None, column("number", "max gradient norm")]
    grad_norm_first: float | None
    grad_norm_last: float | None
    grad_abs_mean: float | None
    grad_abs_max: float | None
    update_ratio_mean: float | None
    update_ratio_max: float | None
    zero_fraction: Annotated[float, column("fraction", "zero gradient entries")]
    nan_count: int
    inf_count: int
    finite_steps: int
    #: how the layer is judged (layer kinds, layer-scale gates, neighbourhoods): unset in runs stored before them
    kind: str | UnsetType = UNSET
    gate_scale: float | None | UnsetType = UNSET
    rule: str | UnsetType = UNSET
    neighbourhood: str | UnsetType = UNSET
    neighbourhood_norm: float | UnsetType = UNSET
    #: what the layer is judged on (unset in runs stored before): its weight norm before the first step, its
    #: relative gradient ‖g‖/‖w‖ (None: zero weights, or no weight norm as in an attached run), its role at
    #: every depth (the name with block indices as *) and its peers' median relative gradient (None: fewer
    #: than PEER_MIN_LAYERS peers)
    weight_norm: float | None | UnsetType = UNSET
    relative_grad: float | None | UnsetType = UNSET
    peer_role: str | UnsetType = UNSET
    peer_median: float | None | UnsetType = UNSET
    status: str
    reason: str | None
    grad_norm_relative: float | None


class GradientStep(Record, frozen=True, kw_only=True):
    step: int
    layer: str
    grad_norm: Annotated[float | None, column("number", "gradient norm")]
    grad_abs_mean: float | None
    grad_abs_max: float | None
    update_ratio: float | None
    zero_fraction: float
    nan_count: int
    inf_count: int
    numel: int


class GlobalNorm(Record, frozen=True, kw_only=True):
    step: int
    global_norm: float | None
    loss: float | None


class Activation(Record, frozen=True, kw_only=True):
    """A ReLU (dead units) or sigmoid / tanh (saturated outputs) module, the fraction averaged over the steps;
    None: too few values per unit to judge."""

    module: str
    type: str
    kind: str
    dead_fraction: float | None
    saturated_fraction: float | None
    flagged: bool


class GradientsResult(Result, frozen=True, kw_only=True):
    #: the loss the gradients are of (a stand-in when the model declares none: ``confidence`` low)
    loss: str | None
    loss_stand_in: bool
    confidence: str
    #: at initialisation / after training / unknown, and why (unset in runs stored before phases)
    phase: str | UnsetType = UNSET
    phase_reason: str | UnsetType = UNSET
    model: str
    device: str | None
    verdict: str
    thresholds: tuple[Threshold, ...]
    metrics: GradientsMetrics
    layers: Annotated[tuple[GradientLayer, ...], table("Layers")]
    steps: Annotated[tuple[GradientStep, ...], table("Per step and layer")]
    global_norms: tuple[GlobalNorm, ...]
    activations: Annotated[tuple[Activation, ...], table("Activations")]
    notes: tuple[str, ...]
    #: the options as run (steps, optimizer, lr)
    options: dict[str, Any]


ANALYSIS = Analysis(
    name="gradients", title="Gradient flow", target="diagnostics.analyses.gradients.job:analyze",
    command="gradients", result=GradientsResult, view="ui.views.gradients:show",
    report="diagnostics.render.charts.gradients:gradients_sections",
    description="per-layer gradient statistics over training steps; vanishing, exploding and dead layers",
    options=(
        Option("steps", "int", 5, "training steps to watch", lo=1, hi=MAX_STEPS),
        Option("optimizer", "choice", "sgd", "optimizer", choices=OPTIMIZERS),
        Option("lr", "float", 0.01, "learning rate", gt=0, label="Learning rate"),
    ),
)
