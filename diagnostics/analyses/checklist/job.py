"""Analysis "checklist": collect facts about the model, run every rule, score, write reports.

Options are declared in this package's ``__init__`` and arrive validated.
Result: ``findings`` (Finding dicts in RULES order), ``by_category``, ``score``, ``counts``,
``thresholds``, ``facts`` and ``metrics`` (score and counts). ``report.md`` / ``report.html`` are
written to the artifact folder.
"""

from __future__ import annotations

from diagnostics.analyses.checklist import ANALYSIS
from diagnostics.analyses.checklist.facts import collect_facts
from diagnostics.analyses.checklist.rank import fix_first
from diagnostics.analyses.checklist.report import build_markdown
from diagnostics.analyses.checklist.rules import CATEGORIES, SCORED, STATUSES, THRESHOLDS, evaluate, score


def build_result(facts: dict, model_label: str, device: str) -> dict:
    findings = evaluate(facts)
    counts = {s: sum(f.status == s for f in findings) for s in STATUSES}
    by_category = {c: [f.id for f in findings if f.category == c] for c in CATEGORIES}
    sc = score(findings)
    result = {
        "model": model_label,
        "device": device,
        "purpose": facts.get("purpose"),
        "score": sc,
        "counts": counts,
        "findings": [f.to_dict() for f in findings],
        "by_category": by_category,
        "thresholds": [{"name": n, "value": v, "meaning": m} for n, v, m in THRESHOLDS],
        "facts": facts,
        "metrics": {"score": sc, "pass": counts["pass"], "warn": counts["warn"], "fail": counts["fail"],
                    "error": counts["error"], "not_applicable": counts["not_applicable"],
                    "applicable": sum(counts[s] for s in SCORED)},
        "notes": [f"{k}: {v}" for k, v in facts.get("errors", {}).items()],
    }
    # the list ranked by ms saved, from the findings alone; the page adds the model's latest profile
    # (roofline headroom) and Optimize trials where they exist
    result["fix_first"] = fix_first(result)
    return result


def analyze(ctx, options: dict) -> dict:
    options = ANALYSIS.validate(options)  # idempotent: the runner validated them too
    opts = options
    loaded = ctx.loaded
    facts = collect_facts(loaded, opts, lambda f, m: ctx.progress(0.05 + 0.85 * f, m))
    ctx.progress(0.95, "evaluating rules")
    result = build_result(facts, loaded.spec.label, str(loaded.device))
    (ctx.artifact_dir / "checklist_report.md").write_text(build_markdown(result))
    return result
