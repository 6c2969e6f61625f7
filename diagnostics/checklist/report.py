"""Checklist reports from a checklist result: Markdown and self-contained HTML (no external URLs).

Both are pure functions of the result dict, so History can rebuild them without re-running.
"""

from __future__ import annotations

import html

from diagnostics.checklist.rules import CATEGORIES

STATUS_MARK = {"pass": "✅ pass", "warn": "⚠️ warn", "fail": "❌ fail", "not_applicable": "➖ n/a"}
STATUS_COLOR = {"pass": "#2e7d32", "warn": "#ef6c00", "fail": "#c62828", "not_applicable": "#757575"}


def _score_text(result: dict) -> str:
    s = result.get("score")
    return "n/a (no rule applies)" if s is None else f"{s:.0f} / 100"


def _md_cell(text) -> str:
    return str(text if text is not None else "").replace("|", "\\|").replace("\n", " ")


def build_markdown(result: dict) -> str:
    c = result["counts"]
    lines = [f"# Optimization checklist: {result['model']}", "",
             f"Device: {result['device']} · purpose: {result.get('purpose')} · score: **{_score_text(result)}** "
             f"(pass {c['pass']}, warn {c['warn']}, fail {c['fail']}, not applicable {c['not_applicable']})", "",
             "Score = 100 x (pass + 0.5 x warn) / (pass + warn + fail); not-applicable rules do not count.", ""]
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


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em;color:#222;max-width:1200px}
table{border-collapse:collapse;width:100%;margin-bottom:1.5em}th,td{border:1px solid #ddd;padding:6px;
vertical-align:top;text-align:left;font-size:14px}th{background:#f4f4f4}.status{font-weight:600;white-space:nowrap}
.score{font-size:2em;font-weight:700}code{background:#f4f4f4;padding:1px 4px}
"""


def build_html(result: dict) -> str:
    e = html.escape
    c = result["counts"]
    parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'>",
             f"<title>Optimization checklist: {e(result['model'])}</title><style>{_CSS}</style></head><body>",
             f"<h1>Optimization checklist: {e(result['model'])}</h1>",
             f"<p class='score'>{e(_score_text(result))}</p>",
             f"<p>Device {e(result['device'])} · purpose {e(str(result.get('purpose')))} · pass {c['pass']}, "
             f"warn {c['warn']}, fail {c['fail']}, not applicable {c['not_applicable']}.<br>"
             "Score = 100 × (pass + 0.5 × warn) / (pass + warn + fail); not-applicable rules do not count.</p>"]
    by_id = {f["id"]: f for f in result["findings"]}
    for cat in CATEGORIES:
        ids = result["by_category"].get(cat, [])
        if not ids:
            continue
        parts.append(f"<h2>{e(cat.capitalize())}</h2><table><tr><th>Status</th><th>Rule</th><th>Evidence</th>"
                     "<th>Suggestion</th><th>Fix</th></tr>")
        for i in ids:
            f = by_id[i]
            parts.append(f"<tr><td class='status' style='color:{STATUS_COLOR[f['status']]}'>{e(STATUS_MARK[f['status']])}"
                         f"</td><td>{e(f['title'])} <code>{e(f['id'])}</code></td><td>{e(f['evidence'])}</td>"
                         f"<td>{e(f['suggestion'])}</td><td>{e(f.get('fix') or '')}</td></tr>")
        parts.append("</table>")
    parts.append("<h2>Thresholds</h2><table><tr><th>Constant</th><th>Value</th><th>Meaning</th></tr>")
    parts += [f"<tr><td><code>{e(t['name'])}</code></td><td>{t['value']:g}</td><td>{e(t['meaning'])}</td></tr>"
              for t in result["thresholds"]]
    parts.append("</table>")
    if result.get("notes"):
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{e(n)}</li>" for n in result["notes"]) + "</ul>")
    parts.append("</body></html>")
    return "\n".join(parts)
