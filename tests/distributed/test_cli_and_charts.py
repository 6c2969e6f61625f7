"""CLI (analyze, command, errors) and chart builders on the hand-made 2-rank trace pair."""

import json
import shutil
from pathlib import Path

import pytest

from diagnostics.render.charts.distributed import (build_breakdown_figure, build_collectives_figure, build_overlap_figure,
                                            build_rank_step_figure)
from diagnostics.analyses.distributed.job import analyze_folder_path
from diagnostics.cli.distributed import launch_timeout_s, main
from diagnostics.analyses.distributed.dist_job import DistJob, DistributedError
from diagnostics.analyses.distributed.launch import torchrun_command
from diagnostics.analyses.distributed.result import DistributedResult
from diagnostics.results import build
from diagnostics.store import Store

PAIR = Path(__file__).resolve().parents[1] / "data" / "distributed" / "pair"


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    """The commands write their report folder under ./torchscope-report: here, not in the repository."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def tight():
    return build(DistributedResult, {**analyze_folder_path(PAIR, margin=0.1, min_excess_ms=0.1), "source": "folder"})


def test_cli_analyze_json(capsys):
    assert main(["analyze", str(PAIR), "--margin", "0.1", "--min-excess-ms", "0.1", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["stragglers"] == [1] and res["metrics"]["ranks_loaded"] == 2


def test_cli_analyze_text(capsys):
    assert main(["analyze", str(PAIR), "--margin", "0.1", "--min-excess-ms", "0.1"]) == 0
    out = capsys.readouterr().out
    assert ("stragglers: rank 1 (busiest rank 1: 0.96 ms, over 0.79 ms = the other ranks' median 0.69 ms + "
            "0.10 ms; a rank straggles when its busy time is over the median of the other ranks") in out
    assert "limit ms" in out and "1.06" in out.splitlines()[4]  # rank 0's own threshold: 0.9575 + 0.1
    assert "gloo:all_reduce" in out and "overlap ratio 14.7 %" in out


def test_cli_analyze_writes_a_report_folder(capsys, tmp_path):
    out = tmp_path / "reports" / "pair"
    assert main(["analyze", str(PAIR), "--margin", "0.1", "--min-excess-ms", "0.1", "--json", "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert json.loads((out / "result.json").read_text())["stragglers"] == json.loads(printed.out)["stragglers"] == [1]
    assert f"report: {out / 'report.html'}" in printed.err  # --json: stdout holds only the JSON
    html = (out / "report.html").read_text()
    assert "TorchScope distributed traces: pair" in html and "plotly" in html.lower()
    assert {"ranks.csv", "collectives.csv"} <= {p.name for p in out.iterdir()}
    assert not any(p.name.startswith("rank0") for p in out.iterdir()), "the user's own traces are not copied"
    # the default folder, and none with --no-report
    assert main(["analyze", str(PAIR)]) == 0
    (folder,) = (tmp_path / "torchscope-report").glob("distributed_traces-*")
    assert f"report: {folder / 'report.html'}" in capsys.readouterr().out
    assert main(["analyze", str(PAIR), "--no-report"]) == 0
    assert len(list((tmp_path / "torchscope-report").iterdir())) == 1
    # an --out that cannot be a folder is refused before the job: exit 2, nothing recorded
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    runs = len(Store().list())
    assert main(["analyze", str(PAIR), "--out", str(blocker / "r")]) == 2
    assert f"error: cannot write the report folder {blocker / 'r'}: {blocker} is a file, not a folder" in \
        capsys.readouterr().err
    assert len(Store().list()) == runs


def test_cli_errors(capsys, tmp_path):
    assert main(["analyze", str(tmp_path / "missing")]) == 2  # bad input, as docs/cli.md says
    assert f"error: trace folder not found: {tmp_path / 'missing'}" in capsys.readouterr().err
    assert main(["analyze", str(tmp_path)]) == 2  # a folder, but no trace in it
    assert "holds no trace files" in capsys.readouterr().err
    assert main(["frobnicate"]) == 2
    assert main(["run", "--model", "no_such_model"]) == 2
    assert "unknown model 'no_such_model': not a file and not a built-in sample" in capsys.readouterr().err
    assert main(["run", "--model", str(tmp_path / "gone.py")]) == 2
    assert f"model file not found: {tmp_path / 'gone.py'}" in capsys.readouterr().err
    assert main(["run", "--model", "mlp", "--input", "8,x"]) == 2
    assert "bad --input shape '8,x'" in capsys.readouterr().err


def test_cli_analyze_skips_json_files_that_are_not_traces(capsys, tmp_path):
    shutil.copytree(PAIR, tmp_path / "run")
    (tmp_path / "run" / "config.json").write_text('{"lr": 0.1}')
    (tmp_path / "run" / "sub").mkdir()
    (tmp_path / "run" / "sub" / "metrics.json").write_text("[1, 2, 3]")
    (tmp_path / "run" / "sub" / "broken.json").write_text("not json")
    assert main(["analyze", str(tmp_path / "run"), "--margin", "0.1", "--min-excess-ms", "0.1", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["stragglers"] == [1] and res["metrics"]["ranks_loaded"] == 2
    assert res["metrics"]["files_skipped"] == 3
    assert sorted(s["file"] for s in res["skipped_files"]) == ["config.json", "sub/broken.json", "sub/metrics.json"]
    reasons = {s["file"]: s["reason"] for s in res["skipped_files"]}
    assert "no traceEvents array" in reasons["config.json"] and "not a JSON trace" in reasons["sub/broken.json"]
    assert res["notes"][0].startswith("skipped 3 file(s) that are not traces: config.json, sub/broken.json")
    # Only non-traces: the folder is refused (exit 2), saying why.
    for p in (tmp_path / "run").glob("rank*.json"):
        p.unlink()
    assert main(["analyze", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "holds no profiler trace: none of its 3 .json file(s) is one" in err and "no traceEvents array" in err


def test_cli_command_writes_a_job_for_every_node(capsys, tmp_path):
    assert main(["command", "--nnodes", "2", "--nproc", "8", "--rdzv-endpoint", "node0:29400",
                 "--out", str(tmp_path), "--model", "cnn"]) == 0
    out = capsys.readouterr().out
    assert "--nnodes 2 --rdzv_backend c10d --rdzv_endpoint node0:29400" in out
    assert "--nproc_per_node 8" in out and f"--job {tmp_path / 'job.json'}" in out
    job = DistJob.from_arg(str(tmp_path / "job.json"))
    assert job.spec["name"] == "cnn" and job.out_dir == str(tmp_path)


def test_cli_command_several_nodes_need_a_rendezvous_endpoint(capsys, tmp_path):
    assert main(["command", "--nnodes", "2", "--nproc", "8", "--out", str(tmp_path / "job")]) == 2
    captured = capsys.readouterr()
    assert "error: --nnodes 2 needs --rdzv-endpoint HOST:PORT" in captured.err
    assert "--standalone" not in captured.out and not (tmp_path / "job").exists()
    assert main(["command", "--nnodes", "0", "--out", str(tmp_path / "job")]) == 2
    assert "bad --nnodes 0: must be at least 1" in capsys.readouterr().err
    # One node without an endpoint is the standalone command.
    assert main(["command", "--out", str(tmp_path / "one")]) == 0
    assert "--standalone --nnodes 1" in capsys.readouterr().out
    with pytest.raises(DistributedError, match="2 nodes need a rendezvous endpoint"):
        torchrun_command("job.json", 8, nnodes=2)


def test_rank_step_figure(tight):
    fig = build_rank_step_figure(tight)
    assert fig.layout.yaxis.title.text == "time per step (ms)"
    step, busy = fig.data
    assert list(busy.y) == pytest.approx([0.695, 0.9575])
    assert busy.marker.color[1] != busy.marker.color[0]  # the straggler is drawn in its own colour
    line = fig.layout.shapes[0]
    assert line.y0 == pytest.approx(0.795)  # rank 1's leave-one-out threshold: rank 0's 0.695 + 0.1
    assert "straggler threshold 0.79 ms" in fig.layout.annotations[0].text


def test_breakdown_figure_stacks_to_step(tight):
    fig = build_breakdown_figure(tight)
    assert fig.layout.barmode == "stack" and fig.layout.yaxis.title.text == "time per step (ms)"
    assert [t.name.split(" ")[0] for t in fig.data] == ["computation", "computation", "communication", "other"]
    totals = [sum(t.y[i] for t in fig.data) for i in range(2)]
    assert totals == pytest.approx([1.0, 1.0])  # medians of parts that each sum to the 1 ms step


def test_collectives_and_overlap_figures(tight):
    fig = build_collectives_figure(tight)
    assert fig.layout.xaxis.title.text == "total time (ms)"
    assert list(fig.data[0].x) == pytest.approx([0.770, 0.106, 0.050])
    gauge = build_overlap_figure(tight)
    assert gauge.data[0].value == pytest.approx(100 * 120 / 815)
    assert "(%)" in gauge.data[0].title.text


class _Captured(Exception):
    pass


@pytest.fixture
def captured_job(monkeypatch):
    """Stops `distributed run` where it hands its job to the runner; yields what it handed over."""
    seen = {}

    def fake_run_job(job, **kw):
        seen.update(job=job, **kw)
        raise _Captured

    monkeypatch.setattr("diagnostics.runner.run_job", fake_run_job)
    return seen


@pytest.mark.parametrize("total,launch", [(600, 570), (100, 80), (31, 24.8), (20, 16), (5, 4)])
def test_launch_timeout_leaves_the_run_most_of_a_short_timeout(total, launch):
    assert launch_timeout_s(total) == pytest.approx(launch)


def test_cli_run_small_timeout_gives_the_launch_most_of_it(captured_job, capsys):
    with pytest.raises(_Captured):
        main(["run", "--model", "mlp", "--timeout", "20"])
    assert captured_job["timeout_s"] == 20
    assert captured_job["job"].options["run_timeout_s"] == pytest.approx(16.0)  # was 1 s
    assert main(["run", "--model", "mlp", "--timeout", "0"]) == 2
    assert "bad --timeout 0: must be positive seconds" in capsys.readouterr().err


PY_MODEL = """
import torch
from torch import nn

def build_model():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))

def example_inputs():
    return (torch.randn(4, 8),)
"""


def test_cli_run_takes_a_model_file_like_the_other_commands(captured_job, tmp_path):
    model = tmp_path / "my_model.py"
    model.write_text(PY_MODEL)
    with pytest.raises(_Captured):
        main(["run", "--model", str(model), "--batch-size", "6", "--seed", "3"])
    spec = captured_job["job"].spec
    assert (spec.source, spec.name, spec.path) == ("python", "my_model.py", str(model.resolve()))
    assert (spec.batch_size, spec.seed, spec.device) == (6, 3, "cpu")
    with pytest.raises(_Captured):
        main(["run", "--model", "transformer", "--input", "2,16:int64"])
    spec = captured_job["job"].spec
    assert spec.name == "transformer" and spec.inputs[0].shape == (2, 16) and spec.inputs[0].dtype == "int64"


def test_cli_command_writes_a_model_file_into_the_job(capsys, tmp_path):
    model = tmp_path / "my_model.py"
    model.write_text(PY_MODEL)
    assert main(["command", "--model", str(model), "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert f"note: every node reads the model file at {model.resolve()}" in out
    job = DistJob.from_arg(str(tmp_path / "run" / "job.json"))
    assert job.spec["source"] == "python" and job.spec["path"] == str(model.resolve())


@pytest.mark.slow
def test_cli_run_trains_a_model_file_and_says_where_the_traces_are(capsys, tmp_path):
    model = tmp_path / "my_model.py"
    model.write_text(PY_MODEL)
    assert main(["run", "--model", str(model), "--nproc", "2", "--steps", "2", "--warmup", "1"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("per-rank traces: "))
    folder = Path(line[len("per-rank traces: "):].split(" (")[0])
    assert "(rank0.pt.trace.json, rank1.pt.trace.json)" in line
    assert f"python -m diagnostics distributed analyze {folder}" in line
    for rank in (0, 1):
        info = json.loads((folder / f"rank{rank}.pt.trace.json").read_text())["distributedInfo"]
        assert (info["rank"], info["world_size"]) == (rank, 2)
    if __import__("torch").cuda.device_count() < 2:  # auto: gloo unless each rank gets a GPU
        assert "2 of 2 ranks, backend gloo" in out and "note: backend gloo (auto: " in out
    # the report folder, as every command writes one: the result, its tables, and the ranks' traces
    (report,) = (tmp_path / "torchscope-report").glob("distributed-*")
    assert f"report: {report / 'report.html'}" in out
    assert {"report.html", "result.json", "ranks.csv", "rank0.pt.trace.json", "rank1.pt.trace.json"} <= {
        p.name for p in report.iterdir()}
    assert json.loads((report / "result.json").read_text())["metrics"]["ranks_loaded"] == 2


def test_cli_run_refuses_a_model_file_that_does_not_load(capsys, tmp_path):
    model = tmp_path / "broken.py"
    model.write_text("def build_model(:\n")
    assert main(["run", "--model", str(model), "--nproc", "2"]) == 2  # bad input, before torchrun starts
    assert "broken.py" in capsys.readouterr().err


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys):
    def interrupted(job, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr("diagnostics.runner.run_job", interrupted)
    assert main(["analyze", str(PAIR)]) == 130
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == "error: interrupted (Ctrl-C)" and "Traceback" not in err


@pytest.mark.slow
def test_ctrl_c_during_a_run_stops_every_rank_and_exits_130(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    env = {**os.environ, "TORCHSCOPE_DATA_DIR": str(tmp_path / "data")}
    # Its own process group, as a terminal's foreground job: Ctrl-C sends SIGINT to the whole group.
    proc = subprocess.Popen([sys.executable, "-m", "diagnostics", "distributed", "run", "--model", "mlp", "--nproc",
                             "2", "--steps", "2", "--warmup", "0", "--straggler-rank", "1", "--straggler-ms", "60000",
                             "--timeout", "120"], cwd=str(Path(__file__).resolve().parents[2]), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)

    def ranks():
        try:
            kids = psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:
            return []
        out = []
        for k in kids:
            try:
                cmd = " ".join(k.cmdline())
                if "diagnostics.analyses.distributed.rank_main" in cmd and "torch.distributed.run" not in cmd:
                    out.append(k)  # a rank, not torchrun (whose command line names rank_main too)
            except psutil.Error:
                pass
        return out

    deadline = time.monotonic() + 90
    while len(ranks()) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.3)
    started = ranks()
    if len(started) != 2:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"the ranks did not start: {proc.communicate(timeout=30)}")
    time.sleep(3)  # the ranks are in their steps (rank 1 sleeping, rank 0 waiting in the all-reduce)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.strip().splitlines()[-1].startswith("error: distributed run interrupted (Ctrl-C)")
    assert out == ""
    gone, alive = psutil.wait_procs(started, timeout=15)
    assert not alive
