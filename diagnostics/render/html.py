"""Shareable reports: one self-contained HTML file (plus JSON, CSV and the trace) per result.

``build_report(analysis, result, title) -> str`` renders a result as an HTML page that opens
offline: plotly.js is inlined once, before the first figure, and nothing is fetched from the
network (no CDN, no web fonts). ``write_report_folder`` writes that page next to ``result.json``,
one CSV per table in the result and the Chrome trace from the run's artifacts, when there is one.

What a report shows per analysis is the layout its declaration names as its ``report``
(diagnostics.render.layouts; default: the generic layout, every table of the result). Sections use
the same chart builders as the dashboard, so the report and the page agree. ``result`` is the
analysis' typed result (diagnostics.results; a plain dict for an analysis not converted yet).
"""

from __future__ import annotations

import html
import json
import math
import time
from pathlib import Path

import pandas as pd

from diagnostics.jobfiles import ArtifactError, copy_regular
from diagnostics.render.sections import MAX_HTML_ROWS, Section, generic_sections
from diagnostics.render.tables import find_tables, is_trace_file, safe_filename, write_csv
from diagnostics.render.text import disturbance_line, format_metric, metric_label, shown_metrics
from diagnostics.results import device_of, disturbance_of, metrics_of, model_of, to_json, to_plain



# ----------------------------------------------------------------------------- metrics
def metrics_frame(analysis: str, result) -> pd.DataFrame | None:
    """The headline metrics as a table: label, value in its declared unit, and the raw value."""
    metrics = metrics_of(result)
    if not metrics:
        return None
    return pd.DataFrame([{"metric": metric_label(analysis, k), "value": format_metric(analysis, k, v, metrics),
                          "raw": v if isinstance(v, (int, float, str, bool)) or v is None else json.dumps(v)}
                         for k, v in metrics.items()])


# ----------------------------------------------------------------------------- HTML
_CSS = """
body{font-family:-apple-system,BlinkMacSystemFont,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;margin:0;
     color:#1f2430;background:#fafbfc}
header{background:#1f2430;color:#fff;padding:18px 32px}
header h1{margin:0;font-size:22px} header p{margin:4px 0 0;color:#c9cfdb;font-size:13px}
main{padding:8px 32px 40px;max-width:1300px}
section{background:#fff;border:1px solid #e3e6ec;border-radius:8px;padding:12px 20px;margin:18px 0}
h2{font-size:18px;margin:6px 0 10px} h3{font-size:14px;margin:14px 0 6px;color:#4a5163}
table{border-collapse:collapse;font-size:12.5px;margin:6px 0}
th,td{border-bottom:1px solid #eceef2;padding:4px 10px;text-align:left;vertical-align:top}
th{min-width:3.5em;max-width:11em} td{max-width:32em}
th{background:#f3f5f8;position:sticky;top:0} td.num{text-align:right;font-variant-numeric:tabular-nums}
.tablewrap{max-height:560px;overflow:auto}
.metrics{display:flex;flex-wrap:wrap;gap:10px}
.metric{border:1px solid #e3e6ec;border-radius:6px;padding:8px 12px;min-width:140px}
.metric .k{font-size:11.5px;color:#5b6375} .metric .v{font-size:18px;font-weight:600}
.note{color:#5b6375;font-size:12.5px} .error{color:#b00020}
footer{color:#8a91a3;font-size:12px;padding:0 32px 24px}
"""


def declared_columns(analysis: str) -> dict:
    """Column key -> its declared Column (label and unit), over the analysis' declared tables."""
    from diagnostics.registry import ANALYSES

    out = {}
    for table in getattr(ANALYSES.get(analysis), "tables", ()) or ():
        for col in table.columns:
            out.setdefault(col.key, col)
    return out


def _as_value(v):
    """A cell flattened to JSON by records_frame (a list of notes, a shape, a dict) back to its value."""
    if isinstance(v, str) and v[:1] in "[{" and v[-1:] in "]}":
        try:
            return json.loads(v)
        except ValueError:
            return v
    return v


def _number_text(v) -> str:
    """A number without a declared unit: whole numbers with separators, others to 4 significant digits
    (never '2.69517e+06': large ones are written out)."""
    if isinstance(v, int) or float(v).is_integer() and abs(v) < 1e15:
        return f"{int(v):,}"
    if abs(v) >= 1e4:
        return f"{v:,.0f}"
    return f"{v:.4g}"


def _cell_text(v) -> str:
    v = _as_value(v)
    if v is None or isinstance(v, float) and math.isnan(v):
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int, float)):
        return _number_text(v)
    if isinstance(v, (list, tuple)):
        if not v:
            return ""
        if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
            return "[" + ", ".join(_number_text(x) for x in v) + "]"  # a shape
        if all(isinstance(x, str) for x in v):
            return "; ".join(v)  # notes, names
        return "; ".join(_cell_text(x) for x in v)
    if isinstance(v, dict):
        return ", ".join(f"{k}: {_cell_text(x)}" for k, x in v.items())
    return str(v)


def display_columns(df: pd.DataFrame, columns: dict | None = None) -> list[tuple[str, list[str], bool]]:
    """Each column of ``df`` as a report shows it: (header, cell texts, numeric). A declared column
    (``columns``: key -> Column) gets its label with its unit in the header and every number in one
    scale (as the page's tables); others their key, numbers written out, lists and dicts as text."""
    from diagnostics.units import _FIXED, _SCALES, column_label, column_scale, compact_parts

    out = []
    for key in df.columns:
        values = [_as_value(v) for v in df[key].tolist()]
        col = (columns or {}).get(key)
        nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)
                and not (isinstance(v, float) and math.isnan(v))]
        numeric = bool(nums) and len(nums) == sum(1 for v in values if v is not None and v == v)
        if col is None:  # not declared: its key, words apart
            out.append((str(key).replace("_", " "), [_cell_text(v) for v in values], numeric))
            continue
        label = col.label or str(key)
        values = [None if isinstance(v, float) and math.isnan(v) else v for v in values]
        if numeric and (col.unit in _SCALES or col.unit in _FIXED):
            sc = column_scale(nums, col.unit)
            out.append((sc.header(label), [compact_parts(v, col.unit, sc)[0] for v in values], True))
        elif numeric:
            cells = [_cell_text(v) if col.unit == "number" and v is not None else compact_parts(v, col.unit)[0]
                     for v in values]
            out.append((column_label(label, col.unit), cells, True))
        else:
            out.append((column_label(label, col.unit), [_cell_text(v) for v in values], False))
    return out


#: A text column whose cells average more characters than this goes after the others in a report
#: table, so that the numbers are on screen at 1280 px and the long texts scroll.
LONG_TEXT_CHARS = 24


def _table_html(df: pd.DataFrame, caption: str = "", columns: dict | None = None) -> str:
    n = len(df)
    shown = display_columns(df.head(MAX_HTML_ROWS), columns)
    long = [not num and sum(map(len, cells)) > LONG_TEXT_CHARS * max(1, len(cells)) for _, cells, num in shown]
    shown = [c for c, lg in zip(shown, long) if not lg] + [c for c, lg in zip(shown, long) if lg]
    head = "".join(f"<th>{html.escape(h)}</th>" for h, _, _ in shown)
    rows = []
    for i in range(min(n, MAX_HTML_ROWS)):
        rows.append("<tr>" + "".join(f'<td class="num">{html.escape(cells[i])}</td>' if num else
                                     f"<td>{html.escape(cells[i])}</td>" for _, cells, num in shown) + "</tr>")
    cap = f"<h3>{html.escape(caption)}</h3>" if caption else ""
    more = (f'<p class="note">Showing the first {MAX_HTML_ROWS:,} of {n:,} rows; the CSV file has all of them.</p>'
            if n > MAX_HTML_ROWS else "")
    return (f'{cap}<div class="tablewrap"><table><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}'
            f"</tbody></table></div>{more}")


def _metrics_html(analysis: str, result) -> str:
    metrics = metrics_of(result)
    if not metrics:
        return ""
    cards = "".join(f'<div class="metric"><div class="k" title="{html.escape(k)}">'
                    f'{html.escape(metric_label(analysis, k))}</div>'
                    f'<div class="v">{html.escape(format_metric(analysis, k, v, metrics))}</div></div>'
                    for k, v in shown_metrics(analysis, metrics))
    return f'<section><h2>Headline numbers</h2><div class="metrics">{cards}</div></section>'


def _figure_html(fig, include_js: bool) -> str:
    # include_plotlyjs=True inlines plotly.js (no CDN); config keeps the mode bar from linking out.
    # The report has no Streamlit theme: for_report gives it the white template and uncut axes.
    from diagnostics.render.charts.style import for_report

    fig = for_report(fig)
    return fig.to_html(full_html=False, include_plotlyjs=include_js, include_mathjax=False,
                       config={"displaylogo": False, "responsive": True})


def sections_for(analysis: str, result) -> tuple[list[Section], str | None]:
    """The analysis' sections (the ``report`` layout its declaration names), or, when that layout fails
    on this result, the generic ones plus the reason, which the report shows at its top. (A layout
    that is missing or does not import is a RegistrationError when diagnostics.render.layouts is
    imported: there is no fallback for that.)"""
    from diagnostics.render.layouts import report_of   # the charts (plotly): not needed for a kept body

    fn = report_of(analysis)
    try:
        return fn(result), None
    except Exception as e:  # a report must still come out for an odd result: fall back, say why
        return generic_sections(result), f"the {analysis} report layout failed ({type(e).__name__}: {e}); " \
                                          "showing the generic layout"


def build_report(analysis: str, result, title: str | None = None, *, meta: dict | None = None,
                 memo_dir: Path | str | None = None, memo_text: str | None = None) -> str:
    """A self-contained HTML page for ``result`` (plotly.js inlined once; opens offline). ``memo_dir``: a
    folder where the page's body is kept for a result seen again (render.report_memo), keyed by
    ``memo_text`` (default: the result's JSON; a caller may leave out fields of its run the body does not
    show, such as where its files are)."""
    title = title or f"TorchScope · {analysis}"
    header = {"analysis": analysis, "generated": time.strftime("%Y-%m-%d %H:%M:%S")}
    if model_of(result):
        header["model"] = model_of(result)
    if device_of(result):
        header["device"] = device_of(result)
    header.update(meta or {})
    sub = " · ".join(f"{k}: {v}" for k, v in header.items())
    head = f"<header><h1>{html.escape(title)}</h1><p>{html.escape(sub)}</p></header><main>"
    if memo_dir is not None:
        from diagnostics.render import report_memo

        k = report_memo.key(analysis, memo_text if memo_text is not None else to_json(result, indent=1))
        body = report_memo.read(memo_dir, k)
        if body is None:
            body = _body(analysis, result)
            report_memo.write(memo_dir, k, body)
    else:
        body = _body(analysis, result)
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{html.escape(title)}"
            f"</title><style>{_CSS}</style></head><body>{head}{body}</body></html>")


def _body(analysis: str, result) -> str:
    """The report below its header: everything that follows from the result alone."""
    sections, problem = sections_for(analysis, result)
    columns = declared_columns(analysis)
    parts = []
    if problem:
        parts.append(f'<section><p class="error">{html.escape(problem)}</p></section>')
    report = disturbance_of(result)
    machine = disturbance_line(report)
    if machine:
        cls = "error" if report.disturbed else "note"
        parts.append(f'<section><p class="{cls}">Machine: {html.escape(machine)}</p></section>')
    parts.append(_metrics_html(analysis, result))
    js_done = False
    for s in sections:
        body = [f"<h2>{html.escape(s.title)}</h2>"]
        body += [f"<p>{html.escape(t)}</p>" for t in s.text]
        for fig in s.figures:
            body.append(f'<div class="figure">{_figure_html(fig, not js_done)}</div>')
            js_done = True
        body += [_table_html(df, cap, columns) for cap, df in s.tables]
        parts.append("<section>" + "".join(body) + "</section>")
    parts.append("</main><footer>Made by TorchScope. result.json in the report folder holds every number "
                 "shown here.</footer>")
    return "".join(parts)


def write_report_folder(analysis: str, result, out_dir: Path | str, artifacts: dict | None = None,
                        title: str | None = None, meta: dict | None = None,
                        memo_dir: Path | str | None = None, memo_text: str | None = None) -> dict[str, Path]:
    """Write report.html, result.json, one CSV per table and any Chrome trace into ``out_dir``.

    ``artifacts`` maps names to files of the run (JobOutcome.artifact_dir's files or the store's
    record); the trace files among them are copied, if they are regular files (never through a link,
    never waiting on a FIFO: diagnostics.jobfiles). Returns name -> path of what was written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    path = out / "result.json"
    result_json = to_json(result, indent=1)
    path.write_text(result_json)
    memo_text = result_json if memo_text is None else memo_text
    written["result.json"] = path
    used = {"result", "report"}
    for name, rows in find_tables(to_plain(result)).items():
        stem = safe_filename(name)
        while stem in used:
            stem += "_"
        used.add(stem)
        path = out / f"{stem}.csv"
        write_csv(rows, path)
        written[path.name] = path
    for name, src in (artifacts or {}).items():
        src = Path(src)
        if not is_trace_file(src):
            continue
        dst = out / src.name
        try:  # a run's file: a regular one only (a link or a FIFO a job left there is not followed)
            copy_regular(src, dst)
        except ArtifactError:
            continue
        written[dst.name] = dst
    path = out / "report.html"
    path.write_text(build_report(analysis, result, title, meta=meta, memo_dir=memo_dir, memo_text=memo_text),
                    encoding="utf-8")
    written["report.html"] = path
    return written
