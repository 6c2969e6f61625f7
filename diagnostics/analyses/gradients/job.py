"""The gradient-flow job: a few training steps with hooks (``measure.gradflow``), restored after; the
measurement's plain rows (the measure layer knows no analysis' types) made this analysis' records here."""

from __future__ import annotations

from diagnostics.analyses.gradients import (ANALYSIS, Activation, GlobalNorm, GradientLayer, GradientsMetrics,
                                            GradientsResult, GradientStep, Threshold)
from diagnostics.measure.gradflow import gradient_flow


def _layer(row: dict) -> GradientLayer:
    return GradientLayer(**{**row, "param_names": tuple(row["param_names"])})


def analyze(ctx, options: dict) -> GradientsResult:
    o = ANALYSIS.validate(options)  # idempotent: the runner validated them too
    r = gradient_flow(ctx.loaded, o["steps"], o["optimizer"], o["lr"], ctx.progress)
    return GradientsResult(
        loss=r["loss"], loss_stand_in=r["loss_stand_in"], confidence=r["confidence"], phase=r["phase"],
        phase_reason=r["phase_reason"], model=r["model"], device=r["device"], verdict=r["verdict"],
        thresholds=tuple(Threshold(**t) for t in r["thresholds"]), metrics=GradientsMetrics(**r["metrics"]),
        layers=tuple(_layer(row) for row in r["layers"]), steps=tuple(GradientStep(**s) for s in r["steps"]),
        global_norms=tuple(GlobalNorm(**g) for g in r["global_norms"]),
        activations=tuple(Activation(**a) for a in r["activations"]), notes=tuple(r["notes"]), options=dict(o))
