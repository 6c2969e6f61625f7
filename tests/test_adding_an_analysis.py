"""Adding an analysis takes three files: its package, its page view and one registry line.

A throwaway analysis is written here into a temporary folder (its package: the declaration with its
typed result, and job.py; its view module) and registered at test time (the one line). Without touching
any other file it gets: a CLI command with its flags, help and option validation; a run whose typed result
goes through the one serialisation (encoded as the worker sends it, decoded as the runner reads it,
stored, printed by --json); the report folder (the generic report, result.json, the CSV of its table,
metrics in their declared units); and its view in History.

The job runs in this process (``runner.execute``, the worker's own function, then the worker's encode and
the runner's decode): a spawned worker imports the registry afresh and would not know an analysis
registered by a test.
"""

from __future__ import annotations

import json
import re
import sys
import textwrap

import pytest

PACKAGE = '''
"""Throwaway: the biggest parameter tensors of a model."""
from typing import Annotated

from diagnostics.declare import Analysis, Option, column, metric, table
from diagnostics.results import Record, Result


class TensorRow(Record, frozen=True, kw_only=True):
    name: str
    numel: Annotated[int, column("count", "elements")]
    bytes: Annotated[int, column("bytes", "size")]


class ThrowawayMetrics(Record, frozen=True, kw_only=True):
    tensors: Annotated[int, metric("count", "Parameter tensors")]
    largest_bytes: Annotated[int, metric("bytes", "Largest tensor", better="lower")]


class ThrowawayResult(Result, frozen=True, kw_only=True):
    model: str
    metrics: ThrowawayMetrics
    largest: Annotated[tuple[TensorRow, ...], table("Largest tensors")]


ANALYSIS = Analysis(
    name="throwaway", title="Largest tensors", target="throwaway_pkg.job:analyze", command="largest",
    result=ThrowawayResult, view="throwaway_view:show",
    options=(Option("top", "int", 3, "how many tensors to list", lo=1, hi=10),),
)
'''

JOB = '''
from throwaway_pkg import ANALYSIS, TensorRow, ThrowawayMetrics, ThrowawayResult


def analyze(ctx, options) -> ThrowawayResult:
    o = ANALYSIS.validate(options)
    params = sorted(ctx.loaded.model.named_parameters(), key=lambda p: -p[1].numel())
    rows = tuple(TensorRow(name=n, numel=p.numel(), bytes=p.numel() * p.element_size()) for n, p in params)
    return ThrowawayResult(model=ctx.loaded.spec.label, notes=("counted, not timed",),
                           metrics=ThrowawayMetrics(tensors=len(rows), largest_bytes=rows[0].bytes),
                           largest=rows[:o["top"]])
'''

VIEW = '''
import streamlit as st

from throwaway_pkg import ThrowawayResult


def show(result: ThrowawayResult) -> None:
    st.metric("Parameter tensors", result.metrics.tensors)
    st.dataframe([{"name": r.name, "elements": r.numel} for r in result.largest])
'''


@pytest.fixture
def throwaway(tmp_path, monkeypatch):
    """The three files: the package (declaration + job), the view, and the registry line."""
    pkg = tmp_path / "throwaway_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent(PACKAGE))
    (pkg / "job.py").write_text(textwrap.dedent(JOB))
    (tmp_path / "throwaway_view.py").write_text(textwrap.dedent(VIEW))
    monkeypatch.syspath_prepend(str(tmp_path))
    import throwaway_pkg

    from diagnostics.registry import ANALYSES

    monkeypatch.setitem(ANALYSES, "throwaway", throwaway_pkg.ANALYSIS)  # the registry line
    yield throwaway_pkg
    for name in ("throwaway_pkg", "throwaway_pkg.job", "throwaway_view"):
        sys.modules.pop(name, None)


def _in_process_run_job(job, *, store=None, source="app", **_):
    """runner.run_job without the spawned worker: the worker's execute, its encode, the runner's decode
    and the store's writes, in this process."""
    from diagnostics.registry import get_analysis
    from diagnostics.results import decode, to_plain
    from diagnostics.runner import JobOutcome, execute

    job = job.validated()
    run_id = store.create_run(job.analysis, spec=job.spec.to_dict(), options=job.options, cache_key=job.key(),
                              model_label=job.label(), device=job.spec.device, source=source)
    sent = to_plain(execute(job, store.artifact_dir(run_id)))  # what the worker puts on the pipe
    outcome = JobOutcome("ok", result=decode(get_analysis(job.analysis), sent), run_id=run_id,
                         artifact_dir=str(store.artifact_dir(run_id)))
    store.finish_run(run_id, "ok", result=outcome.result)
    return outcome


def test_a_throwaway_analysis_gets_its_command_validation_round_trip_report_and_view(throwaway, tmp_path,
                                                                                       monkeypatch, capsys):
    import diagnostics.runner
    from diagnostics.cli.main import main
    from diagnostics.registry import ANALYSES
    from diagnostics.results import decode, to_plain
    from diagnostics.store import Store

    # its metrics and table with their units, read from the result type
    decl = ANALYSES["throwaway"]
    assert [(m.key, m.unit) for m in decl.metrics] == [("tensors", "count"), ("largest_bytes", "bytes")]
    assert decl.table("largest").unit("bytes") == "bytes"

    # the CLI: its command (not its name), listed, with its flag and help, and its options validated
    assert main(["list"]) == 0
    assert re.search(r"^  largest +Largest tensors$", capsys.readouterr().out, re.M)
    with pytest.raises(SystemExit) as e:
        main(["largest", "--help"])
    usage = capsys.readouterr().out
    assert e.value.code == 0 and "--top" in usage and "how many tensors to list" in usage
    data = tmp_path / "data"
    with pytest.raises(SystemExit) as e:  # argparse checks a flag's value against the declaration
        main(["largest", "--model", "mlp", "--top", "0", "-q", "--data-dir", str(data)])
    assert e.value.code == 2 and "argument --top: must be an integer from 1 to 10, got '0'" in capsys.readouterr().err
    assert main(["largest", "--model", "mlp", "--option", "topp=2", "-q", "--data-dir", str(data)]) == 2
    assert "unknown option 'topp' for throwaway; valid: top" in capsys.readouterr().err

    # a run: typed result through the worker's encode and the runner's decode, stored, --json, report folder
    monkeypatch.setattr(diagnostics.runner, "run_job", _in_process_run_job)
    out = tmp_path / "report"
    assert main(["largest", "--model", "mlp", "--top", "2", "--json", "-q", "--out", str(out),
                 "--data-dir", str(data)]) == 0
    printed = json.loads(capsys.readouterr().out)
    (rec,) = Store(data).list(analysis="throwaway")
    stored = Store(data).get(rec.id).result
    result = decode(decl, stored)
    assert isinstance(result, throwaway.ThrowawayResult) and printed == stored == to_plain(result)
    assert [r.name for r in result.largest] == ["fc2.weight", "fc1.weight"]  # the MLP's two largest
    assert result.largest[0].numel == 128 * 128 and result.metrics.largest_bytes == 4 * 128 * 128
    assert rec.metrics == {"tensors": 6, "largest_bytes": 65536}
    assert json.loads((out / "result.json").read_text()) == stored
    assert (out / "largest.csv").read_text().splitlines()[0] == "name,numel,bytes"
    html = (out / "report.html").read_text()
    assert "Largest tensor" in html and "64.0 KiB" in html and "counted, not timed" in html  # its unit, its notes

    # its view, as History shows a stored run
    from streamlit.testing.v1 import AppTest

    def page(plain):
        from ui import views

        views.show_stored("throwaway", plain, file_stem="run")

    at = AppTest.from_function(page, args=(stored,), default_timeout=60).run()
    assert not at.exception, [x.value for x in at.exception]
    assert at.metric[0].label == "Parameter tensors" and at.metric[0].value == "6"
    assert list(at.dataframe[0].value["name"]) == ["fc2.weight", "fc1.weight"]
