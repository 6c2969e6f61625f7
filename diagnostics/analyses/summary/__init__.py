"""The model summary: parameters, bytes, output shapes and FLOPs, in total and per layer (job.py)."""

from __future__ import annotations

from typing import Annotated

from diagnostics.declare import Analysis, Option, column, metric, table
from diagnostics.results import UNSET, ModelInput, Record, Result, Shape, UnsetType


class SummaryMetrics(Record, frozen=True, kw_only=True):
    params_total: Annotated[int, metric("count", "Parameters", "tied weights counted once", better="lower")]
    params_trainable: Annotated[int, metric("count", "Trainable parameters")]
    params_frozen: Annotated[int, metric("count", "Frozen parameters")]
    param_bytes: Annotated[int, metric("bytes", "Parameter memory", better="lower")]
    buffer_bytes: Annotated[int, metric("bytes", "Buffer memory")]
    #: None: not counted (the notes say why), never 0
    flops_forward: Annotated[int | None, metric("flop", "FLOPs (forward)", better="lower")]
    flops_backward: Annotated[int | None, metric("flop", "FLOPs (backward)")]
    flops_train_step: Annotated[int | None, metric("flop", "FLOPs (forward + backward)", better="lower")]
    tied_parameters: Annotated[int, metric("count", "Tied parameters")]
    batch_size: Annotated[int | None, metric("count", "Batch size")]
    #: only for models whose first input is token ids (batch, sequence)
    flops_forward_per_token: Annotated[float | None | UnsetType, metric(
        "flop", "FLOPs per token (forward)", "forward FLOPs / (batch x sequence length) of the first input; models "
        "whose first input is token ids (encoder-decoders: per encoder token, input_ids)", better="lower")] = UNSET


class SummaryLayer(Record, frozen=True, kw_only=True):
    """One module (the model itself is "(model)"); its own parameters are those no module before it holds."""

    name: str
    parent: str | None
    type: str
    depth: int
    is_leaf: bool
    output_shape: Shape
    params: Annotated[int, column("count", "parameters")]
    params_total: int
    pct_of_total: Annotated[float, column("percent", "share of parameters")]
    trainable: Annotated[int, column("count", "trainable")]
    #: None: not counted (inside TorchScript, or only uncounted ops ran under it), never 0
    flops_forward: Annotated[int | None, column("flop", "FLOPs forward")]
    flops_backward: Annotated[int | None, column("flop", "FLOPs backward")]
    #: the ops under this module whose FLOPs the counts leave out (comma-separated), or None
    flops_not_counted: str | None = None


class SummaryResult(Result, frozen=True, kw_only=True):
    model: str
    model_type: str
    device: str
    inputs: tuple[ModelInput, ...]
    output_shape: Shape
    loss: str
    metrics: SummaryMetrics
    layers: Annotated[tuple[SummaryLayer, ...], table("Layers")]
    #: the model was built on the meta device: counts on fake tensors, nothing measured
    meta: bool = False
    notes: tuple[str, ...]


ANALYSIS = Analysis(
    name="summary", title="Model summary", target="diagnostics.analyses.summary.job:analyze", command="summary",
    result=SummaryResult, view="ui.views.summary:show", report="diagnostics.render.charts.summary:summary_sections",
    description="parameters, bytes, output shapes and FLOPs (forward and backward), in total and per layer",
    options=(
        Option("skip_backward", "bool", False, "count forward FLOPs only (no backward pass)"),
    ),
)
