"""A report is a list of Sections; each analysis' declaration names the function that builds them
(its ``report``, resolved by diagnostics.render.layouts).

``Section`` holds paragraphs, figures and tables; ``section()`` builds one from figure builders,
turning a chart that cannot be drawn into a note instead of a failed report; ``generic_sections``
is the layout of an analysis that declares none of its own (every table in its result).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from diagnostics.render.tables import find_tables, records_frame
from diagnostics.results import Result, notes_of, to_plain

#: Rows of a table shown in the HTML; the CSV next to it always has all of them.
MAX_HTML_ROWS = 200


@dataclass
class Section:
    """One titled part of a report: paragraphs, then figures, then (caption, table) pairs."""

    title: str
    text: list[str] = field(default_factory=list)
    figures: list = field(default_factory=list)  # plotly Figures
    tables: list[tuple[str, pd.DataFrame]] = field(default_factory=list)


def generic_sections(result: Result | dict) -> list[Section]:
    """The layout of an analysis without one of its own: its scalar fields, its notes, then every list of
    records in its result (typed rows included) as a table."""
    sections = []
    notes = list(notes_of(result))
    if notes:
        sections.append(Section("Notes", text=notes))
    plain = to_plain(result) if result is not None else {}
    tables = find_tables(plain)
    if tables:
        sections.append(Section("Tables", tables=[(name, records_frame(rows)) for name, rows in tables.items()]))
    scalars = {k: v for k, v in plain.items() if k != "metrics" and isinstance(v, (str, int, float, bool))}
    if scalars:
        sections.insert(0, Section("Details", tables=[("", pd.DataFrame(
            [{"field": k, "value": v} for k, v in scalars.items()]))]))
    return sections


def figures(*builders) -> tuple[list, list[str]]:
    """Call each zero-argument builder; a figure that cannot be drawn becomes a note, not a failure."""
    figs, notes = [], []
    for build in builders:
        try:
            figs.append(build())
        except Exception as e:  # one odd chart must not cost the whole report
            notes.append(f"a chart could not be drawn: {type(e).__name__}: {e}")
    return figs, notes


def section(title: str, builders=(), tables=(), text=()) -> Section:
    figs, problems = figures(*builders)
    return Section(title, text=list(text) + problems, figures=figs, tables=list(tables))


def notes(result) -> list[str]:
    """The result's notes (typed or, not converted yet, a plain dict)."""
    return list(notes_of(result))
