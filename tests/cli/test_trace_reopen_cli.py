"""``trace analyze`` of one file without a worker (issue #42, item 5): a first open runs the trace job in the
CLI's own process (no spawn, no torch), a reopen answers from the stored result; both are recorded in the
run store like any run, and give the result the worker gives."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import pytest

from diagnostics.store import Store

TRACE = Path(__file__).resolve().parents[1] / "data" / "traces" / "gpu_small.json"
#: What an open reports of itself, not of the trace: how the open went.
OWN = ("trace_cache",)


def _analyze(capsys, trace: Path, store: Path, *extra: str) -> dict:
    from diagnostics.cli.main import main

    assert main(["trace", "analyze", str(trace), "--json", "--no-report", "-q", "--data-dir", str(store),
                 *extra]) == 0
    return json.loads(capsys.readouterr().out)


def _no_worker(monkeypatch) -> list:
    import diagnostics.runner

    started = []
    monkeypatch.setattr(diagnostics.runner, "run_job", lambda *a, **k: started.append(a) or pytest.fail("a worker"))
    return started


@pytest.fixture
def trace(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHSCOPE_DATA_DIR", str(tmp_path / "store"))
    path = tmp_path / "gpu_small.json"
    shutil.copyfile(TRACE, path)
    return path


def _options(trace: Path, **more) -> dict:
    path = str(trace.resolve())
    return {"path": path, "stamp": {"path": path, "size": trace.stat().st_size,
                                    "mtime_ns": trace.stat().st_mtime_ns}, **more}


def test_a_first_open_and_its_reopen_start_no_worker_and_give_the_workers_result(trace, tmp_path, monkeypatch,
                                                                                   capsys):
    from diagnostics.cli.trace import cli_result
    from diagnostics.results import to_plain
    from diagnostics.runner import Job, run_job

    # what a worker gives (the dashboard's way, and the CLI's before), on a trace cache of its own
    monkeypatch.setenv("TORCHSCOPE_DATA_DIR", str(tmp_path / "worker"))
    outcome = run_job(Job("trace", None, _options(trace)), artifact_dir=tmp_path / "w")
    assert outcome.ok, outcome.error
    worker = json.loads(json.dumps(to_plain(cli_result("trace", outcome.result))))   # as the CLI shows it
    monkeypatch.setenv("TORCHSCOPE_DATA_DIR", str(tmp_path / "store"))
    store = tmp_path / "store"
    started = _no_worker(monkeypatch)
    first = _analyze(capsys, trace, store)
    second = _analyze(capsys, trace, store)
    assert started == []
    assert first["trace_cache"]["hit"] is False and "result" not in first["trace_cache"]
    assert second["trace_cache"]["hit"] is True and second["trace_cache"]["result"] is True
    assert 0 <= second["trace_cache"]["open_s"] < 5
    # the critical path's trace is the first run's file, linked into the second run's own folder
    a, b = first["critical_path"].pop("trace_file"), second["critical_path"].pop("trace_file")
    assert Path(a).parent != Path(b).parent and Path(b).read_bytes() == Path(a).read_bytes()
    assert {k: v for k, v in second.items() if k not in OWN} == {k: v for k, v in first.items() if k not in OWN}
    worker["critical_path"].pop("trace_file")
    assert {k: v for k, v in worker.items() if k not in OWN} == {k: v for k, v in first.items() if k not in OWN}
    # recorded like any CLI run, the stored result the one shown
    runs = Store(store).list(analysis="trace")
    assert [(r.source, r.status) for r in runs] == [("cli", "ok")] * 2
    assert runs[0].model_label == runs[1].model_label == f"{tmp_path.name[:24]}/gpu_small.json"
    kept = Store(store).get(runs[0].id)
    assert kept.result["summary"] == first["summary"] and kept.result["trace_cache"]["result"] is True
    assert Path(b).name in kept.artifacts


def test_what_goes_to_the_worker_and_what_a_miss_does(trace, tmp_path):
    """Several ranks and --timeout go to the worker, before anything is recorded; other options or a touched
    file run the job again (no stored answer)."""
    from diagnostics.cli.trace import in_process

    s = Store(tmp_path / "store")
    assert in_process("trace", _options(trace, ranks=[str(trace)]), s) is None
    assert in_process("trace", _options(trace), s, timeout=30) is None
    assert in_process("trace_diff", {"before": str(trace), "after": str(trace)}, s) is None
    assert in_process("trace", _options(trace, top="many"), s) is None   # the runner's error names it
    assert s.list() == []
    first = in_process("trace", _options(trace), s)
    assert first.ok and first.result.trace_cache.hit is False
    assert in_process("trace", _options(trace), s, timeout=30).result.trace_cache.result is True  # a reopen
    other = in_process("trace", _options(trace, top=30), s).result.trace_cache
    assert (other.hit, bool(other.result)) == (True, False)   # the parsed columns reused, the views computed
    st = os.stat(trace)
    os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns + 1000))
    assert in_process("trace", _options(trace), s).result.trace_cache.hit is False
    assert [r.status for r in s.list()] == ["ok"] * 4


def test_a_failure_or_ctrl_c_in_process_is_recorded(trace, tmp_path, monkeypatch):
    import diagnostics.runner
    from diagnostics.cli.trace import in_process

    s = Store(tmp_path / "store")
    bad = tmp_path / "bad.json.gz"
    bad.write_text("{}")
    failed = in_process("trace", _options(bad), s)
    assert (failed.status, failed.error_type) == ("error", "TraceError") and "not gzip" in failed.error

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(diagnostics.runner, "execute", interrupted)
    cancel = threading.Event()
    stopped = in_process("trace", _options(trace), s, cancel=cancel)
    assert stopped.status == "cancelled" and cancel.is_set()
    assert {r.id: r.status for r in s.list()} == {failed.run_id: "error", stopped.run_id: "cancelled"}
    assert "not gzip" in s.get(failed.run_id).error


def test_a_ranks_reopen_is_answered_in_process_after_the_worker_ran_them(tmp_path, monkeypatch, capsys):
    """Several ranks run in the worker the first time; their stored analysis is answered without one, with
    this open's own figures (no rank read, no worker)."""
    from tests.trace.rank_traces import write_rank

    monkeypatch.setenv("TORCHSCOPE_DATA_DIR", str(tmp_path / "store"))
    ranks = tmp_path / "job"
    ranks.mkdir()
    for r in range(2):
        write_rank(ranks, f"rank{r}.json", r, 2, [1000, 1000 + 500 * r])
    first = _analyze(capsys, ranks, tmp_path / "store")
    started = _no_worker(monkeypatch)
    second = _analyze(capsys, ranks, tmp_path / "store")
    assert started == [] and second["trace_cache"]["result"] is True
    assert second["ranks"]["mode"].startswith("the stored analysis of these ranks")
    assert second["ranks"]["cache"] == {"hits": 2, "misses": 0, "kept": True} and second["ranks"]["workers"] == []
    for part in ("summary", "top_operators", "metrics"):
        assert second[part] == first[part], part
    assert second["ranks"]["ranks"] == first["ranks"]["ranks"]


def test_trace_analyze_imports_no_torch_and_a_reopen_no_trace_analysis(tmp_path):
    """The fixed costs kept off the trace path: a first open never loads torch nor plotly (its text has no
    chart); a reopen loads neither torch nor the trace job and its critical path, nor numpy, pandas, pyarrow or
    plotly (it finds, links and prints a stored result: issue #42); and `--help` none of those (a fresh
    interpreter each, as the CLI runs)."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    code = ("import sys; from diagnostics.cli.main import main; "
            f"assert main(['trace', 'analyze', {str(TRACE)!r}, '--no-report', '-q', '--data-dir', {str(tmp_path)!r}]) == 0; "
            "print(sorted(m for m in ('torch', 'diagnostics.analyses.trace.job', 'diagnostics.trace.critical_path', "
            "'numpy', 'pandas', 'pyarrow', 'plotly') if m in sys.modules))")
    env = dict(os.environ, TORCHSCOPE_DATA_DIR=str(tmp_path), PYTHONPATH=str(repo))
    loaded = [subprocess.run([sys.executable, "-c", code], env=env, cwd=repo, capture_output=True, text=True,
                             timeout=120) for _ in range(2)]
    assert all(p.returncode == 0 for p in loaded), [p.stderr[-800:] for p in loaded]
    first, second = (p.stdout.strip().splitlines()[-1] for p in loaded)
    assert first == "['diagnostics.analyses.trace.job', 'diagnostics.trace.critical_path', 'numpy', 'pandas', 'pyarrow']"
    assert second == "[]"
    help_ = subprocess.run([sys.executable, "-c", "import sys, contextlib, io\nfrom diagnostics.cli.main import main\n"
                            "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
                            "    main(['--help'])\n"
                            "print(sorted(m for m in ('torch', 'numpy', 'pandas', 'pyarrow', 'plotly') if m in sys.modules))"],
                           env=env, cwd=repo, capture_output=True, text=True, timeout=120)
    assert help_.returncode == 0 and help_.stdout.strip() == "[]", help_.stderr[-800:]


@pytest.mark.parametrize("again", [False, True], ids=["first open", "cached trace, other options"])
def test_the_summary_is_printed_before_pandas_is_imported(tmp_path, again):
    """Issue #42's first answer pays no pandas: in a fresh `trace analyze` process (text mode, as the CLI runs),
    when the Summary's "Events by category:" reaches stdout, neither pandas, pyarrow, plotly nor torch is
    imported (they come after, for the other views and the trace cache's Arrow file), nor the model analyses'
    declarations (the registry's full list: 0.1 s); the run then ends well. Opened again with other options
    (no stored result, the parsed trace from the trace cache), the Summary comes from the cache's Arrow file
    (pyarrow) straight into the columns, still before pandas."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    code = ("import sys\n"
            "real, seen = sys.stdout, []\n"
            "class Probe:\n"
            "    def write(self, s):\n"
            "        if 'Events by category:' in s and not seen:\n"
            "            seen.append(sorted(m for m in ('pandas', 'pyarrow', 'plotly', 'torch', 'diagnostics.analyses.profile',\n"
            "                                          'diagnostics.analyses.optimize') if m in sys.modules))\n"
            "        return real.write(s)\n"
            "    def __getattr__(self, k):\n"
            "        return getattr(real, k)\n"
            "sys.stdout = Probe()\n"
            "from diagnostics.cli.main import main\n"
            f"rc = main(['trace', 'analyze', {str(TRACE)!r}, '--no-report', '-q', '--data-dir', {str(tmp_path)!r}]"
            " + sys.argv[1:])\n"
            "sys.stdout = real\n"
            "print('at the summary:', seen, 'after:', 'pandas' in sys.modules, 'rc', rc)\n")
    env = dict(os.environ, TORCHSCOPE_DATA_DIR=str(tmp_path), PYTHONPATH=str(repo))
    p = subprocess.run([sys.executable, "-c", code], env=env, cwd=repo, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-800:]
    assert p.stdout.strip().splitlines()[-1] == "at the summary: [[]] after: True rc 0"
    if again:
        p = subprocess.run([sys.executable, "-c", code, "--definitions", "hta"], env=env, cwd=repo, capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-800:]
        assert p.stdout.strip().splitlines()[-1] == "at the summary: [['pyarrow']] after: True rc 0"


def test_text_mode_prints_the_summary_first_while_the_other_views_are_computed(trace, tmp_path, monkeypatch,
                                                                                capsys):
    """Issue #42's first answer: the Summary (the job's partial result) is on stdout before the job computes
    its timeline, and printed once; a reopen prints it once too, with the stored analysis said."""
    import diagnostics.analyses.trace.job as trace_job
    from diagnostics.cli.main import main
    from diagnostics.trace import load_trace, summary

    s = summary(load_trace(trace))
    head = f"{s.events:,} events, {s.bytes / 1e6:.1f} MB"
    seen = []
    real = trace_job.timeline_part
    monkeypatch.setattr(trace_job, "timeline_part", lambda *a: seen.append(capsys.readouterr().out) or real(*a))
    # the communication families (their name rules over every kernel name) come after the first answer too
    families = []
    real_comm = trace_job.communication
    monkeypatch.setattr(trace_job, "communication",
                        lambda t: families.append(capsys.readouterr().out) or real_comm(t))
    store = str(tmp_path / "store")
    assert main(["trace", "analyze", str(trace), "--no-report", "-q", "--data-dir", store]) == 0
    assert len(families) == 1 and head in families[0] and "Events by category:" in families[0]
    before, after = families[0] + seen[0], capsys.readouterr().out
    assert head in before and "Events by category:" in before and "operators by self time" not in before
    assert head not in after and "Events by category:" not in after and "operators by self time" in after
    assert main(["trace", "analyze", str(trace), "--no-report", "-q", "--data-dir", store]) == 0
    again = capsys.readouterr().out
    assert len(seen) == 1 and again.count(head) == 1 and again.count("Events by category:") == 1
    assert again.index("the stored analysis of this trace") < again.index("operators by self time")
