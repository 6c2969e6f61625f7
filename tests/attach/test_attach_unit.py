"""Attach mode's parts without running a training script: the command check, the run folder's
analysis on hand-written records, the result's round trip, the bootstrap's chaining."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from diagnostics.analyses.attach.job import analyse_run
from diagnostics.analyses.attach.protocol import PHASES, AttachConfig
from diagnostics.analyses.attach.result import AttachResult
from diagnostics.attach.command import UsageError, check_command, child_environment
from diagnostics.registry import ANALYSES
from diagnostics.results import decode, metrics_of, to_json
from tests.attach.harness import ROOT

BOOT = ROOT / "diagnostics" / "attach" / "bootstrap"


# ----------------------------------------------------------------------------- the command
def test_a_python_script_a_module_and_another_program_are_told_apart(tmp_path):
    (tmp_path / "train.py").write_text("print(1)\n")
    c = check_command([sys.executable, "-u", "-W", "ignore", "train.py", "--lr", "1"], tmp_path)
    assert c.kind == "script" and c.target == str(tmp_path / "train.py") and c.label == "train.py"
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("raise SystemExit('imported!')\n")  # must not run
    m = check_command([sys.executable, "-m", "pkg.train"], tmp_path)
    assert m.kind == "module" and m.label == "-m pkg.train"
    o = check_command(["true"], tmp_path)
    assert o.kind == "other" and "reaches every Python process" in o.notes[0]


@pytest.mark.parametrize("argv, message", [
    (["no-such-program-xyz", "a"], "command not found: no-such-program-xyz (not on PATH)"),
    ([sys.executable, "missing.py"], "the script missing.py does not exist"),
    ([sys.executable, "notes.txt"], "the script notes.txt is not a Python script"),
    ([sys.executable, "blob.bin"], "is not a Python script: a binary file"),
    ([sys.executable, "-E", "train.py"], "python -E ignores PYTHON* variables"),
    ([sys.executable, "-I", "train.py"], "python -I isolates it"),
    ([sys.executable, "-m", "no_such_module_xyz.train"], "no module named no_such_module_xyz"),
    ([sys.executable], "would start an interactive interpreter"),
    (["./train.py"], "cannot run ./train.py: it is not an executable file"),
    ([], "no command given"),
])
def test_a_command_that_cannot_run_is_refused_with_its_reason(tmp_path, argv, message):
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "notes.txt").write_text("these are my notes, not a program\n")
    (tmp_path / "blob.bin").write_bytes(b"\x7fELF\x00\x00\x01\x02" * 20)
    with pytest.raises(UsageError, match=__import__("re").escape(message)):
        check_command(argv, tmp_path)


def test_torchrun_arguments_are_read_by_torchruns_own_parser(tmp_path):
    (tmp_path / "train.py").write_text("print(1)\n")
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    c = check_command([torchrun, "--standalone", "--nproc-per-node", "3", "train.py", "--epochs", "2"], tmp_path)
    assert c.kind == "torchrun" and c.nproc == "3" and c.label == "torchrun x3 train.py"
    with pytest.raises(UsageError, match="torchrun's arguments are not valid"):
        check_command([torchrun, "--nproc-per-node"], tmp_path)
    with pytest.raises(UsageError, match="the script nope.py does not exist"):
        check_command([torchrun, "--nproc-per-node", "2", "nope.py"], tmp_path)


def test_the_child_environment_puts_the_bootstrap_first_and_keeps_the_rest(tmp_path):
    env = child_environment(str(tmp_path), {"PYTHONPATH": "/mine", "HOME": "/h"})
    assert env["PYTHONPATH"] == f"{BOOT}{os.pathsep}/mine" and env["HOME"] == "/h"
    assert env["TORCHSCOPE_ATTACH_DIR"] == str(tmp_path)


def test_the_cli_refuses_bad_input_with_exit_2_and_stores_nothing(tmp_path, capsys):
    from diagnostics.cli.main import main
    from diagnostics.store import Store

    before = Store(tmp_path).count()
    assert main(["run", "--data-dir", str(tmp_path), "--", "no-such-program-xyz"]) == 2
    assert "error: command not found: no-such-program-xyz" in capsys.readouterr().err
    assert main(["run", "--data-dir", str(tmp_path), "--at", "1", "--", sys.executable, "x.py"]) == 2
    assert "--at 1: the first step starts with the script" in capsys.readouterr().err
    assert Store(tmp_path).count() == before


# ----------------------------------------------------------------------------- the analysis
def _write_run(run_dir: Path, steps: list[dict], meta: dict, config: AttachConfig | None = None) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (config or AttachConfig(steps=2, at=4)).write(str(run_dir))
    proc = run_dir / "proc-1234"
    proc.mkdir(parents=True)
    (proc / "meta.json").write_text(json.dumps({"boundary": "optimizer", "cycle": 1, "optimizers": [
        {"type": "SGD", "params": 10, "param_dtypes": {"float32": 10}, "devices": {"cpu": 10}, "order": 0}],
        **meta}))
    (proc / "steps.jsonl").write_text("\n".join(json.dumps(s) for s in steps) + "\n")


def _step(n, parts, profiled=False, tool=0.0, t0=None):
    t0 = float(n) if t0 is None else t0
    total = sum(parts.values()) + tool
    return {"n": n, "t0": t0, "t1": t0 + total / 1e3, "ms": {k: parts.get(k, 0.0) for k in PHASES},
            "tool_ms": tool, "syncs": [], "p": profiled, "b": 1, "c": None}


def test_the_step_time_is_the_median_outside_the_window_and_its_parts_sum_to_it(tmp_path):
    steps = [_step(1, {"host": 900.0})]  # start-up: warm-up, never counted
    steps += [_step(n, {"data_wait": 10.0 + n, "forward": 2.0, "backward": 3.0, "host": 1.0}) for n in (2, 3)]
    steps += [_step(n, {"data_wait": 12.0, "forward": 2.5, "backward": 3.0, "host": 1.0}, profiled=True, tool=0.4)
              for n in (4, 5)]
    steps += [_step(n, {"data_wait": 9.0 + n, "forward": 2.0, "backward": 3.0, "host": 1.0}) for n in (6, 7, 8)]
    _write_run(tmp_path, steps, {"window": [4, 5]})
    r = analyse_run(tmp_path, exit_code=0, command=["python", "t.py"])
    outside = [12.0 + 6, 13.0 + 6, 15.0 + 6, 16.0 + 6, 17.0 + 6]  # steps 2, 3, 6, 7, 8
    assert r.step_ms == pytest.approx(sorted(outside)[2])
    assert r.breakdown_ms["data_wait"] == pytest.approx(15.0) and r.breakdown_ms["forward"] == pytest.approx(2.0)
    assert sum(r.breakdown_ms.values()) == pytest.approx(r.step_ms)
    assert r.step_ms_profiled == pytest.approx(18.5)  # the profiler's own 0.4 ms per step is ours, left out
    assert r.overhead_pct == pytest.approx(100 * (18.5 - 21.0) / 21.0)
    assert r.bottleneck.category == "data_wait" and r.bottleneck.share == pytest.approx(15 / 21)
    assert r.steps == 8 and r.profiled_steps == (4, 5) and r.status == "ok"
    assert [row.step_ms for row in r.step_table][1:3] == pytest.approx([18.0, 19.0])
    assert isinstance(r, AttachResult) and decode(ANALYSES["attach"], json.loads(to_json(r))) == r


def test_a_run_without_a_window_says_why_and_a_run_without_steps_says_what_was_seen(tmp_path):
    _write_run(tmp_path / "a", [_step(n, {"host": 5.0}) for n in range(1, 5)], {"window": None},
               AttachConfig(steps=5))
    r = analyse_run(tmp_path / "a", exit_code=0)
    assert r.profiled_steps is None and r.step_ms == pytest.approx(5.0)
    assert any("before the profiled window" in n and "--at K" in n for n in r.notes)
    (tmp_path / "b").mkdir()
    AttachConfig().write(str(tmp_path / "b"))
    empty = analyse_run(tmp_path / "b", exit_code=3)
    assert empty.status == "failed" and empty.steps == 0 and empty.exit_code == 3  # the exit code first
    assert "no process of the job imported torch" in empty.notes[0] and "exited with code 3" in empty.notes[0]
    (tmp_path / "b" / "proc-7").mkdir()  # what the bootstrap leaves when torch was imported and nothing ran
    (tmp_path / "b" / "proc-7" / "meta.json").write_text(json.dumps({"pid": 7, "events": 0, "steps_seen": 0}))
    crashed = analyse_run(tmp_path / "b", exit_code=1)
    assert "torch was imported" in crashed.notes[0] and "python -E" not in crashed.notes[0]
    gone = analyse_run(tmp_path / "c", exit_code=0)  # the run folder deleted while the script ran
    assert gone.status == "no steps" and gone.exit_code == 0 and "was deleted" in gone.notes[0]


def test_too_few_and_too_slow_workers_are_told_apart(tmp_path, monkeypatch):
    """Workers take 40 ms a batch; the step computes 5 ms and waits for the rest: 8 workers keep up."""
    steps = [_step(n, {"data_wait": 15.0, "forward": 5.0}, t0=100.0 + n) for n in range(1, 12)]
    _write_run(tmp_path, steps, {"window": None, "loaders": [{"id": 1, "num_workers": 2, "batch_size": 4,
                                                                "persistent_workers": True, "pin_memory": False,
                                                                "prefetch_factor": 2, "iters": 1, "len": 100}]},
               AttachConfig(steps=5))
    (tmp_path / "workers").mkdir()
    lines = [[100.0 + n, 100.0 + n + 0.040, 0.001, n % 2, 4, 1234] for n in range(3, 11)]
    (tmp_path / "workers" / "77.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    r = analyse_run(tmp_path, exit_code=0)
    w = r.workers
    assert w.fetch_collate_ms == pytest.approx(40.0) and w.collate_ms == pytest.approx(1.0)
    assert w.workers_needed == 8 and w.supply_interval_ms == pytest.approx(20.0)
    f = next(f for f in r.findings if f.id == "data_wait")
    assert f.status == "fail" and f.numbers["workers_needed"] == 8
    from diagnostics.analyses.attach import rules
    from diagnostics.analyses.attach.job import _figures, _load_proc, _workers

    head = _figures(_load_proc(tmp_path / "proc-1234"), AttachConfig(steps=5), tmp_path, [])
    head["workers"] = _workers(lines, _load_proc(tmp_path / "proc-1234"), head)
    few = rules.check_data_wait(rules.Facts(head, [head], None, cpu_count=16))
    slow = rules.check_data_wait(rules.Facts(head, [head], None, cpu_count=4))
    assert "too few workers: 8 worker(s) would keep up" in few[2] and "set num_workers=8" in few[2]
    assert "the workers are too slow: 8 workers would be needed but this machine has 4 CPUs" in slow[2]
    from diagnostics.analyses.attach import job as attach_job  # the run's own machine: the cores devices reads

    for cores, told in ((4, "this machine has 4 CPUs"), (16, "set num_workers=8")):
        monkeypatch.setattr(attach_job, "logical_cores", lambda: cores)
        found = next(f for f in analyse_run(tmp_path, exit_code=0).findings if f.id == "data_wait")
        assert told in found.suggestion


def test_the_declared_metrics_cover_the_result_and_the_report_has_its_sections(tmp_path):
    from diagnostics.render.html import write_report_folder

    steps = [_step(n, {"data_wait": 3.0, "forward": 2.0, "host": 1.0}, profiled=n in (4, 5)) for n in range(1, 9)]
    _write_run(tmp_path / "run", steps, {"window": [4, 5]})
    r = analyse_run(tmp_path / "run", exit_code=0, command=["python", "t.py"])
    decl = ANALYSES["attach"]
    assert [k for k in metrics_of(r) if decl.metric(k) is None] == []
    written = write_report_folder("attach", r, tmp_path / "report")
    html = written["report.html"].read_text()
    assert "Where each step&#x27;s time goes" in html or "Where each step's time goes" in html
    assert "Fix this first" in html and "step_table.csv" in written


# ----------------------------------------------------------------------------- the bootstrap
def test_the_bootstrap_chains_to_the_sitecustomize_it_shadows_and_costs_nothing_without_a_run(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import builtins\nbuiltins.THEIRS_RAN = True\n")
    code = "import builtins, sys; print(getattr(builtins, 'THEIRS_RAN', False), 'torch' in sys.modules, " \
           "[f.__class__.__name__ for f in sys.meta_path][0])"
    base = {k: v for k, v in os.environ.items() if k != "TORCHSCOPE_ATTACH_DIR"}
    path = f"{BOOT}{os.pathsep}{theirs}"
    on = subprocess.run([sys.executable, "-c", code], env={**base, "PYTHONPATH": path,
                                                           "TORCHSCOPE_ATTACH_DIR": str(tmp_path)},
                        capture_output=True, text=True, timeout=60)
    off = subprocess.run([sys.executable, "-c", code], env={**base, "PYTHONPATH": path}, capture_output=True,
                         text=True, timeout=60)
    assert on.stdout.split() == ["True", "False", "TorchWatcher"], on.stderr  # waits for torch, imports nothing
    assert off.stdout.split()[:2] == ["True", "False"] and "TorchWatcher" not in off.stdout
    assert on.stderr == off.stderr == ""


# ----------------------------------------------------------------------------- what runs inside the job
def _imports(path: Path) -> set[str]:
    import ast

    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


def test_the_code_that_runs_inside_the_users_job_imports_only_the_standard_library():
    """The bootstrap, the agent and the protocol they load by path: no engine, no numpy, streamlit or
    plotly (the GPU machine has none of them), torch only as the module handed over."""
    std = set(sys.stdlib_module_names) | {"__future__"}
    for path in (BOOT / "sitecustomize.py", ROOT / "diagnostics" / "attach" / "agent.py",
                 ROOT / "diagnostics" / "analyses" / "attach" / "protocol.py"):
        assert _imports(path) - std <= {"torch"}, (path.name, _imports(path) - std)


def test_the_attach_package_stands_below_the_cli_and_the_dashboard():
    allowed = {"diagnostics", "psutil"}
    # fix trials (attach/trials.py): its analysis' record and result, and the one interleaved comparison;
    # run --plan (background.py checks its spec; no torch): analyses/plan/attached.py, the planner's entry
    # the agent imports in the script's process only with --plan; the launcher's trace gzip opens the run
    # folder's files as a job's are opened (diagnostics.jobfiles: torch-free, below the store)
    engine_ok = ("diagnostics.errors", "diagnostics.procs", "diagnostics.attach", "diagnostics.analyses.attach",
                 "diagnostics.store", "diagnostics.analyses.trials", "diagnostics.measure.compare",
                 "diagnostics.analyses.plan.attached", "diagnostics.declare", "diagnostics.jobfiles")
    import ast

    for path in (ROOT / "diagnostics" / "attach").rglob("*.py"):
        std = set(sys.stdlib_module_names) | {"__future__", "torch"}
        assert _imports(path) - std <= allowed, path
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("diagnostics"):
                names = [node.module] if node.module != "diagnostics" else [f"diagnostics.{a.name}" for a in node.names]
                assert all(n.startswith(engine_ok) for n in names), (path.name, names)


#: Agents made in this process by _agent, finished after each test as the bootstrap finishes one at exit: an
#: agent whose steps opened the profiled window leaves torch.profiler running, and a profiler state still alive
#: at the interpreter's exit crashed it (SIGSEGV in ProfilerStateBase's destructor, after every test passed).
_AGENTS: list = []


@pytest.fixture(autouse=True)
def _finish_agents():
    yield
    while _AGENTS:
        _AGENTS.pop().finish()


def _agent(tmp_path):
    """The agent as the bootstrap loads it (by path, with the run folder's protocol), not installed."""
    import importlib.util

    import torch

    mods = {}
    for name, rel in (("protocol", "diagnostics/analyses/attach/protocol.py"), ("agent", "diagnostics/attach/agent.py")):
        spec = importlib.util.spec_from_file_location(f"_t_attach_{name}", ROOT / rel)
        mods[name] = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mods[name])
    tmp_path.mkdir(parents=True, exist_ok=True)
    AttachConfig().write(str(tmp_path))
    agent = mods["agent"].Agent(torch, str(tmp_path), mods["protocol"])
    _AGENTS.append(agent)
    return agent


def test_gradient_statistics_match_an_independent_computation(tmp_path):
    import torch

    agent = _agent(tmp_path)
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(5, 4))
    b = torch.nn.Parameter(torch.randn(4).double())  # a second dtype: its own group
    w.grad = torch.randn(5, 4)
    w.grad[0] = 0.0
    b.grad = torch.tensor([1.0, float("nan"), float("inf"), 0.0], dtype=torch.float64)
    opt = torch.optim.SGD([w, b], lr=0.1)
    agent.grad_stats(opt)
    (n, ids, numels, table), = agent.grad_steps
    assert ids == [id(w), id(b)] and numels == [20, 4]
    g = w.grad
    assert table[0].tolist() == pytest.approx([g.norm().item(), g.abs().sum().item(), g.abs().max().item(),
                                               float((g == 0).sum()), 0.0, 0.0])
    assert table[1, 3:].tolist() == [1.0, 1.0, 1.0]  # one zero, one NaN, one inf


def test_gradient_statistics_of_interleaved_dtypes_keep_the_optimizers_order_and_half_is_summed_in_float32(tmp_path):
    """Four fused reductions per dtype (issue 39: fewer of our ops in the window): the rows come back in
    the optimizer's order though the dtypes interleave, a float16 gradient's norms are taken in float32 (its
    L2 of 300 x 20 would overflow float16's 65504 squared), zeros counted exactly."""
    import torch

    agent = _agent(tmp_path)
    torch.manual_seed(1)
    shapes = [((3, 4), torch.float32), ((5,), torch.float64), ((7,), torch.float32), ((20,), torch.float16)]
    ps = [torch.nn.Parameter(torch.zeros(s, dtype=d)) for s, d in shapes]
    for p in ps:
        p.grad = torch.randn(p.shape, dtype=torch.float64).to(p.dtype)
    ps[2].grad[:3] = 0.0
    ps[3].grad[:] = 300.0
    ps[3].grad[0] = 0.0
    agent.grad_stats(torch.optim.SGD(ps, lr=0.1))
    (_, ids, numels, table), = agent.grad_steps
    assert ids == [id(p) for p in ps] and numels == [12, 5, 7, 20] and table.dtype == torch.float32
    for row, p in zip(table.tolist(), ps):
        g = p.grad.double()
        assert row == pytest.approx([g.norm().item(), g.abs().sum().item(), g.abs().max().item(),
                                     float((g == 0).sum()), 0.0, 0.0], rel=1e-5)
    assert table[3, 0].item() == pytest.approx(300.0 * 19 ** 0.5, rel=1e-5) and table[2, 3].item() == 3.0


def test_a_negative_profiler_difference_is_within_noise_with_the_steps_spread(tmp_path):
    outside = [5.0, 4.0, 6.0, 5.0, 4.5, 5.5, 5.0, 4.0]
    steps = [_step(n, {"host": outside[n - 1] if n <= 8 else 4.8}, profiled=n in (9, 10)) for n in range(1, 11)]
    _write_run(tmp_path, steps, {"window": [9, 10]}, AttachConfig(steps=2, at=9, stable_steps=8))
    r = analyse_run(tmp_path, exit_code=0)
    assert r.overhead_pct < 0 and r.overhead.verdict == "within noise"
    lo, hi = r.overhead.noise_pct  # steps 2-8 (step 1 is start-up): quartiles 4.0 and 5.5 around their median 5.0
    assert r.step_ms == pytest.approx(5.0) and (lo, hi) == pytest.approx((-20.0, 10.0))
    from diagnostics.render.charts.attach import summary_lines

    line = next(x for x in summary_lines(r) if "against the steps outside" in x)
    assert "within noise" in line and "profiler's cost" not in line


def test_the_cpu_allocator_peak_per_step_is_read_from_the_allocation_events():
    import numpy as np

    from diagnostics.analyses.attach.job import _cpu_alloc_peaks

    # running totals (bytes since the window began) at these times; device 0 is the CPU, 1 a GPU
    ts = np.array([5.0, 12.0, 15.0, 18.0, 22.0, 25.0, 28.0, 13.0])
    total = np.array([100, 400, 250, 100, 900, 300, 100, 10_000])
    dev = np.array([0, 0, 0, 0, 0, 0, 0, 1])
    st = {"step": [1, 2], "start_us": [10.0, 20.0], "dur_us": [10.0, 10.0]}
    assert _cpu_alloc_peaks(ts, total, dev, st) == {1: 300, 2: 800}  # the peak above each step's start


def test_the_boundary_follows_the_loop_manual_updates_evaluation_and_inference(tmp_path):
    """The agent's boundary logic driven call by call (as its hooks call it), no process started."""
    import torch

    def call(agent, mod, *, grad=True):
        with torch.set_grad_enabled(grad):
            agent.on_top_forward(mod)
            agent.on_top_forward_end(mod)

    def backward(agent):
        agent.on_backward()
        agent.enter("backward")
        agent.leave()

    model, loss = torch.nn.Linear(2, 2), torch.nn.MSELoss()
    agent = _agent(tmp_path / "manual")
    for epoch in range(2):
        for _ in range(5):  # forward, loss, backward, a manual update (nothing of ours sees it)
            call(agent, model)
            call(agent, loss)
            backward(agent)
        model.eval()
        for _ in range(3):  # the epoch's evaluation loop
            call(agent, model, grad=False)
            call(agent, loss, grad=False)
        model.train()
    assert agent.mode == "manual update"
    assert agent.completed == 10  # each epoch's last step ends where its evaluation begins
    ev = agent.evaluation
    assert ev["forwards"] == 6 and ev["periods"] == 2 and agent.evaluating is not None

    infer = _agent(tmp_path / "infer")
    model.eval()
    for _ in range(4):
        call(infer, model, grad=False)
    assert infer.mode == "forward" and infer.completed == 4  # chosen at the 2nd forward, counted from the 1st
    assert "Linear.forward" in infer.mode_detail


def test_a_bare_exit_code_is_said_once_and_other_errors_still_shown():
    from diagnostics.attach.session import exit_error, only_exit_code

    assert only_exit_code(exit_error(1)) and only_exit_code(exit_error(-9))
    assert not only_exit_code("the script exited with code 0, but the run folder could not be read")
    assert not only_exit_code("the script was stopped (exit code 130)") and not only_exit_code(None)


def test_the_step_parts_legend_sits_below_the_axis_title_at_the_figures_foot(tmp_path):
    from diagnostics.render.charts.attach import build_breakdown_figure

    steps = [_step(n, {"forward": 3.0, "backward": 5.0, "host": 1.0}) for n in range(1, 9)]
    _write_run(tmp_path, steps, {"window": None}, AttachConfig(steps=2, at=20, stable_steps=4))
    fig = build_breakdown_figure(analyse_run(tmp_path, exit_code=0))
    lay = fig.layout
    # with one bar the plot is 60 px high: a legend in paper coordinates (y=-0.4) landed on the axis title
    assert lay.legend.yref == "container" and lay.legend.yanchor == "bottom" and lay.legend.y < 0.1
    assert lay.margin.b >= 80 and lay.height - lay.margin.t - lay.margin.b >= 50


def test_the_summary_names_only_the_steps_the_profiler_recorded_whole(tmp_path):
    from diagnostics.render.charts.attach import summary_lines

    whole = [_step(n, {"forward": 3.0, "host": 1.0}, profiled=n in (9, 10)) for n in range(1, 11)]
    _write_run(tmp_path / "whole", whole, {"window": [9, 10]}, AttachConfig(steps=2, at=9, stable_steps=4))
    assert "; profiled steps 9-10" in summary_lines(analyse_run(tmp_path / "whole", exit_code=0))[1]
    # the script died in the window's first step (an OOM at step 7): the window was planned, nothing recorded
    died = [_step(n, {"forward": 3.0, "host": 1.0}) for n in range(1, 7)]
    _write_run(tmp_path / "died", died, {"window": [7, 11]}, AttachConfig(steps=5, at=7, stable_steps=4))
    line = summary_lines(analyse_run(tmp_path / "died", exit_code=1))[1]
    assert "no whole step was profiled (the window began at step 7)" in line and "7-11" not in line


def test_a_raw_trace_is_gzipped_whole_into_its_name_and_only_a_regular_file_of_the_run_folder_is(tmp_path):
    """The launcher's side of the trace export (session.TraceGzip): the name a process' meta gives is gzipped
    beside the script, the bytes unchanged; a link, a FIFO or a path outside the folder is refused by name."""
    import gzip

    from diagnostics.attach.session import TraceGzip, gzip_trace

    data = json.dumps({"traceEvents": [{"name": f"aten::op{i}", "ts": i, "dur": 1} for i in range(40_000)]}).encode()
    (tmp_path / "trace.json").write_bytes(data)
    (tmp_path / "elsewhere.json").write_bytes(b"{}")
    for pid, exports in ((1, {"trace": "trace.json.gz", "trace_raw": "trace.json"}),
                         (2, {"trace": "x.json.gz", "trace_raw": "../elsewhere.json"})):  # not its raw name: ignored
        (tmp_path / f"proc-{pid}").mkdir()
        (tmp_path / f"proc-{pid}" / "meta.json").write_text(json.dumps({"exports": exports}))
    assert TraceGzip(tmp_path).finish() == []
    assert gzip.decompress((tmp_path / "trace.json.gz").read_bytes()) == data
    assert not (tmp_path / "trace.json").exists() and (tmp_path / "elsewhere.json").read_bytes() == b"{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere.json", "proc-1", "proc-2", "trace.json.gz"]

    os.symlink(tmp_path / "elsewhere.json", tmp_path / "rank0.pt.trace.json")
    from diagnostics.jobfiles import ArtifactError

    with pytest.raises(ArtifactError, match="rank0.pt.trace.json is a symbolic link"):
        gzip_trace(tmp_path, "rank0.pt.trace.json", "rank0.pt.trace.json.gz")
    os.mkfifo(tmp_path / "fifo.json")
    with pytest.raises(ArtifactError, match="fifo.json is a FIFO"):  # opened without waiting on it
        gzip_trace(tmp_path, "fifo.json", "fifo.json.gz")
    with pytest.raises(ValueError, match="'../elsewhere.json' is not a file name"):
        gzip_trace(tmp_path, "../elsewhere.json", "x.json.gz")
    assert not any(p.name.endswith(".gz") and p.name != "trace.json.gz" for p in tmp_path.iterdir())
    # one that fails is said in the run's notes (the raw trace kept, the analysis reads it)
    (tmp_path / "proc-3").mkdir()
    (tmp_path / "proc-3" / "meta.json").write_text(json.dumps({"exports": {"trace": "fifo.json.gz",
                                                                            "trace_raw": "fifo.json"}}))
    notes = TraceGzip(tmp_path).finish()
    assert len(notes) == 1 and "the trace fifo.json was not gzipped" in notes[0] and "is a FIFO" in notes[0]


def test_the_windows_profiler_is_torchs_own_code_without_its_inductor_import():
    """agent._profiler_class: a subclass of torch.profiler.profile whose prepare_trace is torch's own code
    object; it sees torch's _inductor only where the script imported it."""
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("_t_attach_agent_prof", ROOT / "diagnostics" / "attach" / "agent.py")
    agent = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(agent)
    cls = agent._profiler_class(torch)
    assert issubclass(cls, torch.profiler.profile) and cls is not torch.profiler.profile
    assert cls.prepare_trace.__code__ is torch.profiler.profile.prepare_trace.__code__
    view = cls.prepare_trace.__globals__["torch"]
    assert view.profiler is torch.profiler and view.nn is torch.nn
    if "torch._inductor" in sys.modules:  # imported here: torch's own answer
        assert view._inductor is sys.modules["torch._inductor"]
    else:  # asked, and still not imported
        assert not hasattr(view, "_inductor") and "torch._inductor" not in sys.modules


# ----------------------------------------------------------------------------- the launcher's own cost (issue 39)
@pytest.mark.parametrize("pidfd", [True, False])
def test_the_launcher_sees_the_scripts_end_at_once_and_its_code(monkeypatch, pidfd):
    """_ExitWatch: a pidfd where Linux has one (the end seen at once), Popen.wait(timeout) where not; None while
    the process runs, its return code once it has ended."""
    import time

    from diagnostics.attach import session

    if not pidfd:
        monkeypatch.delattr(os, "pidfd_open", raising=False)
    elif not hasattr(os, "pidfd_open"):
        pytest.skip("no os.pidfd_open here")
    p = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(0.6); sys.exit(7)"])
    with session._ExitWatch(p) as exited:
        assert exited(0.01) is None
        t = time.monotonic()
        while (rc := exited(10.0)) is None:
            pass
        seen = time.monotonic() - t
    assert rc == 7 and p.returncode == 7
    assert seen < 5.0  # not the 10 s timeout: the end ended the wait


def test_run_ends_without_the_interpreters_teardown_but_with_its_exit_handlers_and_output(tmp_path):
    """diagnostics.__main__.exit_now: atexit handlers run, stdout (a pipe, unflushed) arrives whole, the code is
    the one given; a non-daemon thread still running is waited for (Python's own exit)."""
    code = """
import atexit, sys, threading, time
from pathlib import Path
from diagnostics.__main__ import exit_now
atexit.register(lambda: Path(sys.argv[1], "atexit").write_text("ran"))
sys.stdout.write("x" * 100000)  # unflushed: a pipe's buffer
if sys.argv[2] == "thread":
    threading.Thread(target=lambda: (time.sleep(0.3), Path(sys.argv[1], "thread").write_text("done"))).start()
exit_now(5)
"""
    for how in ("plain", "thread"):
        d = tmp_path / how
        d.mkdir()
        p = subprocess.run([sys.executable, "-c", code, str(d), how], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert p.returncode == 5, p.stderr[-2000:]
        assert p.stdout == "x" * 100000
        assert (d / "atexit").read_text() == "ran"
        assert (d / "thread").exists() == (how == "thread")


def test_the_launchers_threads_beside_the_script_yield_to_it_alone():
    """The launcher's work beside the running script (imports, gzip, a trace's parse) runs at nice 10 in its
    own thread only: the launcher's main thread (and so the script it starts) keeps its priority."""
    import os
    import threading

    from diagnostics.attach import session

    main_before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    seen = {}

    def work():
        tid = threading.get_native_id()
        seen["before"] = os.getpriority(os.PRIO_PROCESS, tid)
        session.yield_to_the_script()
        seen["after"] = os.getpriority(os.PRIO_PROCESS, tid)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert seen["before"] == main_before
    assert seen["after"] == min(19, main_before + session.BESIDE_THE_SCRIPT_NICE)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == main_before


def test_kineto_starts_quiet_and_the_environment_is_the_scripts_again(monkeypatch):
    """The window's profiler start sets KINETO_LOG_LEVEL above Kineto's USDT level (its "USDT: profiler_start"
    lines are not added to the script's stderr) and removes it after; a level the user set is left alone."""
    from diagnostics.attach import agent

    monkeypatch.delenv("KINETO_LOG_LEVEL", raising=False)
    with agent._quiet_kineto():
        assert os.environ["KINETO_LOG_LEVEL"] == agent.KINETO_QUIET == "6"
    assert "KINETO_LOG_LEVEL" not in os.environ
    monkeypatch.setenv("KINETO_LOG_LEVEL", "1")
    with agent._quiet_kineto():
        assert os.environ["KINETO_LOG_LEVEL"] == "1"
    assert os.environ["KINETO_LOG_LEVEL"] == "1"


def test_an_attached_run_adds_no_kineto_line_to_the_scripts_stderr(tmp_path):
    from tests.attach.harness import run_attached, run_bare

    bare = run_bare(tmp_path, "passthrough.py", env={"EXIT_CODE": "0"}, stdin="x\n")
    # the window at steps 2-3 (not left to the warm-up's stability, which a loaded machine may not reach)
    ran = run_attached(tmp_path, "passthrough.py", env={"EXIT_CODE": "0"}, stdin="x\n",
                       options=("--at", "2", "--steps", "2"))
    assert ran.code == bare.code == 0 and ran.result["profiled_steps"]
    assert "USDT:" not in ran.stderr and "STAGE:" not in ran.stderr, ran.stderr[-1500:]
