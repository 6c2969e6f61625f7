"""The CLI's commands behave alike: trace analyze / diff write the default report folder, run through
the run store (History) with progress, and fail cleanly on an unwritable --out; only documented commands
are exposed; unknown --option keys are refused; CLI errors name CLI flags, not the dashboard's sidebar.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from diagnostics.store import Store
from tests.cli.test_cli import REPO, assert_offline_html, cli

TRACES = REPO / "tests" / "data" / "traces"
GPU_TRACE = TRACES / "gpu_small.json"
BEFORE, AFTER = TRACES / "diff_before.json", TRACES / "diff_after.json"


@pytest.fixture
def store_dir(tmp_path):
    return tmp_path / "store"


# ----------------------------------------------------------------------------- 1. default report folder
def test_trace_analyze_writes_the_default_report_folder(tmp_path, store_dir):
    p = cli("trace", "analyze", GPU_TRACE, "--top", "2", data_dir=store_dir, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    (folder,) = (tmp_path / "torchscope-report").glob("trace-*")
    names = {f.name for f in folder.iterdir()}
    assert {"report.html", "result.json", "top_operators_operators.csv", "summary_categories.csv"} <= names
    assert not any(n.endswith(".feather") or n == "trace_meta.json" for n in names), names  # worker internals
    result = json.loads((folder / "result.json").read_text())
    assert result["name"] == "gpu_small.json" and result["summary"]["n_steps"] == 2
    assert result["top_operators"]["operators"][0]["name"] == "aten::mm"
    assert "columns_dir" not in result
    text = assert_offline_html(folder / "report.html", min_figures=2)
    assert "Top operators" in text and "aten::mm" in text
    assert f"report: {folder / 'report.html'}" in p.stdout
    assert "Top 2 of 4 operators by self time" in p.stdout and "2 steps" in p.stdout  # --top limits the text


def test_trace_analyze_top_beyond_the_kept_rows(tmp_path, store_dir):
    """The analysis keeps 20 rows per table; --top 25 asks the job for 25 (it once printed 20)."""
    from diagnostics.analyses.trace import TOP_N

    trace = tmp_path / "thirty_ops.json"
    events = [{"ph": "X", "cat": "cpu_op", "name": f"aten::op{i:02d}", "ts": 1000 + 100 * i, "dur": 90 - i,
               "pid": 1, "tid": 1, "args": {}} for i in range(30)]
    trace.write_text(json.dumps({"traceEvents": events}))
    assert TOP_N == 20
    p = cli("trace", "analyze", trace, "--top", "25", "--json", data_dir=store_dir, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    ops = json.loads(p.stdout)["top_operators"]["operators"]
    assert [o["name"] for o in ops] == [f"aten::op{i:02d}" for i in range(25)]  # by self time, longest first
    p = cli("trace", "analyze", trace, "--top", "25", "--no-report", data_dir=store_dir, cwd=tmp_path)
    assert "Top 25 of 30 operators by self time" in p.stdout and "aten::op24" in p.stdout
    assert "aten::op25" not in p.stdout


def test_trace_diff_writes_the_default_report_folder_and_no_report_skips_it(tmp_path, store_dir):
    p = cli("trace", "diff", BEFORE, AFTER, "-q", data_dir=store_dir, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""  # -q
    (folder,) = (tmp_path / "torchscope-report").glob("trace_diff-*")
    assert {"report.html", "result.json", "diff_rows.csv"} <= {f.name for f in folder.iterdir()}
    d = json.loads((folder / "result.json").read_text())
    assert d["diff"]["counts"] == {"added": 1, "removed": 1, "faster": 1, "slower": 1, "unchanged": 1}
    assert Path(d["before"]).name == "diff_before.json" and Path(d["after"]).name == "diff_after.json"
    assert_offline_html(folder / "report.html", min_figures=1)
    assert "1 added, 1 removed, 1 faster, 1 slower" in p.stdout and f"report: {folder / 'report.html'}" in p.stdout

    p = cli("trace", "diff", BEFORE, AFTER, "-q", "--no-report", data_dir=store_dir, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert len(list((tmp_path / "torchscope-report").glob("trace_diff-*"))) == 1 and "report:" not in p.stdout


# ----------------------------------------------------------------------------- 2. run store and progress
def test_trace_commands_are_recorded_in_the_store_with_progress(tmp_path, store_dir):
    p = cli("trace", "analyze", GPU_TRACE, "--json", "--no-report", data_dir=store_dir, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    shown = json.loads(p.stdout)
    assert re.search(r"^trace analyze \[ *\d+%\] reading gpu_small\.json", p.stderr, re.M), p.stderr  # progress
    (rec,) = Store(store_dir).list(analysis="trace")
    assert (rec.source, rec.status, rec.model_label) == ("cli", "ok", "traces/gpu_small.json")
    stored = Store(store_dir).get(rec.id).result
    # the store keeps the analysis' own result, the one the dashboard's History view reopens
    assert stored["top_operators"] == shown["top_operators"] and stored["summary"] == shown["summary"]
    assert stored["path"] == str(GPU_TRACE.resolve())

    p = cli("trace", "diff", BEFORE, AFTER, "--json", "--no-report", data_dir=store_dir, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    (rec,) = Store(store_dir).list(analysis="trace_diff")
    assert (rec.source, rec.status) == ("cli", "ok")
    assert rec.model_label == "traces/diff_before.json vs traces/diff_after.json"
    assert Store(store_dir).get(rec.id).result["diff"] == json.loads(p.stdout)["diff"]


def test_unreadable_trace_exits_2_and_is_recorded_as_failed(tmp_path, store_dir):
    bad = tmp_path / "bad.json.gz"
    bad.write_text("{}")
    p = cli("trace", "analyze", bad, data_dir=store_dir, cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    assert "error: trace analyze failed (error)" in p.stderr and "not gzip" in p.stderr and p.stdout == ""
    assert "Traceback" not in p.stderr and not (tmp_path / "torchscope-report").exists()
    (rec,) = Store(store_dir).list(analysis="trace")
    assert rec.status == "error" and rec.source == "cli" and "not gzip" in Store(store_dir).get(rec.id).error


def test_missing_trace_file_exits_2_before_any_job(tmp_path, capsys):
    from diagnostics.cli.main import main

    data = tmp_path / "store"
    assert main(["trace", "diff", str(BEFORE), str(tmp_path / "nope.json"), "-q", "--data-dir", str(data)]) == 2
    assert f"trace file not found: {tmp_path / 'nope.json'}" in capsys.readouterr().err
    assert not Store(data).list()


# ----------------------------------------------------------------------------- 3. unwritable --out
@pytest.mark.parametrize("command", [["trace", "analyze", GPU_TRACE], ["trace", "diff", BEFORE, AFTER],
                                     ["summary", "--model", "mlp"]])
def test_unwritable_out_is_a_clean_error(command, tmp_path, store_dir):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    out = blocker / "report"
    p = cli(*command, "--out", out, data_dir=store_dir, cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    assert f"error: cannot write the report folder {out}: {blocker} is a file, not a folder" in p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""
    assert not Store(store_dir).list(), "refused before the job ran: no run is recorded"
    p = cli(*command, "--out", blocker, data_dir=store_dir, cwd=tmp_path)
    assert p.returncode == 2 and f"error: cannot write the report folder {blocker}: it is a file" in p.stderr


def test_a_report_folder_that_fails_while_written_is_reported(tmp_path, store_dir, monkeypatch, capsys):
    """A folder that passes the early check but fails on writing (disk full, say) is still one message."""
    from diagnostics.render import html as report
    from diagnostics.cli.main import main

    def full(*_, **__):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(report, "write_report_folder", full)
    out = tmp_path / "report"
    assert main(["trace", "analyze", str(GPU_TRACE), "-q", "--out", str(out), "--data-dir", str(store_dir)]) == 1
    assert f"error: could not write the report folder {out}: [Errno 28] No space left on device" in capsys.readouterr().err


# ----------------------------------------------------------------------------- 4. only user-facing commands
def _commands() -> set[str]:
    """What the CLI should offer, derived: each registered analysis' declared command, and the CLI's own."""
    from diagnostics.cli.main import RESERVED, model_commands

    return set(model_commands()) | set(RESERVED)


def _documented_commands() -> set[str]:
    """The first word after `python -m diagnostics` in docs/cli.md's Commands block."""
    doc = (REPO / "docs" / "cli.md").read_text()
    block = doc.split("## Commands", 1)[1].split("```", 2)[1]
    return set(re.findall(r"python -m diagnostics (\w+)", block))


def test_only_declared_commands_are_exposed_and_the_docs_name_no_other(capsys):
    from diagnostics.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert set(sub.choices) == _commands()
    assert {"summary", "profile", "trace", "list", "history", "run"} <= set(sub.choices)  # the derivation works
    stale = _documented_commands() - _commands()
    assert not stale, f"docs/cli.md shows commands that do not exist: {stale}"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    top_help = capsys.readouterr().out
    for internal in ("validate", "trace_timeline", "trace_diff", "distributed_traces"):
        assert not re.search(rf"^\s+{internal}\b", top_help, re.M), internal


@pytest.mark.parametrize("internal", ["trace_timeline", "trace_diff", "distributed_traces", "validate"])
def test_internal_analyses_are_not_commands(internal, tmp_path, capsys):
    from diagnostics.cli.main import main

    with pytest.raises(SystemExit) as e:
        main([internal, "--data-dir", str(tmp_path)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"invalid choice: '{internal}'" in err and "KeyError" not in err


def test_list_shows_the_commands(capsys):
    from diagnostics.cli.main import main

    assert main(["list"]) == 0
    out = capsys.readouterr().out
    commands = out.split("commands:\n", 1)[1].split("sample models:", 1)[0]
    names = {line.strip().split("  ")[0] for line in commands.strip().splitlines()}
    assert names == _commands() - {"list", "trace"} | {"trace analyze", "trace diff"}
    assert "mlp" in out.split("sample models:", 1)[1]


def test_an_analysis_whose_command_differs_from_its_name_gets_that_command(monkeypatch, tmp_path, capsys):
    """A command is not an analysis' name: 'list', every parser and a run find the analysis by its command
    (once, any command crashed with KeyError while building the parser)."""
    import dataclasses

    from diagnostics.cli import main as cli_main
    from diagnostics.registry import ANALYSES

    monkeypatch.setitem(ANALYSES, "model_summary", dataclasses.replace(ANALYSES["summary"], name="model_summary",
                                                                       command="overview", title="Overview"))
    assert cli_main.main(["list"]) == 0
    assert re.search(r"^  overview +Overview$", capsys.readouterr().out, re.M)
    with pytest.raises(SystemExit) as e:
        cli_main.main(["overview", "--help"])
    assert e.value.code == 0 and "--skip-backward" in capsys.readouterr().out
    ran = []
    monkeypatch.setattr(cli_main, "run_job_command", lambda args, name, spec, options, **kw: ran.append(
        (name, spec.label, options)) or (0, {}))
    assert cli_main.main(["overview", "--model", "mlp", "--skip-backward", "--no-report"]) == 0
    assert ran == [("model_summary", "mlp (sample)", {"skip_backward": True})]


def test_a_command_taken_twice_or_kept_by_the_cli_is_refused(monkeypatch):
    import dataclasses

    from diagnostics.cli.main import build_parser
    from diagnostics.registry import ANALYSES, register

    summary = ANALYSES["summary"]
    with pytest.raises(ValueError, match=r"analyses 'summary' and 'summary2' both declare the command 'summary'"):
        register([summary, dataclasses.replace(summary, name="summary2")])
    with pytest.raises(ValueError, match=r"analysis 'summary' is registered twice"):
        register([summary, dataclasses.replace(summary, command="other")])
    monkeypatch.setitem(ANALYSES, "h", dataclasses.replace(summary, name="h", command="history"))
    with pytest.raises(RuntimeError, match=r"analysis command names \['history'\] are kept by the CLI itself"):
        build_parser()


# ----------------------------------------------------------------------------- 5. unknown --option keys
@pytest.mark.parametrize("command, key, valid", [
    ("profile", "record_shape", ["record_shapes", "latency_iters", "mode"]),
    ("summary", "skip_backwards", ["skip_backward"]),
    ("checklist", "purposes", ["purpose", "dataloader", "profile_steps"]),
    ("gradients", "step", ["steps", "optimizer", "lr"]),
])
def test_unknown_option_key_exits_2_listing_the_valid_keys(command, key, valid, tmp_path, capsys):
    from diagnostics.cli.main import main

    data = tmp_path / "store"
    assert main([command, "--model", "mlp", "--no-report", "-q", "--data-dir", str(data),
                 "--option", f"{key}=1"]) == 2
    err = capsys.readouterr().err
    assert f"error: unknown option '{key}' for {command}; valid: " in err
    listed = err.split("valid: ", 1)[1]
    assert all(v in listed for v in valid), err
    assert not Store(data).list()  # refused before any job


def test_option_key_hint_names_the_flag(tmp_path, capsys):
    from diagnostics.cli.main import main

    assert main(["profile", "--model", "mlp", "--no-report", "-q", "--data-dir", str(tmp_path),
                 "--option", "steps=2"]) == 2
    assert "(--steps sets 'active')" in capsys.readouterr().err


def test_known_option_keys_reach_the_analysis(monkeypatch, tmp_path):
    import diagnostics.cli.main as m
    from diagnostics.runner import JobOutcome

    seen = []

    def fake_run_job(job, **kw):
        seen.append(job.options)
        return JobOutcome("ok", result={"metrics": {}}, run_id="x", artifact_dir=str(tmp_path))

    monkeypatch.setattr("diagnostics.runner.run_job", fake_run_job)
    assert m.main(["profile", "--model", "mlp", "--no-report", "-q", "--data-dir", str(tmp_path), "--mode", "train",
                   "--option", "record_shapes=false", "--option", "latency_iters=2"]) == 0
    assert seen == [{"mode": "train", "record_shapes": False, "latency_iters": 2}]


def test_every_flag_of_a_command_is_a_declared_option_of_its_analysis(capsys):
    """The command's flags come from its analysis' declaration: one flag per flagged option, with
    the declared default in its help; options declared without a flag only via --option."""
    from diagnostics.cli.main import build_parser, model_commands
    from diagnostics.registry import ANALYSES

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices
    for name in model_commands():
        analysis = ANALYSES[name]
        dests = {a.dest: a for a in sub[name]._actions}
        for o in analysis.options:
            if o.cli_flag is None:
                assert "opt_" + o.key not in dests, (name, o.key)
            else:
                action = dests["opt_" + o.key]
                assert f"(default {o.describe_default()})" in action.help.replace("%%", "%"), (name, o.key)
        assert {d.removeprefix("opt_") for d in dests if d.startswith("opt_")} <= set(analysis.option_keys), name


# ----------------------------------------------------------------------------- 6. CLI wording in errors
def test_file_model_without_inputs_names_the_input_flag(tmp_path, store_dir):
    import torch
    from torch import nn

    path = tmp_path / "lin.pt"
    torch.jit.save(torch.jit.script(nn.Linear(3, 2)), str(path))
    p = cli("summary", "--model", path, "-q", "--no-report", data_dir=store_dir, cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    assert "lin.pt declares no example inputs: give the input shapes with --input SHAPE[:DTYPE]" in p.stderr
    assert "sidebar" not in p.stderr
    # the same model with --input runs
    p = cli("summary", "--model", path, "--input", "4,3", "-q", "--no-report", "--json", data_dir=store_dir,
            cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["metrics"]["params_total"] == 3 * 2 + 2


def test_cli_message_rewrites_only_the_dashboard_instruction():
    from diagnostics.cli.main import cli_message

    assert cli_message("m.pt declares no example inputs: enter the input shapes in the sidebar") == (
        "m.pt declares no example inputs: give the input shapes with --input SHAPE[:DTYPE], e.g. --input 8,3,32,32 "
        "(repeat it for each input)")
    assert cli_message("bad shape [8, 65]") == "bad shape [8, 65]"
    assert cli_message(None) == ""


def test_out_of_memory_inside_forward_is_a_failed_job_not_bad_input(tmp_path, store_dir):
    """Exit 1 (the job failed), not 2 (bad input), when the model's own forward runs out of memory."""
    model = tmp_path / "oom_model.py"
    model.write_text(
        "import torch\nfrom torch import nn\n\n"
        "class M(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.lin = nn.Linear(4, 2)\n\n"
        "    def forward(self, x):\n"
        "        raise torch.OutOfMemoryError('out of memory: tried to allocate 64.00 GiB')\n\n"
        "def build_model():\n    return M()\n\n"
        "def example_inputs():\n    return (torch.randn(2, 4),)\n")
    p = cli("summary", "--model", model, "-q", "--no-report", data_dir=store_dir, cwd=tmp_path)
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert "out of memory" in p.stderr.lower()


# ----------------------------------------------------------------------------- the memory plan
def test_plan_takes_its_own_device_and_refuses_bad_ones_by_name(tmp_path, store_dir):
    p = cli("plan", "--help", data_dir=store_dir, cwd=tmp_path)
    assert p.returncode == 0 and "--batch" in p.stdout and "--seq" in p.stdout and "H100-80GB" in p.stdout
    p = cli("plan", "--model", "mlp", "--device", "H900", data_dir=store_dir, cwd=tmp_path)
    assert p.returncode == 2 and "unknown device 'H900'; known: H100-80GB" in p.stderr
    p = cli("plan", "--model", "mlp", "--shard", "zero3", "--no-report", data_dir=store_dir, cwd=tmp_path)
    assert p.returncode == 2 and "sharding zero3 needs the number of ranks: give --ranks N" in p.stderr


@pytest.mark.slow
def test_plan_answers_with_a_fit_table(tmp_path, store_dir):
    p = cli("plan", "--model", "mlp", "--batch", "8,32", "--device", "cpu:64MB", "--no-sweep", "--no-report",
            data_dir=store_dir, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "device: cpu:64MB" in p.stdout and "fp32, adamw · b8" in p.stdout and "fp32, adamw · b32" in p.stdout
