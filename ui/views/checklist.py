"""Show a checklist result: score, status by category, findings grouped by category, thresholds,
and the report as Markdown / HTML downloads. ``apply_fix(fix_id)`` (pages only) adds "Apply fix"."""

from __future__ import annotations

from typing import Callable

import pandas as pd
import streamlit as st

from diagnostics.analyses.checklist import SCORE_FORMULA, ChecklistResult
from diagnostics.analyses.checklist.report import build_markdown
from diagnostics.analyses.checklist.rules import CATEGORIES, STATUS_LABEL, STATUSES
from diagnostics.findings import Finding, FixFirst, by_attention
from diagnostics.render.charts.checklist import build_score_gauge_figure, build_status_by_category_figure
from diagnostics.render.tables import records_frame
from ui.widgets import MAIN_WIDTH_PX, Tile, metric_row, missing_as, unit_columns

ICON = {"pass": ":material/check_circle:", "warn": ":material/warning:", "fail": ":material/cancel:",
        "error": ":material/bug_report:", "not_applicable": ":material/remove_circle_outline:"}
COLOR = {"pass": "green", "warn": "orange", "fail": "red", "error": "violet", "not_applicable": "gray"}


def show_finding(f: Finding, apply_fix: Callable[[str], None] | None = None,
                 trial_note: Callable[[Finding], str | None] | None = None) -> None:
    """One finding (the checklist's and an attached run's): status, rule, evidence, suggestion, and (pages
    only) "Apply fix" and what an Optimize trial of its fix measured."""
    with st.container(border=True):
        c1, c2 = st.columns([5, 1])
        c1.markdown(f":{COLOR[f.status]}[{ICON[f.status]} **{STATUS_LABEL[f.status]}**] &nbsp; **{f.title}** "
                    f"`{f.id}`")
        c1.markdown(f.evidence)
        if f.suggestion:
            c1.caption(f"Suggestion: {f.suggestion}")
        note = trial_note(f) if (trial_note and f.fix and f.flagged) else None
        if note:
            c1.caption(f":material/science: {note.capitalize()}")
        if f.fix and apply_fix is not None:
            train = f.fix.startswith("train:")
            fix_id = f.fix.removeprefix("train:")
            if c2.button("Apply fix", key=f"apply_{f.id}", icon=":material/rocket_launch:",
                         help=f"Try the '{fix_id}' fix on the Optimize page"
                              + (" as a training-step trial" if train else "") + ", against the baseline"):
                apply_fix(f.fix)  # in the script run (not a callback), so it may switch pages


def fix_first_table(entries: tuple[FixFirst, ...] | list[FixFirst]) -> None:
    """The ranked list: estimated ms saved per step, how it was estimated, and what addresses it."""
    if not entries:
        st.success("Nothing to fix first: no finding warns or fails, and no faster trial or roofline headroom is known.")
        return
    df = pd.DataFrame([{"#": i + 1, "what": e.title,
                        "est. saving (ms/step)": e.est_saving_ms, "how it was estimated": e.how,
                        "fix / trial": e.fix or "", "detail": e.detail} for i, e in enumerate(entries)])
    df, config = unit_columns(df, {"est. saving (ms/step)": ("Saving/step", "ms", "estimated time saved per step")}, {
        "#": st.column_config.NumberColumn("#", width="small"), "what": st.column_config.TextColumn("what", width="medium"),
        "how it was estimated": st.column_config.TextColumn("how it was estimated", width="medium"),
        "fix / trial": st.column_config.TextColumn("fix / trial", width="small"),
        "detail": st.column_config.TextColumn("detail", width="medium")})
    df, config = missing_as(df, config, {"est. saving (ms/step)": "not estimated"})
    st.dataframe(df, hide_index=True, width="stretch", column_config=config)


def tiles(result: ChecklistResult) -> list[Tile]:
    c = result.counts
    out = [Tile("Score", result.score, "score", SCORE_FORMULA),
           Tile("Pass", c.pass_, "count", "rules passed"), Tile("Warn", c.warn, "count", "rules that warn"),
           Tile("Fail", c.fail, "count", "rules that fail"),
           Tile("N/a", c.not_applicable, "count", "rules that do not apply here (see why)")]
    if c.error:
        out.insert(4, Tile("Rule errors", c.error, "count", "rules that crashed: counted as failed"))
    return out


def show(result: ChecklistResult, apply_fix: Callable[[str], None] | None = None,
         ranked: list[FixFirst] | None = None, sources: str = "",
         trial_note: Callable[[Finding], str | None] | None = None) -> None:
    st.caption(f"{result.model} · device {result.device} · purpose: {result.purpose}")
    entries = ranked if ranked is not None else result.fix_first
    st.subheader("Fix this first")
    st.caption("Ranked by the milliseconds per step each item would save; items without a measured or modelled "
               "saving follow, marked 'not estimated'." + (f" Also from: {sources}." if sources else
                                                           " Run the Profiler (roofline) and Optimize on this model "
                                                           "to add their savings."))
    fix_first_table(entries)
    g1, g2 = st.columns([2, 3])
    g1.plotly_chart(build_score_gauge_figure(result), width="stretch")
    with g2:
        metric_row(tiles(result), per_row=3, width_px=MAIN_WIDTH_PX * 3 // 5)  # beside the gauge (3 of 5 parts)
        st.plotly_chart(build_status_by_category_figure(result), width="stretch")
    for note in result.notes:
        st.info(f"A probe could not run: {note}")
    show_na = st.toggle("Show rules that do not apply", value=False, key="checklist_show_na")
    for cat in CATEGORIES:
        fs = result.in_category(cat)
        if not fs:
            continue
        n = {s: sum(f.status == s for f in fs) for s in STATUSES}
        errors = f"{n['error']} rule errors, " if n["error"] else ""
        with st.expander(f"**{cat.capitalize()}** — {errors}{n['fail']} fail, {n['warn']} warn, {n['pass']} pass, "
                         f"{n['not_applicable']} n/a", expanded=bool(n["error"] or n["fail"] or n["warn"])):
            for f in by_attention(fs):
                if f.status != "not_applicable" or show_na:
                    show_finding(f, apply_fix, trial_note)
    with st.expander("Thresholds (named constants in diagnostics/analyses/checklist/thresholds.py)"):
        st.dataframe(records_frame(result.thresholds), hide_index=True, width="stretch",
                     column_config={"name": "Constant", "value": st.column_config.NumberColumn("Value", format="%g"),
                                    "meaning": "Meaning"})
    st.download_button("Report (Markdown)", build_markdown(result).encode(), file_name="checklist.md",
                       mime="text/markdown", icon=":material/description:", on_click="ignore")
