"""Shareable reports: one self-contained HTML file (plus JSON, CSV and the trace) per result.

``build_report(analysis, result, title) -> str`` renders a result as an HTML page that opens
offline: plotly.js is inlined once, before the first figure, and nothing is fetched from the
network (no CDN, no web fonts). ``write_report_folder`` writes that page next to ``result.json``,
one CSV per table in the result and the Chrome trace from the run's artifacts, when there is one.

What a report shows per analysis is registered in ``SECTIONS`` (analysis -> fn(result) ->
list[Section]); an analysis without an entry gets the generic layout: every list of records in
the result as a table. Sections take figures from the same ``diagnostics.render.charts`` builders the
dashboard uses, so the report and the page agree.
"""

from __future__ import annotations

import html
import json
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pandas as pd

from diagnostics.render.text import format_metric, metric_label

#: Rows of a table shown in the HTML; the CSV next to it always has all of them.
MAX_HTML_ROWS = 200
#: Nesting depth searched for tables (lists of records) in a result.
MAX_TABLE_DEPTH = 3
#: Artifact files copied into the report folder: Chrome traces, by name.
TRACE_SUFFIXES = (".json", ".json.gz")


@dataclass
class Section:
    """One titled part of a report: paragraphs, then figures, then (caption, table) pairs."""

    title: str
    text: list[str] = field(default_factory=list)
    figures: list = field(default_factory=list)  # plotly Figures
    tables: list[tuple[str, pd.DataFrame]] = field(default_factory=list)


# ----------------------------------------------------------------------------- tables in a result
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


def records_frame(records: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(records)
    for col in df.columns:
        if df[col].map(lambda v: isinstance(v, (list, dict, tuple))).any():
            df[col] = df[col].map(_flat_cell)
    return df


def safe_filename(name: str) -> str:
    keep = "".join(c if (c.isalnum() or c in "-_.") else "_" for c in name).strip("._")
    return keep[:80] or "table"


# ----------------------------------------------------------------------------- metrics
def metrics_frame(analysis: str, result: dict) -> pd.DataFrame | None:
    """The headline metrics as a table: label, value in its declared unit, and the raw value."""
    metrics = result.get("metrics") if isinstance(result, dict) else None
    if not isinstance(metrics, dict) or not metrics:
        return None
    return pd.DataFrame([{"metric": metric_label(analysis, k), "value": format_metric(analysis, k, v),
                          "raw": v if isinstance(v, (int, float, str, bool)) or v is None else json.dumps(v)}
                         for k, v in metrics.items()])


# ----------------------------------------------------------------------------- sections
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


def summary_sections(result: dict) -> list[Section]:
    from diagnostics.render.charts.summary import build_param_treemap_figure, build_top_layers_figure

    inputs = ", ".join(f"{i['shape']} {i['dtype']}" for i in result.get("inputs", []))
    overview = [f"{result.get('model', '?')} · {result.get('model_type', '?')} · inputs {inputs} · "
                f"output {result.get('output_shape')} · device {result.get('device')} · loss: {result.get('loss')}"]
    overview += [str(n) for n in result.get("notes", [])]
    layers = pd.DataFrame(result["layers"])
    if not layers.empty:
        leaves = layers[(layers["is_leaf"] | (layers["params"] > 0)) & (layers["name"] != "(model)")]
        leaves = leaves[["name", "type", "output_shape", "params", "pct_of_total", "trainable",
                         "flops_forward", "flops_backward"]].copy()
        leaves["output_shape"] = leaves["output_shape"].map(lambda s: "" if s is None else str(s))
        leaves["pct_of_total"] = leaves["pct_of_total"].round(2)
    else:
        leaves = layers
    return [
        Section("Overview", text=overview),
        Section("Where the parameters are", figures=[build_param_treemap_figure(result),
                                                     build_top_layers_figure(result, "params")]),
        Section("Where the FLOPs are", figures=[build_top_layers_figure(result, "flops")]),
        Section("Layers", text=["Leaf layers and layers that own parameters; layers.csv has every module."],
                tables=[("layers", leaves)]),
    ]


def _records(result: dict, key: str, columns: list[str] | None = None, n: int | None = None) -> pd.DataFrame:
    df = records_frame(result.get(key) or [])
    if columns and not df.empty:
        df = df[[c for c in columns if c in df.columns]]
    return df.head(n) if n else df


def profile_sections(result: dict) -> list[Section]:
    from diagnostics.render.charts import profiler as ch

    lat = result.get("latency") or {}
    cfg = [f"{result.get('model')} · {result.get('mode')} · batch {result.get('batch_size')} · device "
           f"{result.get('device')} · torch {result.get('torch_version', '?')}"]
    if lat:
        cfg.append(f"Latency: {lat.get('iterations')} timed iterations after {lat.get('warmup')} warm-up, outside the "
                   f"profiler ({lat.get('method', '')}).")
    cfg += [str(n) for n in result.get("notes", [])]
    sections = [
        Section("Run", text=cfg),
        Section("Latency", figures=[ch.build_latency_histogram_figure(result)]),
        Section("Steps", figures=[ch.build_step_breakdown_figure(result), ch.build_device_split_figure(result)],
                tables=[("steps", _records(result, "steps"))]),
        Section("Operators", figures=[ch.build_top_operators_figure(result)],
                tables=[("operators (operators.csv has all, operators_by_shape.csv by input shape)",
                         _records(result, "operators", n=50))]),
    ]
    if result.get("modules"):
        sections.append(Section("Modules", figures=[ch.build_module_tree_figure(result)]))
    if result.get("kernels"):
        sections.append(Section("GPU kernels", figures=[ch.build_kernel_figure(result)],
                                tables=[("kernels", _records(result, "kernels", n=50))]))
    if (result.get("timeline") or {}).get("events"):
        sections.append(Section("Timeline", figures=[ch.build_timeline_figure(result)]))
    files = [Path(p).name for p in (result.get("artifacts") or {}).values()]
    if files:
        sections.append(Section("Trace files", text=[
            "The Chrome trace in this folder (" + ", ".join(f for f in files if _is_trace(Path(f))) + ") opens in "
            "https://ui.perfetto.dev or chrome://tracing, and in `python -m diagnostics trace analyze`."]))
    return sections


def _figures(*builders) -> tuple[list, list[str]]:
    """Call each zero-argument builder; a figure that cannot be drawn becomes a note, not a failure."""
    figs, notes = [], []
    for build in builders:
        try:
            figs.append(build())
        except Exception as e:  # one odd chart must not cost the whole report
            notes.append(f"a chart could not be drawn: {type(e).__name__}: {e}")
    return figs, notes


def _section(title: str, builders=(), tables=(), text=()) -> Section:
    figs, notes = _figures(*builders)
    return Section(title, text=list(text) + notes, figures=figs, tables=list(tables))


def _notes(result: dict) -> list[str]:
    return [str(n) for n in result.get("notes", []) or []]


def memory_sections(result: dict) -> list[Section]:
    from diagnostics.render.charts import memory as ch

    sections = [_section("Memory at the peak", [lambda: ch.build_memory_breakdown_figure(result)],
                         text=_notes(result)),
                _section("Estimate against measurement", [lambda: ch.build_estimate_figure(result)]),
                _section("Activations by layer", [lambda: ch.build_layer_activation_figure(result)]),
                _section("Over time", [lambda: ch.build_memory_timeline_figure(result)])]
    tables = [(name, records_frame(rows)) for name, rows in find_tables(result).items()
              if name not in ("inputs",) and not name.startswith("timeline")]
    if tables:
        sections.append(Section("Tables", tables=[(n, df.head(MAX_HTML_ROWS)) for n, df in tables]))
    return sections


def batch_scan_sections(result: dict) -> list[Section]:
    from diagnostics.render.charts import memory as ch

    return [_section("Batch-size scan", [lambda: ch.build_batch_scan_figure(result)], text=_notes(result),
                     tables=[(n, records_frame(r)) for n, r in find_tables(result).items() if n != "inputs"])]


def gradients_sections(result: dict) -> list[Section]:
    from diagnostics.render.charts import gradients as ch

    verdict = result.get("verdict")
    text = ([f"Verdict: {verdict if isinstance(verdict, str) else json.dumps(verdict, default=str)}"]
            if verdict else []) + _notes(result)
    return [
        _section("Gradient flow", [lambda: ch.build_grad_norm_depth_figure(result),
                                   lambda: ch.build_global_norm_figure(result)], text=text),
        _section("Per layer and step", [lambda: ch.build_grad_heatmap_figure(result)]),
        _section("Activations", [lambda: ch.build_activation_health_figure(result)]),
        Section("Tables", tables=[(n, records_frame(r)) for n, r in find_tables(result).items() if n != "inputs"]),
    ]


def optimize_sections(result: dict) -> list[Section]:
    from diagnostics.render.charts import optimize as ch

    return [
        _section("Trials", [lambda: ch.build_latency_figure(result), lambda: ch.build_speedup_figure(result)],
                 text=_notes(result), tables=[("trials (baseline first)", _records(result, "rows"))]),
        _section("Size and fidelity", [lambda: ch.build_size_figure(result), lambda: ch.build_fidelity_figure(result)]),
    ]


def distributed_sections(result: dict) -> list[Section]:
    from diagnostics.render.charts import distributed as ch

    return [
        _section("Ranks", [lambda: ch.build_rank_step_figure(result), lambda: ch.build_breakdown_figure(result)],
                 text=_notes(result)),
        _section("Communication", [lambda: ch.build_collectives_figure(result),
                                   lambda: ch.build_overlap_figure(result)]),
        Section("Tables", tables=[(n, records_frame(r)) for n, r in find_tables(result).items()]),
    ]


def trace_sections(result: dict) -> list[Section]:
    from diagnostics.render.charts import traces as ch

    s = result.get("summary") or {}
    text = [f"{result.get('name', s.get('source', 'trace'))}: {s.get('events', 0):,} events, "
            f"duration {(s.get('duration_us') or 0) / 1e3:,.3f} ms, {s.get('n_steps', 0)} steps, "
            f"{'GPU' if s.get('has_gpu') else 'CPU only'}"] + [f"warning: {w}" for w in s.get("warnings") or []]
    top = result.get("top_operators") or {}
    idle, launch = result.get("idle_time") or {}, result.get("launch_stats")
    sections = [_section("Trace", [lambda: ch.build_category_figure(s)], text=text)]
    if result.get("temporal_breakdown"):
        tb = result["temporal_breakdown"]
        sections.append(_section("Per step", [lambda: ch.build_gpu_breakdown_figure(tb),
                                              lambda: ch.build_cpu_breakdown_figure(tb)]))
    if top:
        builders = [lambda: ch.build_top_operators_figure(top, "operators")]
        if top.get("kernels"):
            builders.append(lambda: ch.build_top_operators_figure(top, "kernels"))
        sections.append(_section("Top operators", builders, tables=[("operators", records_frame(
            top.get("operators") or []))]))
    if idle.get("streams"):
        sections.append(_section("GPU idle time", [lambda: ch.build_idle_time_figure(idle)]))
    if launch and s.get("has_gpu"):
        sections.append(_section("Kernel launches", [lambda: ch.build_launch_figure(launch)]))
    if result.get("timeline"):
        sections.append(_section("Timeline", [lambda: ch.build_timeline_figure(result["timeline"])]))
    return sections


def trace_diff_sections(result: dict) -> list[Section]:
    from diagnostics.render.charts import traces as ch

    d = result.get("diff") or result
    c = d.get("counts") or {}
    text = [f"{result.get('before', 'before')} -> {result.get('after', 'after')} ({d.get('unit', '')}): "
            f"{(d.get('time_us_before') or 0) / 1e3:,.3f} ms -> {(d.get('time_us_after') or 0) / 1e3:,.3f} ms; "
            + ", ".join(f"{v} {k}" for k, v in c.items())]
    return [_section("Trace diff", [lambda: ch.build_diff_figure(d)], text=text,
                     tables=[("changes", records_frame(d.get("rows") or []))])]


def checklist_sections(result: dict) -> list[Section]:
    """Score and charts, then one table per category (failures and warnings first: status, evidence,
    suggestion, fix), the rules that do not apply here, and the thresholds."""
    from diagnostics.analyses.checklist import SCORE_FORMULA
    from diagnostics.analyses.checklist.rules import CATEGORIES
    from diagnostics.render.charts import checklist as ch

    counts = result.get("counts") or {}
    text = [f"Score {result.get('score', 0):.1f} / 100 for {result.get('purpose', '?')} on {result.get('device')}: "
            + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in counts.items()) + ".",
            SCORE_FORMULA]
    text += [str(n) for n in result.get("notes", [])]
    order = ("error", "fail", "warn", "pass", "not_applicable")  # what needs attention first
    findings = sorted(result.get("findings") or [], key=lambda f: order.index(f.get("status", "not_applicable")))
    cols = ["status", "title", "id", "evidence", "suggestion", "fix"]

    figs, notes = _figures(lambda: ch.build_score_gauge_figure(result),
                           lambda: ch.build_status_by_category_figure(result))
    sections = [Section("Checklist", text=text + notes, figures=figs)]
    for cat in CATEGORIES:
        rows = [f for f in findings if f.get("category") == cat and f.get("status") != "not_applicable"]
        if rows:
            df = records_frame(rows)
            sections.append(Section(str(cat).capitalize(), tables=[("", df[[c for c in cols if c in df.columns]])]))
    rest = [f for f in findings if f.get("status") == "not_applicable"]
    if rest:
        sections.append(Section("Not applicable here", tables=[
            ("", records_frame(rest)[["category", "id", "title", "evidence"]])]))
    if result.get("thresholds"):
        sections.append(Section("Thresholds", tables=[("", _records(result, "thresholds"))]))
    return sections


#: analysis -> fn(result) -> list[Section]. One entry per analysis with its own report layout.
SECTIONS: dict[str, Callable[[dict], list[Section]]] = {
    "summary": summary_sections,
    "profile": profile_sections,
    "checklist": checklist_sections,
    "memory": memory_sections,
    "batch_scan": batch_scan_sections,
    "gradients": gradients_sections,
    "optimize": optimize_sections,
    "distributed": distributed_sections,
    "distributed_traces": distributed_sections,
    "trace": trace_sections,
    "trace_diff": trace_diff_sections,
}


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
th{background:#f3f5f8;position:sticky;top:0} td.num{text-align:right;font-variant-numeric:tabular-nums}
.tablewrap{max-height:560px;overflow:auto}
.metrics{display:flex;flex-wrap:wrap;gap:10px}
.metric{border:1px solid #e3e6ec;border-radius:6px;padding:8px 12px;min-width:140px}
.metric .k{font-size:11.5px;color:#5b6375} .metric .v{font-size:18px;font-weight:600}
.note{color:#5b6375;font-size:12.5px} .error{color:#b00020}
footer{color:#8a91a3;font-size:12px;padding:0 32px 24px}
"""


def _table_html(df: pd.DataFrame, caption: str = "") -> str:
    n = len(df)
    shown = df.head(MAX_HTML_ROWS)
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in shown.columns)
    rows = []
    for row in shown.itertuples(index=False):
        cells = []
        for v in row:
            num = isinstance(v, (int, float)) and not isinstance(v, bool)
            if isinstance(v, float):
                text = "" if math.isnan(v) else f"{v:.6g}"
            elif num:
                text = f"{v:,}"
            else:
                text = "" if v is None else str(_flat_cell(v))
            cells.append(f'<td class="num">{text}</td>' if num else f"<td>{html.escape(text)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    cap = f"<h3>{html.escape(caption)}</h3>" if caption else ""
    more = (f'<p class="note">Showing the first {MAX_HTML_ROWS:,} of {n:,} rows; the CSV file has all of them.</p>'
            if n > MAX_HTML_ROWS else "")
    return (f'{cap}<div class="tablewrap"><table><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}'
            f"</tbody></table></div>{more}")


def _metrics_html(analysis: str, result: dict) -> str:
    metrics = result.get("metrics") if isinstance(result, dict) else None
    if not isinstance(metrics, dict) or not metrics:
        return ""
    cards = "".join(f'<div class="metric"><div class="k" title="{html.escape(k)}">'
                    f'{html.escape(metric_label(analysis, k))}</div>'
                    f'<div class="v">{html.escape(format_metric(analysis, k, v))}</div></div>'
                    for k, v in metrics.items())
    return f'<section><h2>Headline numbers</h2><div class="metrics">{cards}</div></section>'


def _figure_html(fig, include_js: bool) -> str:
    # include_plotlyjs=True inlines plotly.js (no CDN); config keeps the mode bar from linking out.
    return fig.to_html(full_html=False, include_plotlyjs=include_js, include_mathjax=False,
                       config={"displaylogo": False, "responsive": True})


def sections_for(analysis: str, result: dict) -> tuple[list[Section], str | None]:
    """The analysis' sections, or the generic ones plus the reason when its builder failed."""
    fn = SECTIONS.get(analysis)
    if fn is None:
        return generic_sections(result), None
    try:
        return fn(result), None
    except Exception as e:  # a report must still come out for an odd result: fall back, say why
        return generic_sections(result), f"the {analysis} report layout failed ({type(e).__name__}: {e}); " \
                                          "showing the generic layout"


def build_report(analysis: str, result: dict, title: str | None = None, *, meta: dict | None = None) -> str:
    """A self-contained HTML page for ``result`` (plotly.js inlined once; opens offline)."""
    title = title or f"TorchScope · {analysis}"
    sections, problem = sections_for(analysis, result)
    facts = {"analysis": analysis, "generated": time.strftime("%Y-%m-%d %H:%M:%S")}
    if isinstance(result, dict) and result.get("model"):
        facts["model"] = result["model"]
    if isinstance(result, dict) and result.get("device"):
        facts["device"] = result["device"]
    facts.update(meta or {})
    sub = " · ".join(f"{k}: {v}" for k, v in facts.items())
    parts = [f"<header><h1>{html.escape(title)}</h1><p>{html.escape(sub)}</p></header><main>"]
    if problem:
        parts.append(f'<section><p class="error">{html.escape(problem)}</p></section>')
    parts.append(_metrics_html(analysis, result))
    js_done = False
    for s in sections:
        body = [f"<h2>{html.escape(s.title)}</h2>"]
        body += [f"<p>{html.escape(t)}</p>" for t in s.text]
        for fig in s.figures:
            body.append(f'<div class="figure">{_figure_html(fig, not js_done)}</div>')
            js_done = True
        body += [_table_html(df, cap) for cap, df in s.tables]
        parts.append("<section>" + "".join(body) + "</section>")
    parts.append("</main><footer>Made by TorchScope. result.json in the report folder holds every number "
                 "shown here.</footer>")
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{html.escape(title)}"
            f"</title><style>{_CSS}</style></head><body>{''.join(parts)}</body></html>")


def _is_trace(path: Path) -> bool:
    name = path.name.lower()
    return "trace" in name and name.endswith(TRACE_SUFFIXES)


def write_report_folder(analysis: str, result: dict, out_dir: Path | str, artifacts: dict | None = None,
                        title: str | None = None, meta: dict | None = None) -> dict[str, Path]:
    """Write report.html, result.json, one CSV per table and any Chrome trace into ``out_dir``.

    ``artifacts`` maps names to files of the run (JobOutcome.artifact_dir's files or the store's
    record); the trace files among them are copied. Returns name -> path of what was written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    path = out / "result.json"
    path.write_text(json.dumps(result, indent=1, default=str))
    written["result.json"] = path
    used = {"result", "report"}
    for name, rows in find_tables(result).items():
        stem = safe_filename(name)
        while stem in used:
            stem += "_"
        used.add(stem)
        path = out / f"{stem}.csv"
        records_frame(rows).to_csv(path, index=False)
        written[path.name] = path
    for name, src in (artifacts or {}).items():
        src = Path(src)
        if src.is_file() and _is_trace(src):
            dst = out / src.name
            shutil.copyfile(src, dst)
            written[dst.name] = dst
    path = out / "report.html"
    path.write_text(build_report(analysis, result, title, meta=meta), encoding="utf-8")
    written["report.html"] = path
    return written
