"""Small shared widgets: error boxes, metric rows, option inputs (the downloads: ui.views.downloads)."""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from diagnostics.runner import JobOutcome
from diagnostics.units import _SCALES, COMPACT_WIDTH, Scale, compact, interval_text, scale_of


#: Characters Streamlit's markdown gives a meaning (CommonMark, GFM tables and autolinks, its :color[]
#: and :material/: directives, LaTeX): escaped with a backslash in text that came from a file.
_MARKDOWN = set("\\`*_{}[]()#+-.!|<>~$:=")


def md_text(value) -> str:
    """Text from a file or a run (a trace's file name, an event's name) for st.caption / st.markdown:
    every markdown character escaped and control characters (newlines included) shown as escapes, so it
    is shown as written: never an image from another host, a link, a heading or a colour."""
    from diagnostics.units import printable

    return "".join("\\" + c if c in _MARKDOWN else c for c in printable(value))


def artifact_size(path) -> int | None:
    """The size of a run's file a page offers for download, or None: only a regular file (never a
    link, which a job could have left) inside the run store's artifact folder (a path in a result
    could name any file). diagnostics.jobfiles does the checks."""
    from diagnostics.jobfiles import size_of
    from ui.jobs import get_store

    return size_of(path, within=get_store().artifacts_root) if path else None


def artifact_bytes(path) -> bytes:
    """The content of a run's file for a download button (checked as artifact_size says)."""
    from diagnostics.jobfiles import read_bytes
    from ui.jobs import get_store

    return read_bytes(path, within=get_store().artifacts_root)


def show_failure(outcome: JobOutcome) -> None:
    """A readable error for a failed job, with the worker's last output folded away. A job still
    running (ui.jobs) draws nothing: its progress panel is on the page already."""
    if outcome.status == "running":
        return
    heading = {"timeout": "Timed out", "crashed": "The worker crashed", "oom": "Out of memory",
               "cancelled": "Cancelled"}.get(outcome.status, "Failed")
    st.error(f"**{heading}:** {outcome.error}")
    if outcome.from_cache:
        st.caption("This is the last attempt's error; it does not run again by itself. Fix the cause (model, "
                   "inputs, options), or press the page's run button to try again.")
    if outcome.log_tail:
        with st.expander("Worker output (last lines)"):
            st.code(outcome.log_tail[-2000:], language=None)


#: A tile's label and figure fit a tile at 1280 px: longer text goes into the help, never into the label
#: (Streamlit cuts both with '…', taking the unit with it), and a row holds as many tiles as its widest
#: figure leaves room for (``tiles_per_row``), at most TILES_PER_ROW.
MAX_LABEL_CHARS = 18
MAX_VALUE_CHARS = COMPACT_WIDTH
TILES_PER_ROW = 5
#: The page's main column at a 1280 px window beside the sidebar (measured on a screenshot: 820 px), the
#: width of one character of a tile's figure (st.metric's 2.25rem font: "481.4 MFLOP" is 192 px) and the
#: gap between two tiles.
MAIN_WIDTH_PX = 820
VALUE_CHAR_PX = 18
TILE_GAP_PX = 16


def tiles_per_row(texts: list[str], per_row: int = TILES_PER_ROW, width_px: int = MAIN_WIDTH_PX) -> int:
    """How many tiles a row of ``width_px`` holds without cutting the longest of ``texts`` (at most
    ``per_row``; at least 1). Five tiles of 'x1.30' share a row; 481.4 MFLOP needs three."""
    longest = max((len(t) for t in texts), default=1)
    return max(1, min(per_row, width_px // (VALUE_CHAR_PX * longest + TILE_GAP_PX)))


@dataclass(frozen=True)
class Tile:
    """One metric tile: a short label, the raw value in its declared unit (diagnostics.units.UNITS),
    and the long text for the help. The figure is formatted here (units.compact), never by a view.
    ``missing``: what None reads ('n/a', 'not counted', 'none'); ``signed``: '+' on gains; ``detail``:
    a line under the figure, for what must be read with it (a speed-up's interval and verdict)."""

    label: str
    value: object
    unit: str = "text"
    help: str | None = None
    missing: str = "n/a"
    signed: bool = False
    detail: str | None = None

    def text(self, scale: Scale | None = None) -> str:
        return compact(self.value, self.unit, scale, signed=self.signed, missing=self.missing)


def comparison_detail(ci, verdict: str | None, unit: str = "ratio", why: str = "no interval") -> str:
    """A tile's detail line for a measured comparison: '[1.10, 1.52] faster', or why it has no interval."""
    iv = interval_text(ci, unit)
    return " ".join(p for p in (iv or why, verdict or "") if p)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def tile_texts(tiles: list[Tile]) -> list[str]:
    """Each tile's figure; tiles of one unit share one scale (the largest one's) so a page reads
    '385.9 MiB' beside '12.0 MiB', unless that would show a small figure as 0.0x (then it keeps its own)."""
    shared: dict[str, Scale] = {}
    for unit in {t.unit for t in tiles if t.unit in _SCALES}:
        values = [abs(float(t.value)) for t in tiles if t.unit == unit and _number(t.value)]
        if len(values) < 2:
            continue
        sc = scale_of(max(values), unit)
        if all(v == 0 or v / sc.factor >= 1 for v in values):
            shared[unit] = sc
    return [t.text(shared.get(t.unit)) if _number(t.value) and t.value != 0 else t.text() for t in tiles]


def metric_row(tiles: list[Tile], per_row: int = TILES_PER_ROW, width_px: int = MAIN_WIDTH_PX) -> None:
    """Tiles in rows of at most ``per_row``, fewer when their figures need the room (``tiles_per_row``;
    rows of even width: a sixth tile of five starts a second row of three). A narrower column passes
    its ``width_px``."""
    texts = tile_texts(tiles)
    per_row = tiles_per_row(texts, per_row, width_px)
    rows = -(-len(tiles) // per_row)
    per_row = -(-len(tiles) // rows) if rows else 0
    for start in range(0, len(tiles), per_row or 1):
        chunk = list(zip(tiles, texts))[start:start + per_row]
        cols = st.columns(per_row)
        for col, (t, text) in zip(cols, chunk):
            col.metric(t.label, text, help=t.help, delta=t.detail, delta_color="off", delta_arrow="off")


def option_input(analysis: str, key: str, container=None, *, widget_key: str | None = None,
                 label: str | None = None, radio: bool = False, format_func=None, scale: float = 1.0, **kwargs):
    """A widget for one declared option of ``analysis``: its label, default, bounds, choices and help
    come from the declaration (diagnostics.declare), so the page never restates them. Returns the
    value in the option's own terms (``scale`` shows a fraction as a percentage and maps it back).

    ``radio``: a choice as horizontal radio buttons instead of a select box. Other keyword arguments go
    to the Streamlit widget (``step``, ``disabled``...). The value is kept across page switches
    (``persist_state="session"``), so a page shows the job its settings started when the user comes back."""
    from diagnostics.registry import ANALYSES

    o = ANALYSES[analysis].option(key)
    c = container or st
    # A page's settings survive a visit to another page: its job (ui.jobs) is found again on return.
    kwargs.setdefault("persist_state", "session")
    wkey = widget_key or f"{analysis}_{key}"
    label = label or o.title
    help_ = kwargs.pop("help", None) or o.help or None
    if o.kind == "bool":
        return c.checkbox(label, value=bool(o.default), key=wkey, help=help_, **kwargs)
    if o.kind == "choice":
        choices = list(o.choices)
        index = choices.index(o.default) if o.default in choices else 0
        if radio:
            return c.radio(label, choices, index=index, key=wkey, help=help_, horizontal=True,
                           format_func=format_func or str, **kwargs)
        return c.selectbox(label, choices, index=index, key=wkey, help=help_, format_func=format_func or str,
                           **kwargs)
    if o.kind == "multi":
        default = list(o.default) if o.default else list(kwargs.pop("default", []) or [])
        offered = list(kwargs.pop("choices", None) or o.choices)  # e.g. what this device supports
        return c.multiselect(label, offered, default=[d for d in default if d in offered], key=wkey, help=help_,
                             format_func=format_func or str, **kwargs)
    if o.kind in ("int", "float"):
        integer = o.kind == "int"
        cast = int if integer else float
        lo = kwargs.pop("min_value", None)
        if lo is None:  # from the declaration; strictly above gt: the smallest value the widget offers
            lo = o.lo if o.lo is not None else (None if o.gt is None else o.gt + (1 if integer else 1e-12))
        hi = kwargs.pop("max_value", o.hi)
        value = kwargs.pop("value", o.default)
        if not integer:
            kwargs.setdefault("format", "%g")
        def shown_as(x):  # rounded, so 0.2 x 100 reads 20 and maps back to exactly 0.2 (same cache key)
            return None if x is None else cast(round(x * scale, 12))

        shown = c.number_input(label, min_value=shown_as(lo), max_value=shown_as(hi), value=shown_as(value),
                               key=wkey, help=help_, **kwargs)
        return None if shown is None else cast(round(shown / scale, 12)) if scale != 1.0 else shown
    return c.text_input(label, value=o.default or "", key=wkey, help=help_, **kwargs)


def unit_columns(df, columns: dict[str, tuple], config: dict | None = None, width: str | None = None):
    """Numeric columns shown with their unit in the header and one scale per unit for the whole
    table (so '(ms)' columns never mix with µs): ``columns`` maps a column to (label, unit) or
    (label, unit, help); ``width`` ('small') keeps a wide table on the page. Returns the rescaled
    copy of ``df`` and the column_config (merged into ``config``)."""
    import pandas as pd

    from diagnostics.units import column_scale

    df = df.copy()
    config = dict(config or {})
    present = {c: spec for c, spec in columns.items() if c in df.columns}
    by_unit: dict[str, list] = {}
    for col, spec in present.items():
        by_unit.setdefault(spec[1], []).extend(pd.to_numeric(df[col], errors="coerce").dropna().tolist())
    scales = {unit: column_scale(values, unit) for unit, values in by_unit.items()
              if unit in _SCALES or unit in ("fraction", "percent")}
    for col, spec in present.items():
        label, unit = spec[0], spec[1]
        help_ = spec[2] if len(spec) > 2 else None
        sc = scales.get(unit)
        if sc is None:
            fmt = "%.2f" if unit == "ratio" else "localized"
            config[col] = st.column_config.NumberColumn(label + (" (x)" if unit == "ratio" else ""), format=fmt,
                                                        help=help_, width=width)
            continue
        df[col] = pd.to_numeric(df[col], errors="coerce") / sc.factor
        config[col] = st.column_config.NumberColumn(sc.header(label), format=sc.number_format(), help=help_,
                                                    width=width)
    return df, config


def missing_as(df, config: dict, texts: dict[str, str]):
    """(df, config) with each column of ``texts`` written out: its numbers in the column's own number
    format (from ``config``), ``texts[column]`` where it has no value (Streamlit shows a missing number
    as 'None'); the column stays right-aligned like a number's."""
    import pandas as pd

    df, config = df.copy(), dict(config)
    for col, text in texts.items():
        if col not in df.columns:
            continue
        old = config.get(col) or {}
        fmt = (old.get("type_config") or {}).get("format") or ""
        df[col] = [text if v is None or pd.isna(v) else (fmt % v if fmt.startswith("%") else f"{v:,.6g}")
                   for v in df[col]]
        config[col] = st.column_config.TextColumn(old.get("label") or col, help=old.get("help"),
                                                  width=old.get("width"), alignment="right")
    return df, config


def chart_key(view: str, ident: str, n: int) -> str:
    """A chart's widget key, unique per (view, result, chart): two results shown on one page (a trace and a
    ranks folder) and two empty figures in one view (a CPU-only trace) would otherwise share an id.
    ``ident``: what identifies the result (its path; a ranks result's alignment and files)."""
    import hashlib

    return f"{view}-{hashlib.sha1(ident.encode()).hexdigest()[:10]}-{n}"
