"""Validate a model: load it and run one forward pass; report inputs and outputs.

The sidebar runs this on every upload before the new model replaces the current one, so a bad
file shows its error and the previous model stays selected. Outputs holding NaN or infinity do
not fail the check (the model loads and runs) but are counted and named in ``notes``.
"""

from __future__ import annotations

import torch

from diagnostics.analyses.validate import ANALYSIS, ValidateMetrics, ValidateResult
from diagnostics.tensors import iter_tensors, shape_of
from diagnostics.results import ModelInput


def nonfinite_counts(out) -> tuple[int, int, int]:
    """(NaN count, infinity count, total floating-point elements) over every tensor in ``out``."""
    nan = inf = total = 0
    for t in iter_tensors(out):
        if t.is_floating_point() or t.is_complex():
            nan += int(torch.isnan(t).sum())
            inf += int(torch.isinf(t).sum())
            total += t.numel()
    return nan, inf, total


def analyze(ctx, options: dict) -> ValidateResult:
    options = ANALYSIS.validate(options)  # idempotent: the runner validated them too
    loaded = ctx.loaded
    ctx.progress(0.5, "one forward pass")
    loaded.model.eval()
    if loaded.meta:  # a model on the meta device runs on fake tensors: shapes, no values to check
        from diagnostics.tensors import fake_mode

        with fake_mode(), torch.no_grad():
            out = loaded.forward()
        nan = inf = total = None
    else:
        with torch.no_grad():
            out = loaded.forward()
        nan, inf, total = nonfinite_counts(out)
    notes = list(loaded.notes)
    if nan or inf:
        notes.append(f"the output is not finite: {nan:,} NaN and {inf:,} infinite values out of {total:,}; "
                     "check the weights, the inputs' range and dtype, or a division/log in forward()")
    return ValidateResult(
        model=loaded.spec.label,
        model_type=type(loaded.model).__name__,
        inputs=tuple(ModelInput(shape=tuple(s.shape), dtype=s.dtype, high=s.high,
                                **({"name": s.name} if s.name is not None else {}))
                     for s in loaded.input_specs),  # keyword inputs carry their name
        output_shape=shape_of(out),
        loss=loaded.loss_name,
        metrics=ValidateMetrics(output_nan=nan, output_inf=inf, output_elements=total),
        notes=tuple(notes),
    )
