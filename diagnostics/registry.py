"""The one visible list of analyses. Adding an analysis is its own package (declaration in its
``__init__``, work in ``job.py``), its chart / view, and one line here.

Only declarations are imported (no torch): the dashboard lists analyses, validates options and
builds widgets without loading torch; the worker imports an analysis' ``job`` module to run it.
"""

from __future__ import annotations

from diagnostics.analyses import (
    attach, batch_scan, checklist, compile, distributed, gradients, memory, optimize, plan, profile, summary, trace,
    validate,
)
from diagnostics.declare import Analysis
from diagnostics.errors import TorchScopeError

ANALYSES: dict[str, Analysis] = {
    a.name: a
    for a in [
        validate.ANALYSIS,
        summary.ANALYSIS,
        profile.ANALYSIS,
        memory.ANALYSIS,
        batch_scan.ANALYSIS,
        plan.ANALYSIS,
        gradients.ANALYSIS,
        checklist.ANALYSIS,
        optimize.ANALYSIS,
        compile.ANALYSIS,
        *trace.ANALYSES,
        *distributed.ANALYSES,
        attach.ANALYSIS,
    ]
}


def get_analysis(name: str) -> Analysis:
    if name not in ANALYSES:
        raise TorchScopeError(f"unknown analysis {name!r}; known: {', '.join(ANALYSES)}")
    return ANALYSES[name]
