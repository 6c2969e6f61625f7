"""A finding: what a rule found, in one form for every part that judges a run (the checklist's
rules, an attached run's rules), so one list ranks them ("fix this first") and one view shows them.

A Finding carries the rule id, category, status (pass / warn / fail / rule error / not applicable),
the evidence in words with its numbers, a suggestion and an optional fix id. A :class:`FixFirst` is one
row of "fix this first". Both are typed records of the results that hold them (diagnostics.results:
one serialisation). No torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Callable

from diagnostics.declare import column
from diagnostics.results import Record

CATEGORIES = ("model design", "memory", "compute", "data pipeline", "deployment")
#: A rule's verdict. "error": the rule itself crashed on these facts; it says so with the message and
#: counts in the score as a failure (a broken rule must not raise the score by leaving the denominator).
STATUSES = ("pass", "warn", "fail", "error", "not_applicable")
STATUS_LABEL = {"pass": "pass", "warn": "warn", "fail": "fail", "error": "rule error", "not_applicable": "n/a"}
STATUS_COLOR = {"pass": "#2e7d32", "warn": "#ef6c00", "fail": "#c62828", "error": "#6a1b9a",
                "not_applicable": "#757575"}
#: Statuses that count in the score's denominator; pass counts 1, warn 0.5, the rest 0.
SCORED = ("pass", "warn", "fail", "error")
#: What needs attention first (views and reports list findings in this order).
ATTENTION = ("error", "fail", "warn", "pass", "not_applicable")


#: Thresholds that both the checklist's rules and an attached run's rules judge a training step by,
#: declared once here, below both analyses (which may not import each other); each lists them in its
#: own THRESHOLDS (the attach rules under their names for a real run's shares).
#: Share of the step spent waiting for data (the TensorBoard plugin's rule).
DATALOADER_FRACTION_MAX = 0.05
#: Share of the step's kernel time in communication (the TensorBoard plugin's rule).
COMMUNICATION_FRACTION_MAX = 0.10
#: Share of the step with a GPU kernel running (the TensorBoard plugin's rule).
GPU_UTILIZATION_MIN = 0.50
#: Launch-bound: at least this many ops (CPU) or kernels (CUDA) per step, of median duration under
#: LAUNCH_BOUND_MEDIAN_US.
LAUNCH_BOUND_MIN_OPS = 100
LAUNCH_BOUND_MEDIAN_US = 20.0
#: DataLoader prefetch_factor below which a worker's batch has little time to be ready.
PREFETCH_FACTOR_MIN = 2


class Finding(Record, frozen=True, kw_only=False):
    id: str
    title: str
    category: str
    status: str  # one of STATUSES
    evidence: str  # what was measured, in words with numbers (or why the rule does not apply)
    suggestion: str = ""
    numbers: dict[str, Any] = {}
    fix: str | None = None  # the Optimize fix that addresses it: an inference fix id, or "train:<id>"

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}")
        if self.category not in CATEGORIES:
            raise ValueError(f"unknown category {self.category!r}")

    @property
    def flagged(self) -> bool:
        """It warns or fails: it belongs in "fix this first"."""
        return self.status in ("warn", "fail")


def by_attention(findings) -> list[Finding]:
    """Findings in the order they need attention (rule errors, failures, warnings, passes, the rest)."""
    return sorted(findings, key=lambda f: ATTENTION.index(f.status))


def not_applicable(why: str) -> tuple:
    """A check's answer when its rule does not apply here: (status, evidence, suggestion, numbers)."""
    return "not_applicable", why, "", {}


def run_check(check, facts, bug_note: str = "") -> tuple:
    """``check(facts)`` -> (status, evidence, suggestion, numbers); a check that crashes says so as a
    "rule error" (counted as failed where there is a score), and the other rules still run."""
    try:
        return check(facts)
    except Exception as e:
        return ("error", f"the rule crashed: {type(e).__name__}: {e}",
                f"This is a bug in TorchScope's rule{bug_note}: please report it with the facts (result.json).", {})


@dataclass(frozen=True)
class Rule:
    """One rule of a visible list (``RULES``): ``check(facts) -> (status, evidence, suggestion, numbers)``; calling
    the rule gives its Finding, which offers ``fix`` when it warns or fails. A check that crashes is a rule error
    (run_check), the other rules still run."""

    id: str
    title: str
    category: str
    check: Callable[[Any], tuple]
    fix: str | None = None
    #: what the "rule error" suggestion adds after "a bug in TorchScope's rule"
    bug_note: str = ""

    def fix_for(self, facts) -> str | None:
        """The fix a flagged finding offers on these facts."""
        return self.fix

    def __call__(self, facts) -> Finding:
        status, evidence, suggestion, numbers = run_check(self.check, facts, self.bug_note)
        fix = self.fix_for(facts) if status in ("warn", "fail") else None
        return Finding(self.id, self.title, self.category, status, evidence, suggestion, numbers, fix)


class FixFirst(Record, frozen=True, kw_only=True):
    """One row of "fix this first": what, the milliseconds per step it would save (None: not estimated,
    never a silent 0), how that was estimated, where it comes from, the fix id and the evidence."""

    title: str
    est_saving_ms: Annotated[float | None, column("ms", "saving per step")]
    how: str
    source: str
    fix: str | None = None
    detail: str = ""


def rank_fix_first(entries) -> list[FixFirst]:
    """Entries with an estimated saving first (largest first), then the rest in their order."""
    with_ms = sorted((e for e in entries if e.est_saving_ms is not None), key=lambda e: -e.est_saving_ms)
    return with_ms + [e for e in entries if e.est_saving_ms is None]


class Threshold(Record, frozen=True, kw_only=True):
    """A rule's named constant as the result lists it (its value, what it means)."""

    name: str
    value: int | float
    meaning: str
