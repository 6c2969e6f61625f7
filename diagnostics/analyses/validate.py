"""Validate a model: load it and run one forward pass; report inputs and outputs.

The sidebar runs this on every upload before the new model replaces the current one, so a bad
file shows its error and the previous model stays selected.
"""

from __future__ import annotations

import torch

from diagnostics.analyses.summary import _shape_of


def analyze(ctx, options: dict) -> dict:
    loaded = ctx.loaded
    ctx.progress(0.5, "one forward pass")
    loaded.model.eval()
    with torch.no_grad():
        out = loaded.forward()
    return {
        "model": loaded.spec.label,
        "model_type": type(loaded.model).__name__,
        "inputs": [{"shape": list(s.shape), "dtype": s.dtype, "high": s.high} for s in loaded.input_specs],
        "output_shape": _shape_of(out),
        "loss": loaded.loss_name,
        "metrics": {},
    }
