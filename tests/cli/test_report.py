"""diagnostics.render.html in-process: tables found in results, metric units, plotly.js inlined once,
the generic fallback, a failing layout falling back, and the report folder's files."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from diagnostics.render.html import build_report, write_report_folder
from diagnostics.render.sections import MAX_HTML_ROWS, Section
from diagnostics.render.tables import find_tables, records_frame
from diagnostics.render.text import format_metric
from diagnostics.results import to_plain

PLOTLY_BUNDLE_MARK = "window.PlotlyConfig"


@pytest.fixture(scope="module")
def summary_result(tmp_path_factory):
    from diagnostics.runner import Job, execute
    from diagnostics.spec import ModelSpec

    return execute(Job("summary", ModelSpec(name="mlp")), tmp_path_factory.mktemp("art"))


def test_find_tables_nested_and_flattened():
    result = {"metrics": {"a": 1}, "rows": [{"x": 1, "shape": [2, 3]}, {"x": 2, "shape": [4]}],
              "nested": {"inner": [{"k": "v"}], "deeper": {"more": {"too_deep": [{"z": 1}]}}},
              "empty": [], "numbers": [1, 2, 3]}
    tables = find_tables(result, max_depth=2)
    assert list(tables) == ["rows", "nested_inner"]  # numbers/empty are not tables; depth limited
    df = records_frame(tables["rows"])
    assert df["shape"].tolist() == ["[2,3]", "[4]"]  # lists become compact JSON cells
    assert df["x"].tolist() == [1, 2]


@pytest.mark.parametrize("analysis, name, value, text", [
    ("summary", "param_bytes", 3 * 2**20, "3.00 MiB"),
    ("profile", "latency_median_ms", 12.5, "12.50 ms"),
    ("profile", "profile_wall_s", 2.5, "2.50 s"),
    ("profile", "throughput_samples_per_s", 1500.0, "1.5 k/s"),
    ("summary", "flops_forward", 2_000_000, "2 MFLOP"),
    ("summary", "params_total", 26122, "26,122"),
    ("profile", "tensor_core_kernel_pct", None, "n/a"),
    ("checklist", "score", 85.714, "85.7 / 100"),
    ("distributed", "exposed_comm_fraction", 0.4873, "48.7 %"),
    ("distributed", "overlap_ratio", 0.08879, "8.9 %"),
    ("gradients", "dead_relu_fraction_max", 0, "0.0 %"),
    ("optimize", "best_speedup", 1.4249, "x1.42"),
    ("optimize", "best_fix", "amp", "amp"),
    ("trace", "has_gpu", False, "no"),
    # a key the analysis does not declare: a plain number, never a unit guessed from its name
    ("profile", "made_up_ms", 12.5, "12.5"),
])
def test_metric_units_come_from_the_declaration(analysis, name, value, text):
    assert format_metric(analysis, name, value) == text


def test_a_measured_comparison_is_never_shown_without_its_interval_and_verdict():
    from diagnostics.render.text import metric_lines

    metrics = {"speedup": 1.11, "speedup_ci_low": 0.24, "speedup_ci_high": 38.8, "verdict": "within noise",
               "eager_ms": 2.0}
    assert format_metric("compile", "speedup", 1.11, metrics) == "x1.11 [0.24, 38.80], within noise"
    lines = metric_lines("compile", metrics)
    assert any("Compiled speed-up" in line and line.endswith("x1.11 [0.24, 38.80], within noise") for line in lines)
    assert len(lines) == 2  # the interval's ends and the verdict are folded into the speed-up's line
    best = {"best_speedup": 19.22, "best_speedup_ci_low": None, "best_speedup_ci_high": None}
    assert format_metric("optimize", "best_speedup", 19.22, best) == "x19.22 (no interval)"
    html = build_report("compile", {"metrics": metrics, "notes": []}, "c")
    assert "x1.11 [0.24, 38.80], within noise" in html


def test_summary_report_inlines_plotly_once(summary_result):
    html = build_report("summary", summary_result, "mlp summary")
    assert html.count(PLOTLY_BUNDLE_MARK) == 1
    assert html.count("Plotly.newPlot(") == 3  # treemap, top params, top FLOPs
    assert "<title>mlp summary</title>" in html
    assert "26,122" in html  # params_total, formatted
    # every leaf Linear layer is in the table
    leaves_with_params = [l.name for l in summary_result.layers if l.is_leaf and l.params]
    assert leaves_with_params == ["fc1", "fc2", "head"]
    for name in leaves_with_params:
        assert f"<td>{name}</td>" in html
    assert "<script src=" not in html and "<link " not in html


def test_generic_layout_has_every_table_and_no_plotly(monkeypatch):
    from diagnostics.declare import Analysis
    from diagnostics.registry import ANALYSES

    # an analysis that declares no report of its own gets the generic layout (its declared default)
    monkeypatch.setitem(ANALYSES, "plain", Analysis("plain", "Plain", "x:y", view="ui.views.validate:show"))
    result = {"metrics": {"peak_bytes": 1024}, "rows": [{"layer": "a<b>", "value": 1.5}], "label": "x"}
    html = build_report("plain", result)
    assert PLOTLY_BUNDLE_MARK not in html  # no figures -> no 4 MB of JS
    assert "<td>a&lt;b&gt;</td>" in html  # escaped
    # nothing declares this metric's unit: the plain number, not a unit guessed from its name
    assert ">1,024<" in html and "KiB" not in html and "Tables" in html


def test_failing_layout_falls_back_and_says_why(monkeypatch, summary_result):
    def broken(result):
        raise KeyError("layers")

    from diagnostics.render import layouts

    monkeypatch.setitem(layouts._REPORTS, "summary", broken)
    html = build_report("summary", summary_result)
    assert "the summary report layout failed (KeyError" in html
    assert "<td>fc1</td>" in html and ">26,122<" in html  # the generic layout: every table, the metrics


def test_long_tables_are_cut_in_html_but_not_in_csv(tmp_path):
    rows = [{"i": i} for i in range(MAX_HTML_ROWS + 50)]
    written = write_report_folder("validate", {"rows": rows}, tmp_path / "r")  # the generic layout
    html = written["report.html"].read_text()
    assert f"Showing the first {MAX_HTML_ROWS:,} of {len(rows):,} rows" in html
    with open(written["rows.csv"]) as f:
        assert len(list(csv.DictReader(f))) == len(rows)


def test_report_folder_copies_traces_only(tmp_path, summary_result):
    art = tmp_path / "art"
    art.mkdir()
    (art / "trace.json").write_text('{"traceEvents": []}')
    (art / "rank0.pt.trace.json.gz").write_bytes(b"\x1f\x8b")
    (art / "worker.log").write_text("noise")
    written = write_report_folder("summary", summary_result, tmp_path / "out",
                                  {p.name: str(p) for p in art.iterdir()})
    names = {p.name for p in (tmp_path / "out").iterdir()}
    assert names == {"report.html", "result.json", "layers.csv", "inputs.csv", "trace.json",
                     "rank0.pt.trace.json.gz"}
    assert set(written) == names
    assert json.loads((tmp_path / "out" / "result.json").read_text()) == to_plain(summary_result)


def test_every_analysis_declares_its_report_layout():
    """Each analysis names its report layout in its declaration (tests/ui/test_views_registry.py resolves them
    all); only the load check and the timeline re-draw keep the generic one."""
    from diagnostics.declare import GENERIC_REPORT
    from diagnostics.registry import ANALYSES

    generic = {name for name, decl in ANALYSES.items() if decl.report == GENERIC_REPORT}
    assert generic == {"validate", "trace_timeline"}
    from diagnostics.analyses.summary import SummaryMetrics, SummaryResult
    from diagnostics.render.charts.summary import summary_sections

    empty = SummaryResult(model="m", model_type="M", device="cpu", inputs=(), output_shape=None, loss="mse", notes=(),
                          layers=(), metrics=SummaryMetrics(params_total=0, params_trainable=0, params_frozen=0,
                                                            param_bytes=0, buffer_bytes=0, flops_forward=None,
                                                            flops_backward=None, flops_train_step=None,
                                                            tied_parameters=0, batch_size=1))
    assert isinstance(summary_sections(empty)[0], Section)


@pytest.mark.browser
def test_report_renders_offline_in_chromium(tmp_path, summary_result):
    """Open report.html in headless Chromium with every network request blocked: the plots draw."""
    import os
    import shutil

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    if not os.path.exists(chromium):
        pytest.skip("no Chromium on this machine")
    written = write_report_folder("summary", summary_result, tmp_path / "r")
    requested = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))

            def route(r):
                if r.request.url.startswith("file:"):
                    r.continue_()
                else:
                    requested.append(r.request.url)
                    r.abort()

            page.route("**/*", route)
            page.goto(written["report.html"].as_uri())
            page.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length >= 3",
                                   timeout=30000)
            plots = page.evaluate("document.querySelectorAll('.js-plotly-plot').length")
        finally:
            browser.close()
    assert plots == 3
    assert requested == [] and errors == []


def test_a_stored_trace_run_reports_every_section(tmp_path):
    """History's 'Download report' and the CLI both get the analysis' own result: every section."""
    from diagnostics.runner import Job, execute

    gpu = Path(__file__).resolve().parents[1] / "data" / "traces" / "gpu_small.json"
    from diagnostics.analyses.trace.result import TraceResult
    from diagnostics.registry import ANALYSES
    from diagnostics.results import decode, to_plain

    result = execute(Job("trace", None, {"path": str(gpu)}), tmp_path)
    stored = decode(ANALYSES["trace"], json.loads(json.dumps(to_plain(result))))   # as History reads it back
    assert isinstance(stored, TraceResult) and stored.top_operators.operators and stored.launch_stats.sample
    page = build_report("trace", stored, "trace")
    for heading in ("Per step", "Top operators", "GPU idle time", "Kernel launches", "Timeline"):
        assert f">{heading}<" in page, heading


def test_report_tables_show_declared_titles_and_units_not_raw_dumps():
    """The optimize report's trials table was a raw dump: 'median_ms' headers, '2.69517e+06' bytes, notes
    as JSON lists. It shows the declaration's titles with units, one scale per column, notes as text."""
    import re

    from diagnostics.render.html import build_report

    from diagnostics.registry import ANALYSES
    from diagnostics.results import decode

    result = json.loads((Path(__file__).parents[1] / "data" / "tiles" / "optimize-cnn.json").read_text())
    result["rows"][1]["notes"] = ["first note", "second note"]
    page = build_report("optimize", decode(ANALYSES["optimize"], result))
    assert "report layout failed" not in page
    table = page[page.index("<table>", page.index("trials (baseline first)")):]
    table = table[:table.index("</table>")]
    headers = re.findall(r"<th>(.*?)</th>", table)
    assert "median (ms)" in headers and "peak (MiB)" in headers and "size (KiB)" in headers
    assert not any(h.endswith("_ms") or h.endswith("_bytes") for h in headers), headers
    assert "e+0" not in table and "2695168" not in table.replace(",", "")
    assert "<td class=\"num\">2.57</td>" in table  # the baseline's 2,695,168 bytes in the column's MiB
    assert "first note; second note" in table and '["' not in table


@pytest.mark.timeout(30)
def test_report_folder_never_copies_a_symlinked_or_fifo_trace(tmp_path, summary_result):
    """A job's folder could hold a trace.json that is a link to a secret, or a FIFO that blocks
    whoever opens it: neither may reach a report folder (issue #30)."""
    import os

    secret = tmp_path / "id_ed25519"
    secret.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    art = tmp_path / "art"
    art.mkdir()
    (art / "trace.json").symlink_to(secret)
    os.mkfifo(art / "rank1.pt.trace.json")
    (art / "rank0.pt.trace.json").write_text('{"traceEvents": []}')  # control: a regular trace is copied
    written = write_report_folder("summary", summary_result, tmp_path / "out",
                                  {p.name: str(p) for p in art.iterdir()})
    out = tmp_path / "out"
    assert "rank0.pt.trace.json" in written and (out / "rank0.pt.trace.json").read_text() == '{"traceEvents": []}'
    assert "trace.json" not in written and not os.path.lexists(out / "trace.json")
    assert "rank1.pt.trace.json" not in written and not os.path.lexists(out / "rank1.pt.trace.json")
    assert not any("OPENSSH" in p.read_text(errors="replace") for p in out.iterdir())


def test_csv_cells_that_start_like_a_formula_are_written_as_text_and_numbers_stay_numbers(tmp_path):
    """issue 45, item 6: an event named =HYPERLINK(...) must not become a formula in a spreadsheet."""
    rows = [{"name": '=HYPERLINK("http://evil.example","x")', "plus": "+1+1", "at": "@SUM(A1)", "tab": "\t=1",
             "cr": "\r=1", "minus": "-2+3", "fine": "a=b", "n": -3, "x": -0.5, "shape": [-1, 2]}]
    written = write_report_folder("validate", {"rows": rows}, tmp_path / "r")
    with open(written["rows.csv"], newline="") as f:
        got = next(csv.DictReader(f))
    assert got["name"] == '\'=HYPERLINK("http://evil.example","x")'
    assert (got["plus"], got["at"], got["tab"], got["cr"], got["minus"]) == ("'+1+1", "'@SUM(A1)", "'\t=1", "'\r=1",
                                                                           "'-2+3")
    assert (got["fine"], got["n"], got["x"], got["shape"]) == ("a=b", "-3", "-0.5", "[-1,2]")


def test_the_engine_writes_csv_in_one_place():
    """Every CSV goes through render.tables.write_csv (where cells are neutralised)."""
    root = Path(__file__).resolve().parents[2] / "diagnostics"
    writers = [str(p.relative_to(root)) for p in root.rglob("*.py")
               if p.name != "tables.py"
               and any(m in p.read_text() for m in (".to_csv(", "csv.writer", "csv.DictWriter"))]
    assert writers == []
