"""The load check: load a model and run one forward pass (job.py). The sidebar runs it on every
upload before the new model replaces the current one."""

from diagnostics.declare import Analysis, Metric

ANALYSIS = Analysis(
    name="validate", title="Load check", target="diagnostics.analyses.validate.job:analyze", timeout_s=120, view="ui.views.validate:show",
    description="load the model and run one forward pass",
    metrics=(
        Metric("output_nan", "count", "NaN values in the output"),
        Metric("output_inf", "count", "Infinite values in the output"),
        Metric("output_elements", "count", "Floating-point output elements"),
    ),
)
