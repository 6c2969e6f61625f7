"""Analysis "checklist": collect facts about the model, run every rule, score, write reports.

Options are declared in this package's ``__init__`` and arrive validated. Returns a
:class:`~diagnostics.analyses.checklist.ChecklistResult`; ``checklist_report.md`` is written to the
artifact folder.
"""

from __future__ import annotations

import msgspec

from diagnostics.analyses.checklist import ANALYSIS, ChecklistMetrics, ChecklistResult, Facts, StatusCounts
from diagnostics.analyses.checklist.facts import collect_facts
from diagnostics.analyses.checklist.rank import fix_first
from diagnostics.analyses.checklist.report import build_markdown
from diagnostics.analyses.checklist.rules import CATEGORIES, SCORED, STATUSES, evaluate, score
from diagnostics.analyses.checklist.thresholds import THRESHOLDS
from diagnostics.findings import Threshold


def build_result(facts: Facts, model_label: str, device: str) -> ChecklistResult:
    findings = evaluate(facts)
    counts = {s: sum(f.status == s for f in findings) for s in STATUSES}
    sc = score(findings)
    result = ChecklistResult(
        model=model_label, device=device, purpose=facts.purpose, score=sc,
        counts=StatusCounts(pass_=counts["pass"], warn=counts["warn"], fail=counts["fail"], error=counts["error"],
                            not_applicable=counts["not_applicable"]),
        findings=tuple(findings),
        by_category={c: tuple(f.id for f in findings if f.category == c) for c in CATEGORIES},
        thresholds=tuple(Threshold(name=n, value=v, meaning=m) for n, v, m in THRESHOLDS),
        facts=facts,
        metrics=ChecklistMetrics(score=sc, pass_=counts["pass"], warn=counts["warn"], fail=counts["fail"],
                                 error=counts["error"], not_applicable=counts["not_applicable"],
                                 applicable=sum(counts[s] for s in SCORED)),
        notes=tuple(f"{k}: {v}" for k, v in facts.errors.items()),
    )
    # the list ranked by ms saved, from the findings alone; the page adds the model's latest profile
    # (roofline headroom) and Optimize trials where they exist
    return msgspec.structs.replace(result, fix_first=tuple(fix_first(result)))


def analyze(ctx, options: dict) -> ChecklistResult:
    options = ANALYSIS.validate(options)  # idempotent: the runner validated them too
    loaded = ctx.loaded
    facts = collect_facts(loaded, options, lambda f, m: ctx.progress(0.05 + 0.85 * f, m))
    ctx.progress(0.95, "evaluating rules")
    result = build_result(facts, loaded.spec.label, str(loaded.device))
    (ctx.artifact_dir / "checklist_report.md").write_text(build_markdown(result))
    return result
