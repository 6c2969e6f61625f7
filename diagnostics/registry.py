"""The one visible list of analyses. Adding an analysis is its own package (declaration and result
type in its ``__init__``, work in ``job.py``), its page view (ui/views/), and one line here: the CLI
command, its flags, validation, the typed result's round trip, History and the report follow from the
declaration (docs/ARCHITECTURE.md, "Adding an analysis").

Only declarations are imported (no torch): the dashboard lists analyses, validates options and
builds widgets without loading torch; the worker imports an analysis' ``job`` module to run it.
Registration fails loudly: two analyses with one name or one command are refused here.
"""

from __future__ import annotations

from diagnostics.declare import Analysis
from diagnostics.errors import TorchScopeError


def register(analyses: list[Analysis]) -> dict[str, Analysis]:
    """name -> declaration, refusing a name or a CLI command declared twice."""
    out: dict[str, Analysis] = {}
    commands: dict[str, str] = {}
    for a in analyses:
        if a.name in out:
            raise ValueError(f"analysis {a.name!r} is registered twice")
        if a.command:
            if a.command in commands:
                raise ValueError(f"analyses {commands[a.command]!r} and {a.name!r} both declare the command "
                                 f"{a.command!r}")
            commands[a.command] = a.name
        out[a.name] = a
    return out


_ANALYSES: dict[str, Analysis] | None = None


def _registered() -> dict[str, Analysis]:
    """The list, registered on first use."""
    global _ANALYSES
    if _ANALYSES is None:
        from diagnostics.analyses import (
            attach, batch_scan, checklist, compile, distributed, gradients, memory, optimize, plan, profile,
            summary, trace, trials, validate,
        )

        _ANALYSES = register([
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
            trials.ANALYSIS,
        ])
    return _ANALYSES


def __getattr__(name: str):
    """``ANALYSES`` (name -> declaration) is made on first use: importing every analysis' declaration takes
    0.1 s, which a trace file's first answer (``trace analyze``) does without (get_analysis)."""
    if name == "ANALYSES":
        return _registered()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_analysis(name: str) -> Analysis:
    if _ANALYSES is None:   # a trace file's analyses are found without importing every declaration
        from diagnostics.analyses import trace

        for decl in trace.ANALYSES:
            if decl.name == name:
                return decl
    ANALYSES = _registered()
    if name not in ANALYSES:
        raise TorchScopeError(f"unknown analysis {name!r}; known: {', '.join(ANALYSES)}")
    return ANALYSES[name]
