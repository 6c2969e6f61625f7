"""The load check: load a model and run one forward pass (job.py). The sidebar runs it on every
upload before the new model replaces the current one."""

from __future__ import annotations

from typing import Annotated

from diagnostics.declare import Analysis, metric
from diagnostics.results import ModelInput, Record, Result, Shape


class ValidateMetrics(Record, frozen=True, kw_only=True):
    #: None on the meta device: fake tensors have no values to check
    output_nan: Annotated[int | None, metric("count", "NaN values in the output")]
    output_inf: Annotated[int | None, metric("count", "Infinite values in the output")]
    output_elements: Annotated[int | None, metric("count", "Floating-point output elements")]


class ValidateResult(Result, frozen=True, kw_only=True):
    model: str
    model_type: str
    #: the model's inputs as specs (keyword inputs carry their name)
    inputs: tuple[ModelInput, ...]
    output_shape: Shape
    loss: str
    metrics: ValidateMetrics
    notes: tuple[str, ...]


ANALYSIS = Analysis(
    name="validate", title="Load check", target="diagnostics.analyses.validate.job:analyze", timeout_s=120,
    result=ValidateResult, view="ui.views.validate:show", description="load the model and run one forward pass",
)
