"""``python -m diagnostics history list / compare / trend`` on a store written in the test."""

from __future__ import annotations

import io
import json

from diagnostics.cli.main import main
from diagnostics.store import Store


def _store(tmp_path):
    store = Store(tmp_path)
    ids = []
    for peak in (4 * 2**20, 3 * 2**20):
        run_id = store.create_run("memory", spec=None, options={}, cache_key=None, model_label="mlp (sample)",
                                  device="cpu")
        store.finish_run(run_id, "ok", result={"metrics": {"peak_train_bytes": peak}})
        ids.append(run_id)
    return ids


def test_compare_by_prefix_as_json_and_text(tmp_path, capsys):
    a, b = _store(tmp_path)
    assert main(["history", "compare", a, b[:-2], "--json", "--data-dir", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    peak = next(r for r in out["rows"] if r["key"] == "peak_train_bytes")
    assert peak["ratio"] == 0.75 and peak["verdict"] == "better" and peak["delta"] == -2**20
    assert main(["history", "compare", a, b, "--data-dir", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "Training-step peak" in text and "4.00 MiB -> 3.00 MiB" in text and "-25.0 %  better" in text


def test_trend_and_list(tmp_path, capsys):
    a, b = _store(tmp_path)
    assert main(["history", "trend", "--analysis", "memory", "--metric", "peak_train_bytes", "--json",
                 "--data-dir", str(tmp_path)]) == 0
    t = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in t["rows"]] == [a, b] and [r["value"] for r in t["rows"]] == [4 * 2**20, 3 * 2**20]
    assert main(["history", "list", "--data-dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(b) and "memory" in lines[0] and "mlp (sample)" in lines[0]


def test_bad_ids_and_metrics_exit_2_naming_the_problem(tmp_path, capsys):
    a, _ = _store(tmp_path)
    assert main(["history", "compare", a, "nosuchrun", "--data-dir", str(tmp_path)]) == 2
    assert f"no run with id 'nosuchrun' in {tmp_path}" in capsys.readouterr().err
    assert main(["history", "compare", a, "2", "--data-dir", str(tmp_path)]) == 2
    assert "is ambiguous" in capsys.readouterr().err
    assert main(["history", "trend", "--analysis", "memory", "--metric", "latency", "--data-dir", str(tmp_path)]) == 2
    assert "'memory' has no metric 'latency'" in capsys.readouterr().err
