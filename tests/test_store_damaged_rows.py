"""One bad row never breaks History (issue 45, item 5): a row whose columns a job, an attached script
or another program wrote wrong is read as damaged, with what is wrong, and every other row, ``history
list / compare / trend`` and the History page work as before."""

from __future__ import annotations

import json
import sqlite3

import pytest

from diagnostics.cli.main import main
from diagnostics.store import Store

#: (column, SQL value, what RunRecord.damaged must say)
BAD = [
    ("started", "'yesterday'", "started 'yesterday' is not a time"),
    ("started", "1e300", "started 1e+300 is not a time"),
    ("started", "-1e18", "started -1e+18 is not a time"),
    ("result_json", "'{\"metrics\": {\"peak_train_bytes\": 3'", "result_json is not valid JSON"),
    ("result_json", "'[1, 2]'", "result_json holds a list, not an object or null"),
    ("result_json", "'" + "[" * 100_000 + "]" * 100_000 + "'", "result_json is nested too deep to read"),
    ("metrics_json", "'{\"peak_train_bytes\": '", "metrics_json is not valid JSON"),
    ("metrics_json", "'[4194304]'", "metrics_json holds a list, not an object"),
    ("metrics_json", "'{\"peak_train_bytes\": {\"a\": 1}}'", "metrics_json: 'peak_train_bytes' not a number"),
    ("options_json", "'{\"steps\": '", "options_json is not valid JSON"),
    ("options_json", "'\"text\"'", "options_json holds a string, not an object"),
    ("options_json", "'" + "{\"a\":" * 100_000 + "1" + "}" * 100_000 + "'", "options_json is nested too deep"),
    ("artifacts_json", "'7'", "artifacts_json holds a number, not an object"),
]


def _runs(tmp_path, n=3):
    store = Store(tmp_path)
    ids = []
    for i in range(n):
        rid = store.create_run("memory", spec=None, options={"steps": 2}, cache_key=None,
                               model_label="mlp (sample)", device="cpu")
        store.finish_run(rid, "ok", result={"metrics": {"peak_train_bytes": (4 - i) * 2**20}})
        ids.append(rid)
    return store, ids


def _damage(store, rid, column, value):
    db = sqlite3.connect(store.db_path)
    db.execute(f"UPDATE runs SET {column}={value} WHERE id=?", (rid,))
    db.commit()
    db.close()


@pytest.mark.parametrize("column,value,says", BAD, ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(BAD)])
def test_a_bad_row_is_read_as_damaged_and_history_works(tmp_path, capsys, column, value, says):
    store, (a, bad, b) = _runs(tmp_path)
    _damage(store, bad, column, value)
    rec = store.get(bad)
    assert rec.damaged and says in rec.damaged
    assert store.get(a).damaged is None and store.get(b).damaged is None
    listed = {r.id: r for r in store.list()}
    assert set(listed) == {a, bad, b}
    if column != "result_json":  # the listing leaves result bodies out
        assert says in listed[bad].damaged
    d = ["--data-dir", str(tmp_path)]
    assert main(["history", "list", *d]) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 3 and "Traceback" not in out
    line = next(x for x in out.splitlines() if x.startswith(bad))
    if column != "result_json":
        assert f"[damaged: {says}" in line
    # the two good runs still compare; the damaged one is refused by name
    assert main(["history", "compare", a, b, *d]) == 0
    assert "4.00 MiB -> 2.00 MiB" in capsys.readouterr().out
    assert main(["history", "compare", a, bad, *d]) == 2
    err = capsys.readouterr().err
    assert f"run B ({bad}) is damaged in the run store" in err and says in err
    assert main(["history", "trend", "--analysis", "memory", "--metric", "peak_train_bytes", "--json", *d]) == 0
    t = json.loads(capsys.readouterr().out)
    if column != "result_json":
        assert [r["id"] for r in t["rows"]] == [a, b] and t["damaged"] == 1


def test_a_metric_stored_as_text_is_no_number_in_compare_or_trend(tmp_path, capsys):
    store, (a, bad, b) = _runs(tmp_path)
    _damage(store, bad, "metrics_json", "'{\"peak_train_bytes\": \"4 MiB\"}'")
    d = ["--data-dir", str(tmp_path)]
    assert main(["history", "compare", a, bad, "--json", *d]) == 0
    row = next(r for r in json.loads(capsys.readouterr().out)["rows"] if r["key"] == "peak_train_bytes")
    assert row["b"] == "4 MiB" and row["delta"] is None and row["verdict"] == "changed"
    assert main(["history", "trend", "--analysis", "memory", "--metric", "peak_train_bytes", "--json", *d]) == 0
    t = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in t["rows"]] == [a, b] and t["missing"] == 1


def test_terminal_escapes_in_a_stored_label_are_printed_escaped(tmp_path, capsys):
    store = Store(tmp_path)
    ids = []
    for peak in (4 * 2**20, 3 * 2**20):
        rid = store.create_run("memory", spec=None, options={}, cache_key=None, device="cpu",
                               model_label="m\x1b]0;pwned\x07\x1b[2J\rfake line\n")
        store.finish_run(rid, "ok", result={"metrics": {"peak_train_bytes": peak}})
        ids.append(rid)
    d = ["--data-dir", str(tmp_path)]
    for argv in (["history", "compare", *ids], ["history", "list"],
                 ["history", "trend", "--analysis", "memory", "--metric", "peak_train_bytes"]):
        assert main([*argv, *d]) == 0
        out = capsys.readouterr().out
        assert "\x1b" not in out and "\r" not in out and "\x07" not in out, argv
    assert main(["history", "compare", *ids, *d]) == 0
    assert "m\\x1b]0;pwned\\x07\\x1b[2J\\rfake line\\n" in capsys.readouterr().out


def test_a_running_row_of_a_dead_tool_gets_a_final_status_on_the_next_history_read(tmp_path, capsys):
    store = Store(tmp_path)
    rid = store.create_run("attach", spec=None, options={}, cache_key=None, model_label="x", device=None,
                           pid=2**22 + 4321)  # a pid no process has
    assert main(["history", "list", "--data-dir", str(tmp_path)]) == 0
    assert "interrupted" in capsys.readouterr().out
    rec = store.get(rid)
    assert rec.status == "interrupted"
    assert f"pid {2**22 + 4321}) stopped before it finished and stored no status" in rec.error


def test_a_damaged_row_is_no_cache_hit(tmp_path):
    store = Store(tmp_path)
    rid = store.create_run("memory", spec=None, options={}, cache_key="k", model_label="m", device="cpu")
    store.finish_run(rid, "ok", result={"metrics": {"peak_train_bytes": 1}})
    assert store.find_cached("k").id == rid
    _damage(store, rid, "result_json", "'{\"metrics\": '")
    assert store.find_cached("k") is None
