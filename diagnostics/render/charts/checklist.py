"""Figures for the checklist: the score as a gauge, and rule status counts by category; its report sections
and the "fix this first" section an attached run's report shares."""

from __future__ import annotations

import plotly.graph_objects as go

from diagnostics.analyses.checklist import SCORE_FORMULA, ChecklistResult
from diagnostics.analyses.checklist.rules import CATEGORIES, STATUS_COLOR, STATUS_LABEL, STATUSES
from diagnostics.findings import Finding, FixFirst, by_attention
from diagnostics.render.sections import Section, figures
from diagnostics.render.tables import records_frame


def build_score_gauge_figure(result: ChecklistResult) -> go.Figure:
    """The checklist score (0-100 points) as a gauge; red under 50, amber under 80."""
    score = result.score
    fig = go.Figure(go.Indicator(
        mode="gauge+number", value=score if score is not None else 0,
        number={"suffix": " / 100", "valueformat": ".0f"},
        title={"text": "Checklist score (points)" + ("" if score is not None else " — no rule applies")},
        gauge={"axis": {"range": [0, 100], "tickvals": [0, 20, 40, 60, 80, 100]}, "bar": {"color": "#37474f"},
               "steps": [{"range": [0, 50], "color": "#ffcdd2"}, {"range": [50, 80], "color": "#ffe0b2"},
                         {"range": [80, 100], "color": "#c8e6c9"}]},
    ))
    fig.update_layout(height=260, margin=dict(l=40, r=40, t=60, b=10))  # room for the 0 and 100 ticks
    return fig


def build_status_by_category_figure(result: ChecklistResult) -> go.Figure:
    """Stacked horizontal bars: how many rules pass / warn / fail / do not apply in each category."""
    cats = [c for c in CATEGORIES if result.by_category.get(c)]
    fig = go.Figure()
    for status in STATUSES:
        counts = [sum(f.status == status for f in result.in_category(c)) for c in cats]
        if status == "error" and not any(counts):
            continue  # only when a rule crashed
        fig.add_bar(y=cats, x=counts, orientation="h", name=STATUS_LABEL[status], marker_color=STATUS_COLOR[status],
                    hovertemplate="%{y}: %{x} rules " + STATUS_LABEL[status] + "<extra></extra>")
    fig.update_layout(title="Rule status by category", barmode="stack", xaxis_title="rules (count)",
                      yaxis=dict(autorange="reversed"), height=80 + 45 * max(1, len(cats)),
                      margin=dict(l=10, r=10, t=50, b=40),
                      legend=dict(orientation="h", y=1.02, x=1, xanchor="right", yanchor="bottom"))
    return fig


# ----------------------------------------------------------------------------- report sections
def fix_first_section(ranked: tuple[FixFirst, ...] | list[FixFirst], text: str) -> Section:
    """The "fix this first" list (diagnostics.findings.FixFirst rows) as a report section."""
    import pandas as pd

    return Section("Fix this first", text=[text], tables=[("fix this first", pd.DataFrame([{
        "what": e.title, "est. saving (ms/step)": e.est_saving_ms, "how": e.how, "fix": e.fix or "",
        "detail": e.detail} for e in ranked]))])


FINDING_COLUMNS = ["status", "title", "id", "evidence", "suggestion", "fix"]


def findings_frame(findings: list[Finding], columns: list[str] = FINDING_COLUMNS):
    """Findings as a report table: the given columns, in that order."""
    return records_frame(findings)[columns]


def checklist_sections(result: ChecklistResult) -> list[Section]:
    """Score and charts, then one table per category (failures and warnings first: status, evidence,
    suggestion, fix), the rules that do not apply here, and the thresholds."""
    c = result.counts
    score = "n/a (no rule applies)" if result.score is None else f"{result.score:.1f} / 100"
    text = [f"Score {score} for {result.purpose} on {result.device}: "
            + ", ".join(f"{c.of(s)} {s.replace('_', ' ')}" for s in STATUSES) + ".",
            SCORE_FORMULA]
    text += list(result.notes)
    findings = by_attention(result.findings)

    figs, notes = figures(lambda: build_score_gauge_figure(result),
                           lambda: build_status_by_category_figure(result))
    sections = [Section("Checklist", text=text + notes, figures=figs)]
    if result.fix_first:
        sections.append(fix_first_section(result.fix_first, "Ranked by the estimated milliseconds saved per step; "
                                                             "'how' says whether a saving was measured or modelled."))
    for cat in CATEGORIES:
        rows = [f for f in findings if f.category == cat and f.status != "not_applicable"]
        if rows:
            sections.append(Section(str(cat).capitalize(), tables=[("", findings_frame(rows))]))
    rest = [f for f in findings if f.status == "not_applicable"]
    if rest:
        sections.append(Section("Not applicable here", tables=[
            ("", findings_frame(rest, ["category", "id", "title", "evidence"]))]))
    if result.thresholds:
        sections.append(Section("Thresholds", tables=[("", records_frame(result.thresholds))]))
    return sections
