"""What every checklist rule shares: the Rule form (a fix written "purpose:<id>" follows the checklist's purpose)
and the readers of the typed ``Facts`` (``measured``, ``profile``, ``got``, ``on_cuda``, ``pct``).
"""

from __future__ import annotations

from dataclasses import dataclass

from diagnostics.analyses.checklist.records import MeasuredFacts, ProfileFacts, got  # noqa: F401 (got: the rules')
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


#: The measured section of a checklist run with skip_measured: every probe UNSET (not measured here).
NOTHING_MEASURED = MeasuredFacts()


def measured(facts) -> MeasuredFacts:
    """The facts' measured section (every probe UNSET when nothing was measured); read a probe with ``got``."""
    return facts.measured if facts.measured is not None else NOTHING_MEASURED


def profile(facts) -> ProfileFacts | None:
    """The profiled training step's facts, or None (not profiled, or the profile failed)."""
    return got(measured(facts).profile)


def on_cuda(facts) -> bool:
    return facts.env.device_type == "cuda"


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"
