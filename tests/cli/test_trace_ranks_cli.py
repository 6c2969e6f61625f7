"""``trace analyze A B C`` / ``trace analyze FOLDER``: several ranks' traces through the CLI (the "trace"
analysis with its "ranks" option): --json's "ranks" key, the text table, the report's Ranks section."""

from __future__ import annotations

import json
import statistics

from diagnostics.store import Store
from tests.cli.test_cli import assert_offline_html, cli
from tests.trace.rank_traces import BASE_NS, write_rank

STEPS = {0: [1000, 1200, 1100], 1: [2000, 1000, 3000], 2: [1500, 1500, 1600]}


def _job(tmp_path, skew_s=0):
    d = tmp_path / "job"
    for r, steps in STEPS.items():
        write_rank(d, f"rank{r}.pt.trace.json", r, 3, steps, base_ns=BASE_NS + (skew_s * 10**9 if r == 2 else 0))
    return d


def test_several_files_json_has_ranks_and_the_report_a_ranks_section(tmp_path):
    d = _job(tmp_path, skew_s=3600)
    files = [d / f"rank{r}.pt.trace.json" for r in (2, 0, 1)]
    p = cli("trace", "analyze", *files, "--json", data_dir=tmp_path / "store", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["name"] == "rank2.pt.trace.json"  # the first path is opened in full
    ranks = out["ranks"]
    assert [r["rank"] for r in ranks["ranks"]] == [0, 1, 2]
    assert [r["step_ms_median"] for r in ranks["ranks"]] == [statistics.median(STEPS[r]) / 1e3 for r in (0, 1, 2)]
    assert ranks["slowest_rank"] == 1 and abs(ranks["spread"] - 2000 / 1100) < 1e-9
    assert [p["check"] for p in ranks["problems"]] == ["start_time"]
    # parallel worker processes inside the (sandboxed) job worker
    assert ranks["mode"].startswith("parallel"), ranks["mode"]
    (folder,) = (tmp_path / "torchscope-report").glob("trace-*")
    text = assert_offline_html(folder / "report.html", min_figures=2)
    assert "Ranks" in text and "traces start 3,600 s apart" in text and "slowest rank: 1" in text
    (rec,) = Store(tmp_path / "store").list(analysis="trace")
    assert rec.status == "ok"


def test_a_folder_prints_the_per_rank_table(tmp_path):
    d = _job(tmp_path)
    p = cli("trace", "analyze", d, "--no-report", data_dir=tmp_path / "store", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Ranks: 3 traces"))
    rows = [line.split() for line in lines[start + 2:start + 5]]
    assert [(r[0], r[1], r[3]) for r in rows] == [("0", "rank0.pt.trace.json", "1.100"),
                                                  ("1", "rank1.pt.trace.json", "2.000"),
                                                  ("2", "rank2.pt.trace.json", "1.500")]
    assert "slowest rank: 1 (step-time spread max/min 1.82x)" in p.stdout
    assert "no sign that these ranks come from different runs" in p.stdout


def test_a_missing_rank_path_exits_2_before_any_job(tmp_path, capsys):
    from diagnostics.cli.main import main

    d = _job(tmp_path)
    data = tmp_path / "store"
    assert main(["trace", "analyze", str(d / "rank0.pt.trace.json"), str(tmp_path / "nope.json"), "-q",
                 "--data-dir", str(data)]) == 2
    assert f"{tmp_path / 'nope.json'}: no such file or folder" in capsys.readouterr().err
    assert not Store(data).list()
