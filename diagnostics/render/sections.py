"""A report is a list of Sections; each analysis' chart module says which (its ``SECTIONS``).

``Section`` holds paragraphs, figures and tables; ``section()`` builds one from figure builders,
turning a chart that cannot be drawn into a note instead of a failed report; ``generic_sections``
is the layout of an analysis without sections of its own (every table in its result).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from diagnostics.render.tables import find_tables, records_frame

#: Rows of a table shown in the HTML; the CSV next to it always has all of them.
MAX_HTML_ROWS = 200


@dataclass
class Section:
    """One titled part of a report: paragraphs, then figures, then (caption, table) pairs."""

    title: str
    text: list[str] = field(default_factory=list)
    figures: list = field(default_factory=list)  # plotly Figures
    tables: list[tuple[str, pd.DataFrame]] = field(default_factory=list)


def generic_sections(result: dict) -> list[Section]:
    """Fallback for analyses without a SECTIONS entry: notes, then every list of records as a table."""
    sections = []
    notes = [str(n) for n in result.get("notes", []) if n] if isinstance(result, dict) else []
    if notes:
        sections.append(Section("Notes", text=notes))
    tables = find_tables(result)
    if tables:
        sections.append(Section("Tables", tables=[(name, records_frame(rows)) for name, rows in tables.items()]))
    scalars = {k: v for k, v in result.items() if k != "metrics" and isinstance(v, (str, int, float, bool))}
    if scalars:
        sections.insert(0, Section("Details", tables=[("", pd.DataFrame(
            [{"field": k, "value": v} for k, v in scalars.items()]))]))
    return sections


def records(result: dict, key: str, columns: list[str] | None = None, n: int | None = None) -> pd.DataFrame:
    df = records_frame(result.get(key) or [])
    if columns and not df.empty:
        df = df[[c for c in columns if c in df.columns]]
    return df.head(n) if n else df


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


def notes(result: dict) -> list[str]:
    return [str(n) for n in result.get("notes", []) or []]
