"""The gradient-flow analysis: per-layer gradient statistics from hooks over a few training steps,
and vanishing / exploding / dead layers named (job.py)."""

from diagnostics.declare import Analysis, Column, Metric, Option, Table
from diagnostics.measure.optimizers import OPTIMIZERS

MAX_STEPS = 1000

ANALYSIS = Analysis(
    name="gradients", title="Gradient flow", target="diagnostics.analyses.gradients.job:analyze",
    command="gradients", view="ui.views.gradients:show",
    report="diagnostics.render.charts.gradients:gradients_sections",
    description="per-layer gradient statistics over training steps; vanishing, exploding and dead layers",
    options=(
        Option("steps", "int", 5, "training steps to watch", lo=1, hi=MAX_STEPS),
        Option("optimizer", "choice", "sgd", "optimizer", choices=OPTIMIZERS),
        Option("lr", "float", 0.01, "learning rate", gt=0, label="Learning rate"),
    ),
    metrics=(
        Metric("layers", "count", "Layers with parameters"),
        Metric("layers_healthy", "count", "Healthy layers"),
        Metric("layers_vanishing", "count", "Vanishing layers"),
        Metric("layers_exploding", "count", "Exploding layers"),
        Metric("layers_dead", "count", "Dead layers"),
        Metric("layers_nonfinite", "count", "Layers with NaN / Inf gradients"),
        Metric("layers_flagged", "count", "Layers flagged"),
        Metric("global_norm_first", "number", "Global gradient norm (first step)"),
        Metric("global_norm_last", "number", "Global gradient norm (last step)"),
        Metric("global_norm_max", "number", "Global gradient norm (max)"),
        Metric("grad_norm_min_ratio", "number", "Smallest layer norm / largest"),
        Metric("loss_first", "number", "Loss (first step)"),
        Metric("loss_last", "number", "Loss (last step)"),
        Metric("dead_relu_fraction_max", "fraction", "Dead ReLU units (worst activation)"),
        Metric("saturated_fraction_max", "fraction", "Saturated outputs (worst activation)"),
        Metric("activations_flagged", "count", "Activations flagged"),
        Metric("steps", "count", "Steps"),
    ),
    tables=(
        Table("layers", "Layers", (Column("params", "count", "parameters"),
                                   Column("grad_norm_mean", "number", "mean gradient norm"),
                                   Column("grad_norm_max", "number", "max gradient norm"),
                                   Column("zero_fraction", "fraction", "zero gradient entries"))),
        Table("steps", "Per step and layer", (Column("grad_norm", "number", "gradient norm"),)),
        Table("activations", "Activations", ()),
    ),
)
