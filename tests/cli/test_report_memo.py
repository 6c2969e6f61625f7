"""The report body kept for a result seen again (diagnostics.render.report_memo, issue #42): a ``trace analyze``
reopen writes the same report as its first open without drawing a chart, and a different result, or code,
is drawn afresh."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from diagnostics.render import report_memo

TRACE = Path(__file__).resolve().parents[1] / "data" / "traces" / "gpu_small.json"
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _body(report: Path) -> str:
    """The page below its header (the header has the run id and the time), plotly's random div ids made equal."""
    text = report.read_text(encoding="utf-8")
    return _UUID.sub("ID", text[text.index("</header>"):])


def _analyze(trace: Path, out: Path, store: Path) -> None:
    from diagnostics.cli.main import main

    assert main(["trace", "analyze", str(trace), "--json", "-q", "--out", str(out), "--data-dir", str(store)]) == 0


def test_a_trace_reopen_writes_the_first_opens_report_without_drawing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TORCHSCOPE_DATA_DIR", str(tmp_path / "store"))
    trace = tmp_path / "gpu_small.json"
    shutil.copyfile(TRACE, trace)
    _analyze(trace, tmp_path / "first", tmp_path / "store")
    kept = list((tmp_path / "store" / report_memo.MEMO_DIR).glob("*.body.html"))
    assert len(kept) == 1
    import diagnostics.render.html as html

    drawn = []
    real = html._body
    monkeypatch.setattr(html, "_body", lambda *a: drawn.append(a) or real(*a))
    _analyze(trace, tmp_path / "again", tmp_path / "store")     # a reopen: the stored result, the kept body
    assert drawn == []
    assert _body(tmp_path / "again" / "report.html") == _body(tmp_path / "first" / "report.html")
    first = (tmp_path / "first" / "report.html").read_text(encoding="utf-8")
    assert "plotly" in first and first.count("<section>") > 3   # a real report, charts and tables
    # the memo's key leaves out how the open went and where the run's files are: a reopen drawn afresh
    # (no kept body) gives the same page, so those fields are not shown
    shutil.rmtree(tmp_path / "store" / report_memo.MEMO_DIR)
    _analyze(trace, tmp_path / "drawn", tmp_path / "store")
    assert len(drawn) == 1
    assert _body(tmp_path / "drawn" / "report.html") == _body(tmp_path / "first" / "report.html")


def test_another_result_or_code_is_drawn_again_and_old_bodies_are_pruned(tmp_path, monkeypatch):
    folder = tmp_path / "memo"
    k1, k2 = report_memo.key("trace", '{"a": 1}'), report_memo.key("trace", '{"a": 2}')
    assert k1 != k2 and k1 != report_memo.key("trace_diff", '{"a": 1}')
    assert report_memo.read(folder, k1) is None
    report_memo.write(folder, k1, "<section>one</section>")
    assert report_memo.read(folder, k1) == "<section>one</section>" and report_memo.read(folder, k2) is None
    monkeypatch.setattr(report_memo, "_CODE", ["other code"])
    assert report_memo.key("trace", '{"a": 1}') != k1
    monkeypatch.setattr(report_memo, "MAX_FILES", 3)
    for n in range(5):
        report_memo.write(folder, f"k{n}", f"body {n}")
    assert sorted(p.name for p in folder.glob("*.body.html")) == ["k2.body.html", "k3.body.html", "k4.body.html"]


def test_a_kept_body_that_is_not_a_regular_file_is_a_miss(tmp_path):
    folder = tmp_path / "memo"
    folder.mkdir()
    (tmp_path / "elsewhere.html").write_text("<script>not ours</script>")
    (folder / "k.body.html").symlink_to(tmp_path / "elsewhere.html")
    assert report_memo.read(folder, "k") is None
    report_memo.write(folder, "k", "<p>ours</p>")       # replaces the link with a file of its own
    assert report_memo.read(folder, "k") == "<p>ours</p>"
    assert (tmp_path / "elsewhere.html").read_text() == "<script>not ours</script>"


def test_a_kept_body_others_may_write_is_a_miss(tmp_path):
    folder = tmp_path / "memo"
    report_memo.write(folder, "k", "<p>ours</p>")
    path = folder / "k.body.html"
    assert oct(path.stat().st_mode & 0o777) == "0o600" and report_memo.read(folder, "k") == "<p>ours</p>"
    path.chmod(0o666)
    assert report_memo.read(folder, "k") is None
