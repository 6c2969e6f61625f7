"""The one visible list of analyses. Adding an analysis is one module plus one entry here.

Each entry names its function by import path so that listing analyses (in the dashboard's
process) imports no torch; the function is imported in the worker that runs it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Analysis:
    name: str
    title: str
    target: str  # "module:function", called as fn(ctx: AnalysisContext, options: dict) -> dict
    needs_model: bool = True
    exclusive: bool = False  # times the device: runs one at a time per device (see runner)
    default_timeout_s: float = 300.0

    def load(self) -> Callable:
        module, _, fn = self.target.partition(":")
        return getattr(importlib.import_module(module), fn)


ANALYSES: dict[str, Analysis] = {
    a.name: a
    for a in [
        Analysis("validate", "Load check", "diagnostics.analyses.validate.job:analyze", default_timeout_s=120),
        Analysis("summary", "Model summary", "diagnostics.analyses.summary.job:analyze"),
        Analysis("memory", "Memory", "diagnostics.analyses.memory.job:analyze", exclusive=True, default_timeout_s=600),
        Analysis("batch_scan", "Batch-size scan", "diagnostics.analyses.batch_scan.job:analyze", exclusive=True, default_timeout_s=600),
        Analysis("gradients", "Gradient flow", "diagnostics.analyses.gradients.job:analyze"),
        Analysis("checklist", "Optimization checklist", "diagnostics.analyses.checklist.job:analyze", exclusive=True, default_timeout_s=600),
        Analysis("optimize", "One-click fixes (trials)", "diagnostics.analyses.optimize.job:analyze", exclusive=True, default_timeout_s=600),
        Analysis("profile", "Profiler", "diagnostics.analyses.profile.job:analyze", exclusive=True, default_timeout_s=600),
        Analysis("distributed", "Distributed run (torchrun)", "diagnostics.analyses.distributed.job:analyze", exclusive=True, default_timeout_s=600),
        Analysis("trace", "Trace explorer", "diagnostics.analyses.trace.job:analyze", needs_model=False, default_timeout_s=600),
        Analysis("trace_timeline", "Trace timeline", "diagnostics.analyses.trace.job:analyze_timeline", needs_model=False),
        Analysis("trace_diff", "Trace diff", "diagnostics.analyses.trace.job:analyze_diff", needs_model=False, default_timeout_s=600),
        Analysis("distributed_traces", "Distributed traces (folder)", "diagnostics.analyses.distributed.job:analyze_folder", needs_model=False),
    ]
}


def get_analysis(name: str) -> Analysis:
    from diagnostics.errors import TorchScopeError

    if name not in ANALYSES:
        raise TorchScopeError(f"unknown analysis {name!r}; known: {', '.join(ANALYSES)}")
    return ANALYSES[name]
