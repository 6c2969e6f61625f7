"""The CLI end to end: each subcommand in a subprocess (exit code, report folder, JSON, store) and its failures.

Runs are kept tiny (few steps, small batches). Subcommands whose analysis is not registered yet
are skipped at collection and turn on by themselves when it lands.
"""

from __future__ import annotations

import csv
import html
import json
import os
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from diagnostics.store import Store

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 240


# ----------------------------------------------------------------------------- helpers
@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cli-store")


def cli(*args, data_dir: Path, cwd: Path = REPO, timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    env = dict(os.environ, TORCHSCOPE_DATA_DIR=str(data_dir), PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "diagnostics", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


class _Refs(HTMLParser):
    """Every URL the page would fetch: src/href attributes of tags (not text inside scripts)."""

    def __init__(self):
        super().__init__()
        self.urls, self.scripts = [], 0

    def handle_starttag(self, tag, attrs):
        if tag == "script":
            self.scripts += 1
        for k, v in attrs:
            if k in ("src", "href", "data", "poster") and v:
                self.urls.append((tag, v))


def assert_offline_html(path: Path, min_figures: int = 1) -> str:
    text = path.read_text(encoding="utf-8")
    refs = _Refs()
    refs.feed(text)
    external = [(t, u) for t, u in refs.urls if u.startswith(("http:", "https:", "//"))]
    assert not external, f"the report loads external resources: {external}"
    assert "<link" not in text.split("<body", 1)[0], "no stylesheet links in <head>"
    assert "fonts.googleapis" not in text and "cdn.plot.ly/plotly" not in text.split("<body", 1)[0]
    # plotly.js inlined exactly once (when there are figures), one newPlot per figure
    bundles = text.count("window.PlotlyConfig")
    assert bundles == (1 if min_figures else bundles) and bundles <= 1, f"plotly.js inlined {bundles} times"
    assert text.count("Plotly.newPlot(") >= min_figures
    assert "report layout failed" not in text and "could not be drawn" not in text
    return text


def runs_of(data_dir: Path, analysis: str):
    return [r for r in Store(data_dir).list(analysis=analysis)]


def mlp_params() -> int:
    from sample_models import SAMPLES

    return sum(p.numel() for p in SAMPLES["mlp"].build().parameters())


# ----------------------------------------------------------------------------- summary
def test_summary_json_report_and_store(tmp_path, data_dir):
    out = tmp_path / "rep"
    p = cli("summary", "--model", "mlp", "--json", "--out", out, data_dir=data_dir)
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout)  # stdout holds only the JSON
    assert result["metrics"]["params_total"] == mlp_params() == 26122
    assert result["metrics"]["batch_size"] == 32
    assert "summary [" in p.stderr  # the progress lines go to stderr
    # the report folder
    assert {"report.html", "result.json", "layers.csv"} <= {f.name for f in out.iterdir()}
    assert json.loads((out / "result.json").read_text()) == result
    with open(out / "layers.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(result["layers"])
    assert sum(int(r["params"]) for r in rows) == 26122
    text = assert_offline_html(out / "report.html", min_figures=3)
    assert "26,122" in text and "Where the parameters are" in text
    # the run is in the shared store, marked as coming from the CLI
    recs = [r for r in runs_of(data_dir, "summary") if r.status == "ok"]
    assert recs and recs[0].source == "cli" and recs[0].model_label == "mlp (sample)"
    assert Store(data_dir).get(recs[0].id).result["metrics"]["params_total"] == 26122


def test_human_output_default_folder_and_file_model(tmp_path, data_dir):
    """A TorchScript file (kind sniffed from the archive), default report folder under the cwd."""
    import torch
    from torch import nn

    model = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 2))
    path = tmp_path / "tiny.pt"
    torch.jit.save(torch.jit.script(model), str(path))
    p = cli("summary", "-m", path, "-i", "4,5", "--skip-backward", "-q", data_dir=data_dir, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""  # -q: no progress
    n_params = sum(q.numel() for q in model.parameters())
    assert n_params == 5 * 7 + 7 + 7 * 2 + 2 == 58
    # each metric with its declared label and unit
    assert any(line.split() == ["Parameters", "58"] for line in p.stdout.splitlines()), p.stdout
    assert any(line.split() == ["Parameter", "memory", "232", "B"] for line in p.stdout.splitlines()), p.stdout
    assert "tiny.pt (torchscript)" in p.stdout
    folders = list((tmp_path / "torchscope-report").glob("summary-*"))
    assert len(folders) == 1
    result = json.loads((folders[0] / "result.json").read_text())
    assert result["metrics"]["params_total"] == n_params
    assert result["metrics"]["flops_backward"] == 0  # --skip-backward reached the analysis
    assert result["inputs"] == [{"shape": [4, 5], "dtype": "float32"}]
    assert f"report: {folders[0] / 'report.html'}" in p.stdout


@pytest.mark.parametrize("args, needle", [
    (["--model", "no/such/model.pt"], "model file not found: no/such/model.pt"),
    (["--model", "mlp", "--input", "8,x"], "bad --input shape '8,x'"),
])
def test_bad_input_exits_2_naming_it(args, needle, data_dir):
    p = cli("summary", *args, data_dir=data_dir)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert needle in p.stderr
    assert p.stdout == ""


@pytest.mark.parametrize("args, needle", [
    (["--model", "nosuchsample"], "unknown model 'nosuchsample'"),
    (["--model", "mlp", "--input", "8,0"], "bad --input shape '8,0'"),
    (["--model", "mlp", "--input", "8,64:float99"], "bad --input dtype 'float99'"),
    (["--model", "mlp", "--input", "8,64:int64:-3"], "bad --input HIGH -3"),
    (["--model", "mlp", "--weights", "missing.safetensors"], "weights file not found: missing.safetensors"),
    (["--model", "mlp", "--option", "noequals"], "bad --option 'noequals'"),
    (["--model", "mlp", "--timeout", "-1"], "bad --timeout -1"),
    (["--model", str(REPO / "pyproject.toml")], f"cannot tell what kind of model {REPO / 'pyproject.toml'} is"),
])
def test_more_bad_input_in_process(args, needle, tmp_path, capsys):
    from diagnostics.cli.main import main

    assert main(["summary", "--no-report", "--data-dir", str(tmp_path), *args]) == 2
    captured = capsys.readouterr()
    assert needle in captured.err and captured.out == ""


def test_model_rejecting_the_shape_exits_2(tmp_path, data_dir):
    """The shape parses but the model refuses it: the worker's message names the shape."""
    p = cli("summary", "--model", "mlp", "--input", "8,65", "--json", "-q", "--out", tmp_path / "r",
            data_dir=data_dir)
    assert p.returncode == 2, p.stderr
    assert "[8, 65]" in p.stderr and "rejected its inputs" in p.stderr
    assert p.stdout == "" and not (tmp_path / "r").exists()
    failed = [r for r in runs_of(data_dir, "summary") if r.status == "error"]
    assert failed and failed[0].source == "cli" and "[8, 65]" in failed[0].error


def test_usage_errors_from_argparse(data_dir):
    p = cli("summary", data_dir=data_dir)  # --model missing
    assert p.returncode == 2 and "--model" in p.stderr
    p = cli("nosuchcommand", data_dir=data_dir)
    assert p.returncode == 2 and "invalid choice" in p.stderr


def test_help_on_every_subcommand(capsys):
    from diagnostics.cli.main import build_parser, main, model_commands

    commands = model_commands() + ["trace", "list"]
    for cmd in commands:
        try:
            code = main([cmd, "--help"])
        except SystemExit as e:
            code = e.code
        assert code == 0, cmd
        out = capsys.readouterr().out
        assert out.startswith("usage: python -m diagnostics " + cmd), cmd
        if cmd in MODEL_COMMANDS:
            assert "--model" in out and "--json" in out and "--out" in out and "--input" in out
    for sub in ("analyze", "diff"):
        with pytest.raises(SystemExit) as e:
            main(["trace", sub, "--help"])
        assert e.value.code == 0 and "--json" in capsys.readouterr().out
    assert build_parser().prog == "python -m diagnostics"


# ----------------------------------------------------------------------------- other analyses
def test_profile_train_writes_trace(tmp_path, data_dir):
    out = tmp_path / "prof"
    p = cli("profile", "--model", "mlp", "--batch-size", "4", "--mode", "train", "--steps", "1", "--warmup", "0",
            "--latency-iters", "2", "--latency-warmup", "0", "--json", "--out", out, data_dir=data_dir)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["mode"] == "train" and r["batch_size"] == 4
    assert r["metrics"]["profiled_steps"] == 1
    assert r["latency"]["iterations"] == 2
    names = {f.name for f in out.iterdir()}
    assert {"report.html", "result.json", "operators.csv", "steps.csv", "trace.json", "trace.json.gz"} <= names
    trace = json.loads((out / "trace.json").read_text())
    assert any(e.get("name") == "ProfilerStep#1" for e in trace["traceEvents"])  # the profiled step
    text = assert_offline_html(out / "report.html", min_figures=3)
    assert "Operators" in text and "Latency" in text
    assert [r for r in runs_of(data_dir, "profile") if r.source == "cli" and r.status == "ok"]


def test_checklist_fail_under_gate(tmp_path, data_dir):
    """The gate on a real run: the cnn sample warns (its Conv -> BatchNorm pairs are not fused), so its score
    is below 100: --fail-under 100 exits 3 naming the score. (A score at or above the gate passing, with -q and
    --no-report, is test_fail_under_logic_in_process's: a second checklist run here only repeated that.)"""
    args = ("checklist", "--model", "cnn", "--batch-size", "4", "--iters", "1", "--profile-steps", "1")
    p = cli(*args, "--fail-under", "100", "--json", "--out", tmp_path / "c", data_dir=data_dir)
    assert p.returncode == 3, p.stderr
    r = json.loads(p.stdout)
    assert next(f for f in r["findings"] if f["id"] == "conv_bn_fusion")["status"] == "warn"
    score = r["metrics"]["score"]
    assert 0 < score < 100
    assert f"checklist score {score:.1f} is below --fail-under 100" in p.stderr
    text = assert_offline_html(tmp_path / "c" / "report.html", min_figures=2)
    applicable = [f for f in r["findings"] if f["status"] != "not_applicable"]
    assert applicable and html.escape(applicable[0]["title"]) in text  # the findings' table
    assert (tmp_path / "c" / "findings.csv").exists()


def test_fail_under_logic_in_process(monkeypatch, tmp_path, capsys):
    """The gate against a fixed score, without running a job: below -> 3, at or above -> 0."""
    import diagnostics.cli.main as m
    from diagnostics.runner import JobOutcome

    fake = {"score": 72.5, "metrics": {"score": 72.5}, "findings": []}
    monkeypatch.setattr("diagnostics.runner.run_job",
                        lambda job, **kw: JobOutcome("ok", result=fake, run_id="x", artifact_dir=str(tmp_path)))
    base = ["checklist", "--model", "mlp", "--no-report", "-q", "--data-dir", str(tmp_path / "d")]
    assert m.main(base + ["--fail-under", "80"]) == 3
    assert "checklist score 72.5 is below --fail-under 80" in capsys.readouterr().err
    assert m.main(base + ["--fail-under", "72.5"]) == 0
    assert "checklist score 72.5 >= 72.5: pass" in capsys.readouterr().err
    assert m.main(base + ["--fail-under", "0"]) == 0
    assert "checklist score 72.5 >= 0: pass" in capsys.readouterr().err
    assert m.main(base) == 0
    assert ": pass" not in capsys.readouterr().err  # no gate asked: nothing said about one
    with pytest.raises(SystemExit) as e:
        m.main(base + ["--fail-under", "180"])
    assert e.value.code == 2 and "between 0 and 100" in capsys.readouterr().err


def test_gradients_on_exploding_sample(tmp_path, data_dir):
    """bad_init_mlp (std 1.5 weights, 8 ReLU layers) explodes: the CLI's result and report say so."""
    p = cli("gradients", "--model", "bad_init_mlp", "--batch-size", "4", "--steps", "2", "--json",
            "--out", tmp_path / "g", data_dir=data_dir)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["metrics"]["layers_exploding"] > 0 and "exploding" in r["verdict"]
    assert any(l["status"] == "exploding" for l in r["layers"])
    assert json.loads((tmp_path / "g" / "result.json").read_text())["metrics"] == r["metrics"]
    assert_offline_html(tmp_path / "g" / "report.html", min_figures=2)
    assert (tmp_path / "g" / "layers.csv").exists()


def test_memory(tmp_path, data_dir):
    """The memory command's figures: the parameters and SGD's one momentum buffer per parameter, exactly."""
    from sample_models import SAMPLES

    n = sum(p.numel() for p in SAMPLES["mlp"].build().parameters())
    p = cli("memory", "--model", "mlp", "--batch-size", "4", "--optimizer", "sgd", "--json", "--out",
            tmp_path / "m", data_dir=data_dir)
    assert p.returncode == 0, p.stderr
    m = json.loads(p.stdout)["metrics"]
    assert m["param_bytes"] == 4 * n and m["optimizer_state_bytes"] == 4 * n and m["grad_bytes"] == 4 * n
    assert m["peak_train_bytes"] >= m["param_bytes"] + m["optimizer_state_bytes"]
    assert_offline_html(tmp_path / "m" / "report.html", min_figures=1)


def test_batch_scan(tmp_path, data_dir):
    p = cli("batch_scan", "--model", "mlp", "--max-batch", "2", "--repeats", "1", "--json", "-q",
            "--no-report", data_dir=data_dir)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert [row["batch"] for row in r["rows"]] == [1, 2] and all(row["fits"] for row in r["rows"])
    assert r["metrics"]["largest_batch_under_budget"] == 2
    assert r["rows"][1]["peak_bytes"] > r["rows"][0]["peak_bytes"]  # twice the batch, more activations


def test_optimize_one_fix(tmp_path, data_dir):
    p = cli("optimize", "--model", "mlp", "--batch-size", "4", "--fix", "inference_mode", "--iters", "1",
            "--warmup", "0", "--json", "--out", tmp_path / "o", data_dir=data_dir)
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)["rows"]
    assert [r["fix"] for r in rows] == ["baseline", "control", "inference_mode"]
    assert rows[2]["status"] == "ok" and rows[2]["max_abs_err"] == 0.0  # the same numbers, no autograd
    assert rows[2]["verdict"] == "within noise" and rows[2]["speedup_ci"] is None  # one round: no interval
    assert_offline_html(tmp_path / "o" / "report.html", min_figures=2)
    # an unknown fix id is bad input: exit 2 naming it
    p = cli("optimize", "--model", "mlp", "--fix", "nosuchfix", "--no-report", "-q", data_dir=data_dir)
    assert p.returncode == 2 and "invalid choice: 'nosuchfix'" in p.stderr


# ----------------------------------------------------------------------------- every subcommand's failures
def _model_commands() -> list[str]:
    from diagnostics.cli.main import model_commands

    return model_commands()


MODEL_COMMANDS = [n for n in _model_commands() if n != "distributed"]


@pytest.mark.parametrize("command", MODEL_COMMANDS)
def test_each_subcommand_rejects_bad_path_and_shape(command, tmp_path, capsys):
    """In-process (no job starts): exit 2 and a message naming the path / the shape."""
    from diagnostics.cli.main import main

    base = [command, "--no-report", "--data-dir", str(tmp_path)]
    assert main(base + ["--model", "models/missing.pt2"]) == 2
    assert "model file not found: models/missing.pt2" in capsys.readouterr().err
    assert main(base + ["--model", "mlp", "--input", "8,three"]) == 2
    assert "bad --input shape '8,three'" in capsys.readouterr().err


# ----------------------------------------------------------------------------- trace files
TRACES = REPO / "tests" / "data" / "traces"


def test_trace_analyze_and_diff_reports(tmp_path, data_dir):
    p = cli("trace", "analyze", TRACES / "gpu_small.json", "--json", "--out", tmp_path / "t", data_dir=data_dir)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    raw = json.loads((TRACES / "gpu_small.json").read_text())
    assert r["summary"]["events"] <= len(raw["traceEvents"]) and r["summary"]["has_gpu"] is True
    assert r["name"] == "gpu_small.json"
    assert {"report.html", "result.json", "top_operators_operators.csv"} <= {f.name for f in (tmp_path / "t").iterdir()}
    assert_offline_html(tmp_path / "t" / "report.html", min_figures=2)

    p = cli("trace", "diff", TRACES / "diff_before.json", TRACES / "diff_after.json", "--out", tmp_path / "d",
            data_dir=data_dir)
    assert p.returncode == 0, p.stderr
    assert "added" in p.stdout and "slower" in p.stdout  # the text table on stdout
    d = json.loads((tmp_path / "d" / "result.json").read_text())["diff"]
    assert sum(d["counts"].values()) == len(d["rows"])
    assert_offline_html(tmp_path / "d" / "report.html", min_figures=1)

    p = cli("trace", "analyze", tmp_path / "nope.json", data_dir=data_dir)
    assert p.returncode == 2 and "nope.json" in p.stderr and p.stdout == ""


# ----------------------------------------------------------------------------- progress bar
class _Stream:
    def __init__(self, tty):
        self.tty, self.text = tty, ""

    def isatty(self):
        return self.tty

    def write(self, s):
        self.text += s

    def flush(self):
        pass


def test_progress_bar_redraws_on_a_terminal_and_logs_lines_otherwise():
    from diagnostics.cli.main import ProgressBar

    tty = _Stream(True)
    bar = ProgressBar("profile", tty)
    bar.update(0.5, "profiling")
    bar.close()
    assert tty.text.startswith("\rprofile [" + "#" * 12 + "-" * 12 + "]  50%")
    assert "profiling" in tty.text and tty.text.endswith("\n")

    log = _Stream(False)
    bar = ProgressBar("profile", log)
    for f, m in [(0.0, "starting"), (0.0, "starting"), (0.5, "profiling"), (1.0, "done")]:
        bar.update(f, m)
        bar.tick()
    lines = log.text.splitlines()
    assert [l.split(" (")[0] for l in lines] == ["profile [  0%] starting", "profile [ 50%] profiling",
                                                 "profile [100%] done"]
    quiet = _Stream(False)
    bar = ProgressBar("x", quiet, enabled=False)
    bar.update(0.3, "y")
    assert quiet.text == ""


@pytest.mark.slow
def test_optimize_training_mode_on_resnet(data_dir, tmp_path):
    # issue #20's command: every training fix runs, checkpointing lowers the measured training peak
    p = cli("optimize", "--model", "resnet", "--mode", "train", "--fix", "activation_checkpointing", "--fix",
            "fused_optimizer", "--fix", "grad_accumulation", "--fix", "amp", "--iters", "2", "--warmup", "1", "-b", "4",
            "--json", "--out", tmp_path, data_dir=data_dir)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = {r["fix"]: r for r in json.loads(p.stdout)["rows"]}
    assert [rows[f]["status"] for f in ("activation_checkpointing", "fused_optimizer", "grad_accumulation", "amp")] \
        == ["ok"] * 4
    assert rows["activation_checkpointing"]["peak_bytes"] < rows["baseline"]["peak_bytes"]
    assert rows["fused_optimizer"]["loss_rel_diff"] < 1e-5  # the same arithmetic, fused
    assert all(len(rows[f]["losses"]) == 3 for f in rows if rows[f]["status"] == "ok")
