"""What every checklist rule shares: the Rule form (a fix written "purpose:<id>" follows the checklist's purpose)
and the readers of the typed ``Facts`` (``measured``, ``on_cuda``, ``pct``).
"""

from __future__ import annotations

from dataclasses import dataclass

from diagnostics.findings import Rule as FindingRule
from diagnostics.findings import not_applicable

#: A rule's fix written "purpose:<id>" is the training-step trial of <id> when the checklist's purpose
#: is training, the inference trial otherwise (fixes that exist in both modes: amp, torch_compile,
#: channels_last).
FOR_PURPOSE = "purpose:"


@dataclass(frozen=True)
class Rule(FindingRule):
    """A checklist rule (facts: the checklist's ``Facts``); a fix written "purpose:<id>" follows the purpose."""

    bug_note: str = ", not in your model"

    def fix_for(self, facts) -> str | None:
        fix = self.fix
        if fix and fix.startswith(FOR_PURPOSE):  # the trial of the checklist's purpose: a training step or inference
            fix = ("train:" if facts.purpose == "training" else "") + fix[len(FOR_PURPOSE):]
        return fix


na = not_applicable


def measured(facts, *keys):
    """facts.measured[k1][k2]... or None when any level is missing (or nothing was measured)."""
    cur = facts.measured
    for k in keys:
        if not isinstance(cur, dict):
            return None
        cur = cur.get(k)
    return cur


def on_cuda(facts) -> bool:
    return facts.env.get("device_type") == "cuda"


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"
