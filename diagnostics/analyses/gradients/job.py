"""The gradient-flow job: a few training steps with hooks (``measure.gradflow``), restored after."""

from __future__ import annotations

from diagnostics.analyses.gradients import ANALYSIS, GradientsResult
from diagnostics.measure.gradflow import gradient_flow
from diagnostics.results import build


def analyze(ctx, options: dict) -> GradientsResult:
    o = ANALYSIS.validate(options)  # idempotent: the runner validated them too
    result = gradient_flow(ctx.loaded, o["steps"], o["optimizer"], o["lr"], ctx.progress)
    return build(GradientsResult, {**result, "options": o})
