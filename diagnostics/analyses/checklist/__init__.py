"""The optimization checklist: facts about the model (facts.py), rules over them (rules.py), a
score, and reports (job.py). Its result type, :class:`ChecklistResult`, is declared here (no torch)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from diagnostics.declare import Analysis, Option, OptionError, metric, table
from diagnostics.findings import Finding, FixFirst, Threshold
from diagnostics.analyses.checklist.records import DataLoaderFacts, MeasuredFacts
from diagnostics.measure.records import Environment, ForwardFacts, StaticFacts
from diagnostics.results import Record, Result

PURPOSES = ("training", "inference")
LOADER_KEYS = ("batch_size", "num_workers", "pin_memory", "prefetch_factor", "persistent_workers")
#: How the score is computed, in words (the page, the reports and the docs show this sentence).
SCORE_FORMULA = ("Score = 100 x (pass + 0.5 x warn) / (pass + warn + fail + rule errors); rules that do not "
                 "apply do not count, and a rule that crashed counts as failed.")


def check_dataloader(dl: dict) -> dict:
    """A DataLoader description: only its known keys, counts as non-negative integers."""
    unknown = [k for k in dl if k not in LOADER_KEYS]
    if unknown:
        raise OptionError(f"option dataloader: unknown key{'s' if len(unknown) > 1 else ''} "
                          f"{', '.join(map(repr, unknown))}; known: {', '.join(LOADER_KEYS)}")
    for key in ("batch_size", "num_workers", "prefetch_factor"):
        v = dl.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < (0 if key == "num_workers" else 1)):
            raise OptionError(f"option dataloader: {key} must be "
                              f"{'an integer >= 0' if key == 'num_workers' else 'a positive integer'}, got {v!r}")
    return dl


class StatusCounts(Record, frozen=True, kw_only=True):
    """How many rules ended in each status (``pass`` is written ``pass_``: a Python keyword)."""

    pass_: int = msgspec.field(name="pass")
    warn: int
    fail: int
    error: int = 0
    not_applicable: int

    def of(self, status: str) -> int:
        return self.pass_ if status == "pass" else getattr(self, status)


class Facts(Record, frozen=True, kw_only=True):
    """What the rules read, as ``facts.collect_facts`` gathers it in one job: the purpose checked for, the
    batch size and task the model was loaded with, each collector's failure (``errors``: collector -> why),
    and its sections, each a record declared beside the code that makes it: ``static`` (the module tree:
    measure.records.StaticFacts), ``env`` (device and backend flags: measure.records.Environment), ``forward``
    (one traced forward: measure.records.ForwardFacts; None when it failed), ``measured`` (the timed probes:
    records.MeasuredFacts; None with skip_measured) and ``dataloader`` (records.DataLoaderFacts; None when none
    is described, or reading it failed)."""

    purpose: str | None
    errors: dict[str, str]
    static: StaticFacts
    env: Environment
    batch_size: int | None
    task: str
    forward: ForwardFacts | None
    measured: MeasuredFacts | None
    dataloader: DataLoaderFacts | None


class ChecklistMetrics(Record, frozen=True, kw_only=True):
    score: Annotated[float | None, metric("score", "Score", SCORE_FORMULA, better="higher")]
    pass_: Annotated[int, metric("count", "Passed", better="higher")] = msgspec.field(name="pass")
    warn: Annotated[int, metric("count", "Warnings", better="lower")]
    fail: Annotated[int, metric("count", "Failed", better="lower")]
    error: Annotated[int, metric("count", "Rule errors", "rules that crashed (counted as failed)", better="lower")]
    not_applicable: Annotated[int, metric("count", "Not applicable")]
    applicable: Annotated[int, metric("count", "Applicable rules")]


class ChecklistResult(Result, frozen=True, kw_only=True):
    """The rules' findings on one model (in RULES order) with their score; ``by_category``: the findings' ids
    per category (CATEGORIES order); ``facts``: what the rules read, as collected (facts.py: plain data, the
    rules' input, tested on hand-written facts); ``fix_first``: the findings that warn or fail, ranked by the
    milliseconds per step each would save (the page adds the model's latest profile and Optimize trials)."""

    model: str
    device: str
    purpose: str | None
    #: None: no rule applies (the formula has no denominator), never 0
    score: float | None
    counts: StatusCounts
    findings: Annotated[tuple[Finding, ...], table("Findings")]
    by_category: dict[str, tuple[str, ...]]
    thresholds: Annotated[tuple[Threshold, ...], table("Thresholds")]
    facts: Facts
    metrics: ChecklistMetrics
    notes: tuple[str, ...] = ()
    fix_first: Annotated[tuple[FixFirst, ...], table("Fix this first")] = ()

    def finding(self, rule_id: str) -> Finding:
        return next(f for f in self.findings if f.id == rule_id)

    def in_category(self, category: str) -> list[Finding]:
        """The category's findings, in RULES order."""
        return [self.finding(i) for i in self.by_category.get(category, ())]


ANALYSIS = Analysis(
    name="checklist", title="Optimization checklist", target="diagnostics.analyses.checklist.job:analyze",
    command="checklist", exclusive=True, timeout_s=600, result=ChecklistResult, view="ui.views.checklist:show",
    report="diagnostics.render.charts.checklist:checklist_sections",
    description="rules that measure the model and say what to change, with a score",
    options=(
        Option("purpose", "choice", "training", "what the model is for: decides which mode Dropout and BatchNorm "
               "should be in", choices=PURPOSES),
        Option("iters", "int", 5, "timed repetitions of each timed probe", lo=1, hi=100, label="Timed repetitions"),
        Option("profile_steps", "int", 2, "profiled training steps", lo=1, hi=20),
        Option("dataloader", "dict", None, "your DataLoader's settings (batch_size, num_workers, pin_memory, "
               "prefetch_factor, persistent_workers): feeds the data-pipeline rules", flag="",
               check=check_dataloader),
        Option("dataset_path", "path", None, "a Python file defining build_dataset(), to time the DataLoader "
               "(refused in server-safe mode)", flag=""),
        Option("skip_measured", "bool", False, "static facts only: nothing is timed or profiled", flag=""),
    ),
)
