"""The checklist's Markdown report, a pure function of its result (History rebuilds it).

The HTML report is the one every analysis has (diagnostics.render.html.build_report), charts included.
"""

from __future__ import annotations

from diagnostics.analyses.checklist import SCORE_FORMULA, ChecklistResult
from diagnostics.analyses.checklist.rules import CATEGORIES

STATUS_MARK = {"pass": "✅ pass", "warn": "⚠️ warn", "fail": "❌ fail", "error": "🐞 rule error",
               "not_applicable": "➖ n/a"}


def _score_text(result: ChecklistResult) -> str:
    return "n/a (no rule applies)" if result.score is None else f"{result.score:.0f} / 100"


def _md_cell(text) -> str:
    return str(text if text is not None else "").replace("|", "\\|").replace("\n", " ")


def build_markdown(result: ChecklistResult) -> str:
    c = result.counts
    lines = [f"# Optimization checklist: {result.model}", "",
             f"Device: {result.device} · purpose: {result.purpose} · score: **{_score_text(result)}** "
             f"(pass {c.pass_}, warn {c.warn}, fail {c.fail}, rule errors {c.error}, "
             f"not applicable {c.not_applicable})", "",
             SCORE_FORMULA, ""]
    if result.fix_first:
        lines += ["## Fix this first", "", "| # | What | Est. saving (ms/step) | How | Fix |", "|---|---|---|---|---|"]
        for i, e in enumerate(result.fix_first, 1):
            ms = "not estimated" if e.est_saving_ms is None else f"{e.est_saving_ms:.3f}"
            lines.append(f"| {i} | {_md_cell(e.title)} | {ms} | {_md_cell(e.how)} | {e.fix or ''} |")
        lines.append("")
    for cat in CATEGORIES:
        findings = result.in_category(cat)
        if not findings:
            continue
        lines += [f"## {cat.capitalize()}", "", "| Status | Rule | Evidence | Suggestion | Fix |",
                  "|---|---|---|---|---|"]
        for f in findings:
            lines.append(f"| {STATUS_MARK[f.status]} | {_md_cell(f.title)} (`{f.id}`) | {_md_cell(f.evidence)} "
                         f"| {_md_cell(f.suggestion)} | {_md_cell(f.fix or '')} |")
        lines.append("")
    lines += ["## Thresholds", "", "| Constant | Value | Meaning |", "|---|---|---|"]
    lines += [f"| `{t.name}` | {t.value:g} | {_md_cell(t.meaning)} |" for t in result.thresholds]
    if result.notes:
        lines += ["", "## Notes", ""] + [f"- {_md_cell(n)}" for n in result.notes]
    return "\n".join(lines) + "\n"
