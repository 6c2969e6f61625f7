"""Runs stored before results were typed still open: each decodes into its analysis' result type without
losing a key, and History shows it.

tests/data/stored/runs-7a4be04.json holds real rows of a run store (runs.sqlite) written by the code at
commit 7a4be04, the last before typed results: the CLI's runner ran validate, summary (an MLP and a
transformer), profile, memory, batch_scan and gradients on the samples, and the rows were exported as
they were stored (result_json as the text the old store wrote; artifacts and pids blanked).
tests/data/stored/runs-fc36ebc.json holds rows made the same way by the code at commit fc36ebc, the last before
checklist, plan and attach had typed results (attach's through the CLI's `run`, an error run among them);
tests/data/stored/runs-dbb9a2c.json the same by the code at commit dbb9a2c, the last before optimize and compile had
typed results (every shape their rows take: artifacts, fixes failed and not applicable, rounds without an interval,
early stop, a time budget, training mode; compile with and without breaks, a training step, inductor).
A part whose shape changed since (the profile's timeline, once in ms with lanes as labels) is read by its result
type's ``upgrade`` hook: each of its figures is checked against the stored one instead.
"""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import pytest

from diagnostics.registry import ANALYSES
from diagnostics.results import decode, to_plain
from diagnostics.store import Store

STORED = sorted((Path(__file__).parent / "data" / "stored").glob("runs-*.json"))
ROWS = [row for path in STORED for row in json.loads(path.read_text())]


def plant(data_dir: Path, extra: tuple = ()) -> Store:
    """A run store holding the old rows exactly as the old store wrote them (raw SQL, not finish_run)."""
    store = Store(data_dir)
    with sqlite3.connect(store.db_path) as db:
        for row in [*ROWS, *extra]:
            cols = list(row)
            db.execute(f"INSERT INTO runs ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                       [row[c] for c in cols])
    return store


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b and type(a) is type(b)


def test_the_stored_runs_cover_the_analyses():
    assert {r["analysis"] for r in ROWS} >= {"validate", "summary", "profile", "memory", "batch_scan", "gradients",
                                             "checklist", "plan", "attach", "optimize", "compile"}


def test_the_stored_trace_and_distributed_runs_cover_their_parts():
    """runs-fc36ebc-trace.json: every part of the trace result (the ranks' and the HTA-parity ones too), the
    recomputed timeline, a diff, and both distributed sources (a launch with its torchrun command)."""
    rows = [json.loads(r["result_json"]) | {"_analysis": r["analysis"]} for r in ROWS]
    assert {r["_analysis"] for r in rows} >= {"trace", "trace_timeline", "trace_diff", "distributed",
                                              "distributed_traces"}
    traces = [r for r in rows if r["_analysis"] == "trace"]
    assert any(r.get("ranks") for r in traces) and any(r.get("kernel_sequences") for r in traces)
    assert any((r.get("critical_path") or {}).get("available") for r in traces)
    assert {r.get("source") for r in rows if r["_analysis"].startswith("distributed")} == {"launch", "folder"}


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r['analysis']}-{r['id'][-8:]}")
def test_a_stored_result_decodes_into_its_type_and_keeps_every_key(row, tmp_path):
    store = plant(tmp_path / "data")
    rec = store.get(row["id"])
    decl = ANALYSES[rec.analysis]
    result = decode(decl, rec.result)
    if decl.result is not None:
        assert isinstance(result, decl.result)
    plain, stored = to_plain(result), rec.result
    if rec.analysis == "profile" and "shown_events" in stored["timeline"]:  # stored before the timeline was typed
        _same_bars(plain.pop("timeline"), stored.pop("timeline"))
    # nothing the old code stored is lost on the way through the type (a key the type lacks would be)
    assert _same(plain, stored), rec.analysis


def _same_bars(new: dict, old: dict) -> None:
    """The profile's old timeline (ms, lanes as labels) read as the Timeline record (µs, lanes as records): every
    bar and count kept, each label a lane of its own, an empty ``shapes`` left out (the record's UNSET)."""
    assert [(l["lane"], l["label"]) for l in new["lanes"]] == [(label, label) for label in old["lanes"]]
    assert (new["in_range"], new["shown"], new["deeper"]) == (old["total_events"], old["shown_events"], old["deeper"])
    assert new["t1"] == pytest.approx(old["span_ms"] * 1e3)
    assert len(new["events"]) == len(old["events"]) > 0
    for n, o in zip(new["events"], old["events"]):
        assert (n["lane"], n["depth"], n["name"], n["cat"], n["count"]) == (o["lane"], o["depth"], o["name"], o["cat"],
                                                                             o["count"])
        assert (n["start_us"], n["dur_us"]) == (pytest.approx(o["start_ms"] * 1e3), pytest.approx(o["dur_ms"] * 1e3))
        assert n.get("shapes", "") == o["shapes"]


def test_history_opens_every_stored_run(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from tests.conftest import APP_PATH
    from ui.jobs import get_store

    # and a run of an analysis since retired: shown with the reason and its stored JSON, not as if it were fine
    retired = dict(ROWS[0], id="20200101-000000-retired0", analysis="retired", result_json='{"metrics": {"x": 1}}')
    monkeypatch.setenv("TORCHSCOPE_DATA_DIR", str(tmp_path / "data"))
    plant(tmp_path / "data", (retired,))
    get_store.clear()  # the dashboard's store, cached per server: this test's folder
    try:
        at = AppTest.from_file(APP_PATH, default_timeout=120)
        at.switch_page("pages/history.py").run()
        assert not at.exception, [e.value for e in at.exception]
        for row in ROWS:
            at.selectbox(key="history_pick").set_value(row["id"]).run()
            assert not at.exception, (row["analysis"], [e.value for e in at.exception])
            assert not [e.value for e in at.error if "cannot be shown" in e.value], row["analysis"]
            assert at.subheader[0].value.startswith(f"{row['analysis']} · "), at.subheader[0].value
            if row["analysis"] == "validate":  # the load check's view: a line, no tiles
                assert any("loaded; output shape" in m.value for m in at.markdown)
            else:  # the analysis' own view drew its tiles
                assert at.metric, row["analysis"]
            labels = [b.label for b in at.get("download_button")]
            assert labels.count("Download result (JSON)") == 1, labels
        at.selectbox(key="history_pick").set_value(retired["id"]).run()
        assert not at.exception, [e.value for e in at.exception]
        assert [e.value for e in at.error] == ["This stored run cannot be shown: unknown analysis 'retired'; known: "
                                               + ", ".join(ANALYSES)]
        assert at.expander[0].label == "The stored result (JSON)" and at.json[0].value == '{"metrics": {"x": 1}}'
    finally:
        get_store.clear()
