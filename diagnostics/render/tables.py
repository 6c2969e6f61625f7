"""Tables in a result: every list of row dicts found in it, as DataFrames, and the CSV files written
of them (cells no spreadsheet runs as a formula)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from diagnostics.results import to_plain

#: Nesting depth searched for tables (lists of records) in a result.
MAX_TABLE_DEPTH = 3
#: Artifact files copied into a report folder: Chrome traces, by name.
TRACE_SUFFIXES = (".json", ".json.gz")


def find_tables(result: dict, max_depth: int = MAX_TABLE_DEPTH) -> dict[str, list[dict]]:
    """Every list of row dicts in ``result`` by its key path ('layers', 'steps_ops'...), in order."""
    found: dict[str, list[dict]] = {}

    def walk(obj, path: list[str], depth: int) -> None:
        if depth > max_depth or not isinstance(obj, dict):
            return
        for key, value in obj.items():
            name = "_".join(path + [str(key)])
            if isinstance(value, list) and value and all(isinstance(r, dict) for r in value):
                found[name] = value
            elif isinstance(value, dict):
                walk(value, path + [str(key)], depth + 1)

    walk(result, [], 0)
    return found


def _flat_cell(v):
    """A CSV/HTML cell: nested lists and dicts as compact JSON, everything else as is."""
    if isinstance(v, (list, dict, tuple)):
        return json.dumps(v, default=str, separators=(",", ":"))
    return v


def frame(rows) -> pd.DataFrame:
    """Typed rows (diagnostics.results.Record) or row dicts as a DataFrame, one column per field, values as
    they are (a shape stays a list). A view's table of typed rows starts here."""
    return pd.DataFrame([r if isinstance(r, dict) else to_plain(r) for r in rows])


def records_frame(records) -> pd.DataFrame:
    """Rows (typed or dicts) as a DataFrame for a CSV or a report table: nested values as compact JSON text."""
    df = frame(records)
    for col in df.columns:
        if df[col].map(lambda v: isinstance(v, (list, dict, tuple))).any():
            df[col] = df[col].map(_flat_cell)
    return df


#: A cell a spreadsheet opens as a formula starts with one of these (=, +, -, @; a tab or a carriage
#: return before one): such a text cell is written with a leading apostrophe, which spreadsheets show as
#: text. Numbers are never touched (-3 stays a number).
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value):
    """``value`` as a CSV cell no spreadsheet runs: text that starts like a formula gets a leading "'"."""
    if isinstance(value, str) and value.startswith(FORMULA_START):
        return "'" + value
    return value


def write_csv(rows, path) -> None:
    """Rows (typed or dicts) as a CSV file (the engine's one CSV writer): nested values as compact
    JSON, text cells that start like a formula neutralised (``csv_cell``), column names too."""
    df = records_frame(rows)
    for col in df.columns:
        if not pd.api.types.is_numeric_dtype(df[col]):  # text (object or pandas' str dtype), mixed
            df[col] = df[col].map(csv_cell)
    df.columns = [csv_cell(str(c)) for c in df.columns]
    df.to_csv(path, index=False, lineterminator="\r\n")  # RFC 4180: a CR inside a cell is quoted, never a new row


def safe_filename(name: str) -> str:
    keep = "".join(c if (c.isalnum() or c in "-_.") else "_" for c in name).strip("._")
    return keep[:80] or "table"


def is_trace_file(path: Path) -> bool:
    """A Chrome trace among a run's artifacts (trace.json, rank0.pt.trace.json.gz...)."""
    name = path.name.lower()
    return "trace" in name and name.endswith(TRACE_SUFFIXES)


def declared_tables(analysis, result) -> list[tuple[str, pd.DataFrame]]:
    """(title, rows as a report table) of each table ``analysis`` declares on its typed result, in order; a
    table the result does not hold (unset, None) is left out."""
    out = []
    for t in analysis.tables:
        rows = result
        for part in t.path.split("."):
            rows = getattr(rows, part, None)
        if rows:  # UNSET and None are falsy
            out.append((t.title, records_frame(rows)))
    return out
