"""The checklist's Markdown report, a pure function of the result dict (History rebuilds it).

The HTML report is the one every analysis has (diagnostics.render.html.build_report), charts included.
"""

from __future__ import annotations

from diagnostics.analyses.checklist import SCORE_FORMULA
from diagnostics.analyses.checklist.rules import CATEGORIES

STATUS_MARK = {"pass": "✅ pass", "warn": "⚠️ warn", "fail": "❌ fail", "error": "🐞 rule error",
               "not_applicable": "➖ n/a"}


def _score_text(result: dict) -> str:
    s = result.get("score")
    return "n/a (no rule applies)" if s is None else f"{s:.0f} / 100"


def _md_cell(text) -> str:
    return str(text if text is not None else "").replace("|", "\\|").replace("\n", " ")


def build_markdown(result: dict) -> str:
    c = result["counts"]
    lines = [f"# Optimization checklist: {result['model']}", "",
             f"Device: {result['device']} · purpose: {result.get('purpose')} · score: **{_score_text(result)}** "
             f"(pass {c['pass']}, warn {c['warn']}, fail {c['fail']}, rule errors {c.get('error', 0)}, "
             f"not applicable {c['not_applicable']})", "",
             SCORE_FORMULA, ""]
    ranked = result.get("fix_first") or []
    if ranked:
        lines += ["## Fix this first", "", "| # | What | Est. saving (ms/step) | How | Fix |", "|---|---|---|---|---|"]
        for i, e in enumerate(ranked, 1):
            ms = "not estimated" if e["est_saving_ms"] is None else f"{e['est_saving_ms']:.3f}"
            lines.append(f"| {i} | {_md_cell(e['title'])} | {ms} | {_md_cell(e['how'])} | {e['fix'] or ''} |")
        lines.append("")
    by_id = {f["id"]: f for f in result["findings"]}
    for cat in CATEGORIES:
        ids = result["by_category"].get(cat, [])
        if not ids:
            continue
        lines += [f"## {cat.capitalize()}", "", "| Status | Rule | Evidence | Suggestion | Fix |",
                  "|---|---|---|---|---|"]
        for i in ids:
            f = by_id[i]
            lines.append(f"| {STATUS_MARK[f['status']]} | {_md_cell(f['title'])} (`{f['id']}`) | {_md_cell(f['evidence'])} "
                         f"| {_md_cell(f['suggestion'])} | {_md_cell(f.get('fix') or '')} |")
        lines.append("")
    lines += ["## Thresholds", "", "| Constant | Value | Meaning |", "|---|---|---|"]
    lines += [f"| `{t['name']}` | {t['value']:g} | {_md_cell(t['meaning'])} |" for t in result["thresholds"]]
    if result.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {_md_cell(n)}" for n in result["notes"]]
    return "\n".join(lines) + "\n"
